"""``python -m torchx_elastic.agent``: parse the flags into the config, import torch once,
fork the fork server, run.

The fork server (see ``workers/forkserver.py``) is forked from the agent right after the
agent imported torch and before it starts any thread: workers then start without importing
torch again. The agent never asks CUDA anything before that fork (``--nproc-per-node gpu``
counts in a child); where something else did, workers start by spawn (``workers/cuda_fork.py``).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where they are needed: the stop-signal handlers come first
    from torchx_elastic.agent.config.launch import AgentConfig
    from torchx_elastic.agent.workers.forkserver import ForkServer


def main(argv: list[str] | None = None) -> None:
    from torchx_elastic.agent.supervision.stop_signals import exit_on_stop_signals

    # a pod removed while the agent starts (importing torch takes seconds) exits in one line
    exit_on_stop_signals()
    from torchx_elastic.agent.config.cli import build_parser
    from torchx_elastic.agent.console.output.agent_line import label_log_records
    from torchx_elastic.agent.console.output.ordered_copy import copy_console_in_order
    from torchx_elastic.agent.workers.bootstrap import die_with_parent
    from torchx_elastic.contract import LAUNCHER_PID_ENV
    from torchx_elastic.contract.env_file import load_env_file
    from torchx_elastic.contract.error_exit import exit_with_error

    # set by local_cwd: when the torchx process that started this agent dies (even by
    # SIGKILL), the agent gets SIGTERM and stops its workers instead of running on
    die_with_parent(LAUNCHER_PID_ENV, signal.SIGTERM)
    console_copy = copy_console_in_order()  # before logging's handler takes sys.stderr
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING").upper())
    label_log_records()
    load_env_file()  # before the flags: their PET_* defaults may come from it
    try:
        args = build_parser().parse_args(argv)
    except ValueError as err:  # a PET_* switch that is not 0 or 1 (torchrun: exit 1)
        exit_with_error(err)

    from torchx_elastic.agent.config.launch import UsageError, config_from_args
    from torchx_elastic.agent.supervision.launcher import run

    try:
        config = config_from_args(args)
    except UsageError as err:  # torchrun's config_from_args errors exit 1 too
        exit_with_error(err)
    fork_server = fork_server_for(config, console_copy)
    from torchx_elastic.agent import compat

    compat.quiet_cpp_warnings()  # the agent's own process only: its workers are forked
    label_log_records("torch")  # imported by now: its handlers are there
    run(config, fork_server)


def fork_server_for(config: AgentConfig, console_copy: int | None) -> ForkServer | None:
    """The fork server the workers start from (``--start-method fork-server``); None where
    they cannot be forked: another interpreter (``PYTHON_EXEC``), ``--no-python``, or a
    state that forking would copy into them (said: they start by spawn)."""
    from torchx_elastic.agent.console.output.agent_line import say
    from torchx_elastic.agent.workers.cuda_fork import fork_hazard
    from torchx_elastic.agent.workers.forkserver import ForkServer, share_with_forks
    from torchx_elastic.agent.workers.preload import needs_compiler
    from torchx_elastic.contract.agent_args import FORK_SERVER

    if config.start_method != FORK_SERVER:
        return None
    if config.worker.python_exec is not None or config.worker.runs_program:
        return None  # another interpreter (PYTHON_EXEC) or --no-python: nothing to fork from
    if hazard := fork_hazard():  # never a worker forked in a bad state: spawn, saying so
        say(f"torchx-elastic: starting workers by spawn: {hazard}")
        return None
    try:
        share_with_forks()  # the agent's torch is the fork server's and workers'
        return ForkServer(
            compiler=needs_compiler(config.worker.target),
            keep_fds=() if console_copy is None else (console_copy,),
        )
    except RuntimeError as err:  # a thread exists already: forking is not safe
        say(f"torchx-elastic: starting workers by spawn: {err}")
        return None


if __name__ == "__main__":
    main()
