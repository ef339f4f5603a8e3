"""The log-heavy benchmark's job: every rank prints ``--lines`` numbered lines to stdout.

No process group: the benchmark measures the launcher's handling of output, not torch.
Each line is ``bench-line rank=<R> i=<I> <padding>`` with ``I`` counting from 0, so
``bench/logcheck.py`` can tell a missing, repeated or torn line from a complete log.
"""

import argparse
import os

PADDING = "x" * 48


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args()
    rank = os.environ["RANK"]
    for i in range(args.lines):
        print(f"bench-line rank={rank} i={i} {PADDING}")


if __name__ == "__main__":
    main()
