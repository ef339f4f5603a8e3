"""``python -m torchx_elastic.agent``: parse the flags, start the fork server, then import torch.

The fork server (see ``forkserver.py``) imports torch in its own process while this one
imports torch and rendezvouses: the two imports overlap instead of adding up.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    from torchx_elastic.agent.cli import build_parser
    from torchx_elastic.agent.forkserver import ForkServer

    args = build_parser().parse_args(argv)
    fork_server = None
    if args.start_method == "fork-server" and not args.no_python:
        fork_server = ForkServer()

    from torchx_elastic.agent.launcher import run

    run(args, fork_server)


if __name__ == "__main__":
    main()
