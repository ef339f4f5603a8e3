"""Remove finished docker jobs: ``python -m torchx_elastic.schedulers.docker remove``.

``torchx cancel`` stops a running job's containers; they stay, as those of a finished job,
for ``torchx status`` and ``torchx log``. torchx's development line removes a job with
``torchx delete``; with torchx 0.7 (no ``delete``), this removes them:

    python -m torchx_elastic.schedulers.docker remove APP_ID [APP_ID ...]
    python -m torchx_elastic.schedulers.docker remove --finished
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, List, Optional, Sequence

from torchx.specs import is_terminal

from torchx_elastic.schedulers.docker.errors import DockerSchedulerError
from torchx_elastic.schedulers.docker.scheduler import DockerScheduler

if TYPE_CHECKING:
    from docker import DockerClient


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchx_elastic.schedulers.docker",
        description="remove docker jobs' containers and networks (stopping what still runs)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    remove = commands.add_parser("remove", help="remove jobs by app id, or every finished job")
    remove.add_argument("app_ids", nargs="*", metavar="APP_ID")
    remove.add_argument("--finished", action="store_true", help="every finished job")
    return parser


def main(argv: Optional[Sequence[str]] = None, client: Optional[DockerClient] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if bool(args.app_ids) == args.finished:
        parser.error("give either APP_IDs or --finished")
    scheduler = DockerScheduler("torchx", client=client)
    try:
        app_ids: List[str] = list(args.app_ids)
        if args.finished:
            app_ids = [app.app_id for app in scheduler.list() if is_terminal(app.state)]
        for app_id in app_ids:
            scheduler.delete(app_id)
            print(f"removed {app_id}")
    except DockerSchedulerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
