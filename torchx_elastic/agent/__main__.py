"""``python -m torchx_elastic.agent``: parse the flags, import torch once, fork the fork server.

The fork server (see ``forkserver.py``) is forked from the agent right after the agent
imported torch and before it starts any thread: workers then start without importing
torch again.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> None:
    from torchx_elastic.agent.config.cli import build_parser
    from torchx_elastic.agent.workers.bootstrap import LAUNCHER_PID_ENV, die_with_parent

    # set by local_cwd: when the torchx process that started this agent dies (even by
    # SIGKILL), the agent gets SIGTERM and stops its workers instead of running on
    die_with_parent(LAUNCHER_PID_ENV, signal.SIGTERM)

    args = build_parser().parse_args(argv)

    from torchx_elastic.agent.supervision.launcher import run
    from torchx_elastic.agent.workers.forkserver import ForkServer

    fork_server = None
    if args.start_method == "fork-server" and not args.no_python:
        try:
            fork_server = ForkServer()
        except RuntimeError as err:  # a thread exists already: forking is not safe
            print(f"torchx-elastic: starting workers by spawn: {err}", file=sys.stderr)
    run(args, fork_server)


if __name__ == "__main__":
    main()
