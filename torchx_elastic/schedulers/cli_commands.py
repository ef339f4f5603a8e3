"""torchx's ``run``, ``status``, ``describe``, ``log``, ``cancel`` and ``list``, with the errors
a user causes through this package's schedulers printed as torchx prints its own.

torchx's CLI prints a traceback for any exception a scheduler raises; it catches only its own
(an unknown component, a missing run option), logs one ERROR line and exits 1. These commands
are torchx's, registered under the same names (torchx's ``torchx.cli.cmds`` entry points
replace a built-in command of that name), and do the same for :class:`UserError`: no cluster
or kubeconfig, a namespace that does not exist, a workspace without ``image_repo``, an image
that cannot be pulled, a run option value of the wrong type or out of range; and for a
component argument that cannot make a job (:class:`ComponentArgumentError`: ``-j 2x``,
``--cpu -1``, ``--console`` or ``--start_method`` misspelled, ``ft.ddp``'s bad combinations).
``torchx run`` stopped by SIGINT or SIGTERM says so in one line too, and whether the job goes on.

``torchx run`` without ``-s`` runs on ``local_cwd`` unless a ``.torchxconfig`` names another
scheduler: torchx 0.7 would take the first scheduler entry point, written sorted by name
(``aws_batch``, which fails for want of a ``queue``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from torchx.cli.cmd_base import SubCommand
from torchx.cli.cmd_cancel import CmdCancel
from torchx.cli.cmd_describe import CmdDescribe
from torchx.cli.cmd_list import CmdList
from torchx.cli.cmd_log import CmdLog
from torchx.cli.cmd_run import CmdRun
from torchx.cli.cmd_status import CmdStatus
from torchx.runner import config, get_runner
from torchx.schedulers.local_scheduler import SignalException
from torchx.specs.builders import make_app_handle

from torchx_elastic.components.errors import ComponentArgumentError
from torchx_elastic.schedulers.errors import UserError

logger = logging.getLogger(__name__)

# torchx's exit code for a command that failed (cmd_run, cmd_status, cmd_log: sys.exit(1))
EXIT_FAILURE = 1
# whose `log` of a job that does not exist says so instead of waiting for it to start
SCHEDULERS = ("kubernetes", "docker")
# `torchx run`'s scheduler when neither -s nor a .torchxconfig names one
DEFAULT_SCHEDULER = "local_cwd"


MAPPING_ITEMS = "a mapping option takes KEY:VALUE items: KEY1:v1,KEY2:v2"


class RunOptionValueError(UserError):
    def __init__(self, scheduler: str, cfg: str, detail: str) -> None:
        super().__init__(
            f"-cfg {cfg}: a {scheduler} run option has a value of the wrong type ({detail});"
            f" `torchx runopts {scheduler}` lists the options with their types and defaults"
        )


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except (UserError, ComponentArgumentError) as err:
        logger.error("%s", err)
        sys.exit(EXIT_FAILURE)


@contextmanager
def stopped_by_signal() -> Iterator[None]:
    """torchx's local schedulers turn SIGINT and SIGTERM into a ``SignalException`` that ends
    in a traceback; by the time it leaves ``torchx run`` the runner has stopped the job's
    processes. Elsewhere (``--wait`` or ``--log`` on docker, kubernetes, slurm) Ctrl-C stops
    torchx alone, with a ``KeyboardInterrupt`` traceback, and the job goes on. Say which in one
    line and exit as the signal would (128 + its number)."""
    try:
        yield
    except SignalException as err:
        name = signal.Signals(err.sigval).name
        logger.error(
            f"stopped by {name}: the job's processes were stopped (its logs are kept in the"
            " directory printed at its start)"
        )
        sys.exit(128 + int(err.sigval))
    except KeyboardInterrupt:  # Ctrl-C where no local scheduler turned it into the above
        logger.error(
            "interrupted: torchx stopped here, a job it submitted keeps running; `torchx"
            " cancel` with the handle printed above stops it"
        )
        sys.exit(128 + signal.SIGINT)


class UserErrorsAsLines(SubCommand):
    """A torchx command (the next base) whose user errors are one line (:func:`user_errors`)."""

    def run(self, args: argparse.Namespace) -> None:
        with user_errors():
            super().run(args)


class Run(CmdRun):
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        super().add_arguments(subparser)
        default_to_local_cwd(subparser)

    def run(self, args: argparse.Namespace) -> None:
        with user_errors(), stopped_by_signal():
            check_option_types(args.scheduler, getattr(args, "scheduler_args", ""))
            super().run(args)


def configured_scheduler() -> str | None:
    """The scheduler a ``.torchxconfig`` names for ``torchx run`` (``[cli:run] scheduler``), as
    torchx finds the file (``$TORCHXCONFIG``, else ``~`` and the working directory)."""
    return config.get_configs(prefix="cli", name="run").get("scheduler") or None


def default_to_local_cwd(subparser: argparse.ArgumentParser) -> None:
    """``-s`` defaults to :data:`DEFAULT_SCHEDULER` where no ``.torchxconfig`` names one."""
    if configured_scheduler() is None:
        subparser.set_defaults(scheduler=DEFAULT_SCHEDULER)  # over the argument's own default


def check_option_types(scheduler: str, cfg: str) -> None:
    """torchx parses ``-cfg`` values with the options' types and raises a bare ValueError
    (``invalid literal for int()``) for one it cannot convert."""
    if not cfg:
        return
    with get_runner() as runner:
        try:
            options = runner.scheduler_run_opts(scheduler)
        except (KeyError, ValueError):
            return  # an unknown scheduler: torchx says so itself
        try:
            options.cfg_from_str(cfg)
        except ValueError as err:
            raise RunOptionValueError(scheduler, cfg, str(err)) from None
        except IndexError:  # torchx splits each item of a mapping option at its first ':'
            raise RunOptionValueError(scheduler, cfg, MAPPING_ITEMS) from None


class Status(UserErrorsAsLines, CmdStatus):
    pass


class Describe(UserErrorsAsLines, CmdDescribe):
    pass


class Log(CmdLog):
    def run(self, args: argparse.Namespace) -> None:
        with user_errors():
            exit_if_missing(args.identifier)
            super().run(args)


def exit_if_missing(identifier: str) -> None:
    """torchx's ``log`` of a whole app waits for it to start, forever for one that does not
    exist (any more): say so as ``torchx status`` does."""
    scheduler, _, path = identifier.partition("://")
    parts = path.split("/")
    if scheduler not in SCHEDULERS or len(parts) < 2:
        return  # torchx checks the form of the identifier itself
    with get_runner() as runner:
        if runner.status(make_app_handle(scheduler, parts[0], parts[1])) is None:
            logger.error(
                f"AppDef: {parts[1]}, does not exist or has been removed from"
                f" {scheduler}'s data plane"
            )
            sys.exit(EXIT_FAILURE)


class Cancel(UserErrorsAsLines, CmdCancel):
    pass


class List(UserErrorsAsLines, CmdList):
    pass
