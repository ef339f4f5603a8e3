"""Run the agent in this process for a torch ``LaunchConfig``: the one seam to the agent.

Maps torch's ``LaunchConfig`` (plus :class:`AgentOptions`) onto the agent's configuration
and runs the same supervision as ``python -m torchx_elastic.agent``: rendezvous, workers
with prefixed output, progress, hang watchdog, restarts, root-cause report. What comes back
is the exit code and the run's JSON summary (``summary_node<N>.json``: attempt, root cause).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from torch.distributed.launcher.api import LaunchConfig

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.function.options import AgentOptions
from torchx_elastic.agent.workers.forkserver import ForkServer


@dataclass(frozen=True)
class WorkerTarget:
    """What each worker runs, in the agent's command-line terms."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    summary: dict[str, Any]


def _rdzv_conf(configs: dict[str, Any]) -> str:
    for key, value in configs.items():
        if "," in str(value) or "=" in str(key):
            raise ValueError(
                f"rdzv_configs[{key!r}] = {value!r}: keys without '=' and values without ','"
                " are accepted"
            )
    return ",".join(f"{key}={value}" for key, value in configs.items())


def agent_args(
    config: LaunchConfig, options: AgentOptions, target: WorkerTarget, log_dir: str
) -> argparse.Namespace:
    """The agent's flags for this launch (what ``python -m torchx_elastic.agent`` parses)."""
    args = build_parser().parse_args(["SCRIPT"])
    args.training_script = target.script
    args.training_script_args = list(target.args)
    args.module = target.module
    args.no_python = target.no_python
    args.nnodes = f"{config.min_nodes}:{config.max_nodes}"
    args.nproc_per_node = str(config.nproc_per_node)
    args.rdzv_backend = config.rdzv_backend
    args.rdzv_endpoint = config.rdzv_endpoint
    args.rdzv_id = config.run_id or str(uuid.uuid4().int)
    args.rdzv_conf = _rdzv_conf(config.rdzv_configs)
    args.standalone = False
    args.max_restarts = config.max_restarts
    args.monitor_interval = config.monitor_interval
    args.role = config.role
    args.log_dir = log_dir
    if config.log_line_prefix_template:
        args.log_line_prefix_template = config.log_line_prefix_template
    if config.shutdown_timeout is not None:
        args.term_timeout_s = float(config.shutdown_timeout)
    args.console = options.console
    args.console_ranks = options.console_ranks
    args.status_interval_s = options.status_interval_s
    args.hang_timeout_s = options.hang_timeout_s
    args.exit_barrier_timeout = options.exit_barrier_timeout_s
    args.tee = options.tee
    return args


def read_summary(log_dir: str) -> dict[str, Any]:
    """This run's summary (the newest, should a node's log directory hold several)."""
    paths = sorted(glob.glob(os.path.join(log_dir, "summary_node*.json")), key=os.path.getmtime)
    if not paths:
        return {}
    with open(paths[-1]) as file:
        data: dict[str, Any] = json.load(file)
    return data


def run_agent(
    config: LaunchConfig,
    options: AgentOptions,
    target: WorkerTarget,
    log_dir: str,
    fork_server: ForkServer | None,
) -> Outcome:
    """Run the agent to the end; ``ValueError`` for a bad configuration, torch's
    ``SignalException`` when a signal stopped it, ``RendezvousFailure`` as the command line."""
    from torchx_elastic.agent.supervision.launcher import UsageError, launch

    args = agent_args(config, options, target, log_dir)
    try:
        code = launch(args, fork_server)
    except UsageError as err:
        raise ValueError(str(err)) from None
    return Outcome(code, read_summary(log_dir))
