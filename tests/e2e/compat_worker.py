"""The worker of the torchrun compatibility tests: records what its launcher gave it.

Standard library only, no torch, so a worker starts in a fraction of a second. It writes
``$COMPAT_DUMP_DIR/rank<RANK>-attempt<TORCHELASTIC_RESTART_COUNT>.json`` holding its whole
environment, ``sys.argv``, working directory, interpreter and whether stdout writes through
(``python -u``), prints one marker line to stdout and one to stderr, then:

- ``COMPAT_FAIL_LOCAL_RANK=R`` and ``COMPAT_FAIL_ATTEMPTS=K``: local rank R of every node
  exits 3 in attempts 0..K-1, once every rank of its attempt has written its record (so no
  record is lost to the race between a failing rank and its peers being stopped).

It runs as a script, as ``-m compat_worker``, through ``--run-path`` (``runpy``) and from the
shell wrapper ``compat_worker.sh`` (``--no-python``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

WAIT_FOR_PEERS_S = 120.0


def _record(dump_dir: Path, rank: str, attempt: str) -> None:
    record = {
        "env": dict(os.environ),
        "argv": list(sys.argv),
        "file": __file__,  # what tracebacks name: the absolute path, as ``python script.py``
        "cwd": os.getcwd(),
        "executable": sys.executable,
        "stdout_write_through": sys.stdout.write_through,
    }
    final = dump_dir / f"rank{rank}-attempt{attempt}.json"
    partial = final.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True))
    partial.rename(final)


def _wait_for_attempt(dump_dir: Path, attempt: str, world_size: int) -> None:
    deadline = time.monotonic() + WAIT_FOR_PEERS_S
    while time.monotonic() < deadline:
        if len(list(dump_dir.glob(f"rank*-attempt{attempt}.json"))) >= world_size:
            return
        time.sleep(0.05)


def main() -> int:
    rank = os.environ.get("RANK", "unset")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "unset")
    dump_dir = Path(os.environ["COMPAT_DUMP_DIR"])
    _record(dump_dir, rank, attempt)
    print(f"compat-stdout rank={rank} attempt={attempt}", flush=True)
    print(f"compat-stderr rank={rank} attempt={attempt}", file=sys.stderr, flush=True)
    failing_rank = os.environ.get("COMPAT_FAIL_LOCAL_RANK")
    failing_attempts = int(os.environ.get("COMPAT_FAIL_ATTEMPTS", "0"))
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank == failing_rank and attempt.isdigit() and int(attempt) < failing_attempts:
        _wait_for_attempt(dump_dir, attempt, int(os.environ.get("WORLD_SIZE", "1")))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
