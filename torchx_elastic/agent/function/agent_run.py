"""Run the agent in this process for a torch ``LaunchConfig``: the one seam to the agent.

Maps torch's ``LaunchConfig`` (plus :class:`AgentOptions`) onto the agent's
:class:`AgentConfig` and runs the same supervision as ``python -m torchx_elastic.agent``:
rendezvous, workers with prefixed output, progress, hang watchdog, restarts, root-cause
report. What comes back is the exit code and the run's JSON summary
(``summary_node<N>.json``: the last attempt, the root cause).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.multiprocessing.api import Std
from torch.distributed.launcher.api import LaunchConfig

from torchx_elastic.agent.compat import launch_config_value as field
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import (
    AgentConfig,
    ConsoleConfig,
    PortRule,
    UsageError,
    WorkerCommand,
    broken_port_rule,
    prefix_template,
    shutdown_timeout_s,
)
from torchx_elastic.agent.console.output.display import parse_rank_filter
from torchx_elastic.agent.function.options import AgentOptions
from torchx_elastic.agent.workers.forkserver import ForkServer
from torchx_elastic.contract import SIGNALS_ENV
from torchx_elastic.contract.agent_args import ConsoleMode
from torchx_elastic.contract.events import read_summary
from torchx_elastic.contract.job_secret import read_secret


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    summary: dict[str, Any]


def _static_master(
    backend: str, endpoint: Endpoint, configs: dict[str, Any]
) -> tuple[str | None, int | None]:
    """torch's launcher: with the static backend the workers' master is the endpoint."""
    if backend != "static":
        return None, None
    if "rank" not in configs:
        raise ValueError("rdzv_backend 'static' needs this node's rank in rdzv_configs['rank']")
    return endpoint.host, endpoint.port


def _check_port(config: LaunchConfig, endpoint: Endpoint) -> None:
    """The endpoint's port rules (``config/launch.py``), in ``LaunchConfig``'s names."""
    rule = broken_port_rule(endpoint, config.rdzv_backend, config.max_nodes)
    if rule is PortRule.FREE_PORT_ONE_NODE:
        raise ValueError(
            f"rdzv_endpoint {config.rdzv_endpoint!r}: port 0 (a free port) only works for a"
            f" single node, but max_nodes is {config.max_nodes}; give the rank-0 node's port"
        )
    if rule is PortRule.STATIC_FIXED_PORT:
        raise ValueError(f"rdzv_endpoint {str(endpoint)!r}: the static backend needs a fixed port")


def agent_config(
    config: LaunchConfig,
    options: AgentOptions,
    worker: WorkerCommand,
    log_dir: str,
    run_id: str,
) -> AgentConfig:
    """The agent's configuration for this launch (``ValueError`` on bad input)."""
    try:
        endpoint = Endpoint.parse(config.rdzv_endpoint)
    except ValueError as err:
        raise ValueError(
            f"{err} (LaunchConfig.rdzv_endpoint; for one node: rdzv_backend='c10d',"
            " rdzv_endpoint='localhost:0')"
        ) from None
    _check_port(config, endpoint)
    if config.nproc_per_node < 1 or config.max_restarts < 0:
        raise ValueError(
            f"nproc_per_node={config.nproc_per_node}, max_restarts={config.max_restarts}:"
            " nproc_per_node must be >= 1 and max_restarts >= 0"
        )
    master_addr, master_port = _static_master(config.rdzv_backend, endpoint, config.rdzv_configs)
    console = _console_config(config, options)
    return AgentConfig(
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        nproc_per_node=config.nproc_per_node,
        run_id=run_id,
        role=config.role,
        rdzv_backend=config.rdzv_backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=dict(config.rdzv_configs),
        worker=worker,
        max_restarts=config.max_restarts,
        monitor_interval_s=config.monitor_interval,
        start_method=config.start_method,
        local_addr=config.local_addr,
        master_addr=master_addr,
        master_port=master_port,
        log_dir=log_dir,
        console=console,
        exit_barrier_timeout_s=options.exit_barrier_timeout_s,
        shutdown_timeout_s=shutdown_timeout_s(field(config, "shutdown_timeout")),
        hang_timeout_s=options.hang_timeout_s,
        signals_to_handle=field(config, "signals_to_handle"),
        virtual_local_rank=field(config, "virtual_local_rank"),
        event_log_handler=field(config, "event_log_handler"),
        job_secret=read_secret(),
    )


def _console_config(config: LaunchConfig, options: AgentOptions) -> ConsoleConfig:
    try:
        template = prefix_template(config.log_line_prefix_template)
        show_ranks = parse_rank_filter(options.console_ranks)
    except (UsageError, ValueError) as err:
        raise ValueError(str(err)) from None
    mode: ConsoleMode = options.console  # type: ignore[assignment]  # checked by AgentOptions
    return ConsoleConfig(
        mode=mode,
        prefix_template=template,
        streams=Std(options.tee),
        show_ranks=show_ranks,
        status_interval_s=options.status_interval_s,
        duplicate_stdout_filters=tuple(field(config, "duplicate_stdout_filters") or ()),
        duplicate_stderr_filters=tuple(field(config, "duplicate_stderr_filters") or ()),
    )


def run_agent(agent: AgentConfig, fork_server: ForkServer | None) -> Outcome:
    """Run the agent to the end; ``ValueError`` for a bad configuration; a
    ``RendezvousFailure`` as on the command line."""
    from torchx_elastic.agent.supervision.launcher import launch

    # torch's launch_agent sets it too: the signals the agent turns into a stop
    if agent.signals_to_handle is not None:
        os.environ[SIGNALS_ENV] = agent.signals_to_handle
    try:
        code = launch(agent, fork_server)
    except UsageError as err:
        raise ValueError(str(err)) from None
    assert agent.log_dir is not None
    return Outcome(code, read_summary(agent.log_dir))
