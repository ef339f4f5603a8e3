"""The agent's configuration: the command line parsed and checked once.

:func:`config_from_args` is the only reader of the ``argparse`` result (as torchrun's
``config_from_args`` -> ``LaunchConfig``); rendezvous, workers, console and supervision take
an :class:`AgentConfig`. Field names follow torch's ``LaunchConfig`` where they mean the same.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, auto
from functools import cached_property
from typing import Any

from torch.distributed.elastic.multiprocessing.api import Std

from torchx_elastic.agent.config import devices, rdzv_conf
from torchx_elastic.agent.config.defaults import DEFAULT_SIGNALS
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.rdzv_settings import RDZV_TIMEOUT_S, RendezvousSettings
from torchx_elastic.agent.console.output.display import DEFAULT_STATUS_INTERVAL_S, parse_rank_filter
from torchx_elastic.agent.console.output.sinks import DEFAULT_PREFIX, format_prefix
from torchx_elastic.contract import (
    PREFIX_TEMPLATE_ENV,
    RANK0_ENV,
    SHUTDOWN_TIMEOUT_ENV,
    SIGNALS_ENV,
)
from torchx_elastic.contract.agent_args import (
    DEFAULT_CONSOLE,
    DEFAULT_START_METHOD,
    ConsoleMode,
    parse_node_range,
)
from torchx_elastic.contract.job_secret import hide_from_workers, read_secret
from torchx_elastic.contract.not_retried import RETRY_ALL, NoRetryRule

log = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 29500
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# set on every replica by this package's torchx schedulers (torchx's ``rank0_env`` macro)
OMP_WARNING = (
    "\n*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be "
    "1 in default, to avoid your system being overloaded, "
    "please further tune the variable for optimal performance in "
    "your application as needed. \n"
    "*****************************************"
)


class UsageError(Exception):
    """Bad input on the agent's command line: exit 1 with the message (as torchrun's
    ``config_from_args`` errors; ``argparse``'s own errors exit 2)."""


@dataclass(frozen=True)
class NodeRange:
    min_nodes: int
    max_nodes: int

    @classmethod
    def parse(cls, text: str) -> NodeRange:
        return cls(*parse_node_range(text))

    def __str__(self) -> str:
        return (
            str(self.min_nodes)
            if self.min_nodes == self.max_nodes
            else f"{self.min_nodes}:{self.max_nodes}"
        )


@dataclass(frozen=True)
class WorkerCommand:
    """What every worker runs, in the words of the bootstrap that runs it first
    (``workers/bootstrap.py``): ``SCRIPT ARGS``, ``-m MODULE ARGS``, ``--exec PROGRAM ARGS``
    or ``--call CALL_FILE``, ``${local_rank}`` still to substitute; in the interpreter
    ``python_exec`` (torchrun's ``PYTHON_EXEC``) when one is given, else in the agent's."""

    target: tuple[str, ...]
    python_exec: str | None = None

    @property
    def entrypoint(self) -> str:
        """The program each worker process is: the Python interpreter."""
        return self.python_exec or sys.executable

    @property
    def runs_program(self) -> bool:
        """``--no-python``: the bootstrap executes a program (no Python code of the user)."""
        return self.target[:1] == ("--exec",)


@dataclass(frozen=True)
class ConsoleConfig:
    mode: ConsoleMode = DEFAULT_CONSOLE
    prefix_template: str = DEFAULT_PREFIX
    streams: Std | Mapping[int, Std] = Std.ALL
    """Console streams per local rank (``Std``): what --redirects does not take off it."""
    show_ranks: frozenset[int] | None = None
    show_local_ranks: frozenset[int] | None = None
    status_interval_s: float = DEFAULT_STATUS_INTERVAL_S
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentConfig:
    """One agent run, from the command line."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    run_id: str
    role: str
    rdzv_backend: str
    rdzv_endpoint: Endpoint
    rdzv_configs: dict[str, Any]
    worker: WorkerCommand
    max_restarts: int = 0
    no_retry: NoRetryRule = RETRY_ALL
    """The failures that end the job without a restart (``--no-retry-on``)."""
    health_check: str = ""  # a shell command run before each round (--health-check)
    spares: int = 0  # nodes standing by beyond max_nodes (--spares)
    monitor_interval_s: float = 0.1
    start_method: str = DEFAULT_START_METHOD
    local_addr: str | None = None
    master_addr: str | None = None
    """Set for static rendezvous only (torch: the workers' store is the agents')."""
    master_port: int | None = None
    log_dir: str | None = None
    logs_specs_name: str | None = None
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    exit_barrier_timeout_s: float = 30.0
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    hang_timeout_s: float = 0.0
    signals_to_handle: str | None = DEFAULT_SIGNALS  # None: torchrun has none
    virtual_local_rank: bool = False
    event_log_handler: str = "null"
    job_secret: bytes | None = field(default=None, repr=False)
    """What proves that a node belongs to the job (rendezvous/job_secret.py); never printed."""

    @property
    def nnodes(self) -> str:
        return str(NodeRange(self.min_nodes, self.max_nodes))

    @cached_property
    def rdzv(self) -> RendezvousSettings:
        """``rdzv_configs`` parsed once (config/rdzv_settings.py)."""
        return RendezvousSettings.parse(self.rdzv_configs)


def local_world_size(text: str) -> int:
    """``--nproc-per-node``: a number, or cpu, gpu, xpu, auto, a custom backend's name; devices
    counted in a short-lived child (config/devices.py), CPUs by affinity, as torchrun."""
    text = text.strip()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    if text == "cpu":
        return devices.cpu_count()
    try:
        count = None if text.isdigit() else devices.accelerator_count(text)
    except devices.CountError as err:
        raise UsageError(
            f"--nproc-per-node {text}: the devices could not be counted: {err}"
        ) from None
    if count is None:
        raise UsageError(
            f"--nproc-per-node {text!r} is not a whole number >= 1 (or auto, cpu, gpu);"
            " also accepted: xpu and a custom device backend's name"
        )
    if text == "auto":
        return count or devices.cpu_count()
    if count == 0:
        name = {"gpu": "Cuda", "xpu": "Xpu"}.get(text, text)
        raise UsageError(f"--nproc-per-node {text}: {name} is not available.")
    return count


def rdzv_configs(text: str, backend: str) -> dict[str, Any]:
    """``--rdzv-conf KEY=VALUE,...`` as torchrun takes it for ``backend`` (rdzv_conf.py); every
    bad value is one line of the :class:`UsageError`."""
    try:
        conf = rdzv_conf.parse(text)
        rdzv_conf.check(backend, conf)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return dict(conf)


def _int(flag: str, text: Any) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} {text!r} is not a whole number") from None


def worker_command(args: argparse.Namespace) -> WorkerCommand:
    """Every worker runs the bootstrap, which runs the script, module or program."""
    script_args = tuple(args.training_script_args)
    if args.run_path:
        target: tuple[str, ...] = (args.training_script,)
    elif args.no_python and args.module:
        raise UsageError("--no-python and -m cannot be used together")
    elif args.no_python:
        target = ("--exec", args.training_script)
    elif args.module:
        target = ("-m", args.training_script)
    else:
        target = (args.training_script,)
    python_exec = os.environ.get("PYTHON_EXEC")  # torchrun's: another interpreter
    return WorkerCommand((*target, *script_args), python_exec)


def _std(flag: str, text: str) -> Std | dict[int, Std]:
    try:
        return Std.from_str(text)
    except ValueError:
        raise UsageError(
            f"{flag} {text!r} is not 0-3 or LOCAL_RANK:0-3,... (e.g. 3 or 0:1,1:2)"
        ) from None


def console_streams(redirects: str, tee: str, nproc: int) -> Std | dict[int, Std]:
    """Streams the console shows per local rank: not redirected, or redirected and teed."""
    off, back = _std("--redirects", redirects), _std("--tee", tee)
    if isinstance(off, Std) and isinstance(back, Std):
        return Std(Std.ALL.value & ~off.value | back.value)

    def at(value: Std | dict[int, Std], rank: int) -> int:
        return (value if isinstance(value, Std) else value.get(rank, Std.NONE)).value

    return {rank: Std(Std.ALL.value & ~at(off, rank) | at(back, rank)) for rank in range(nproc)}


def prefix_template(flag_value: str | None) -> str:
    """The flag, else ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (as torchrun), else ours; in
    either syntax (see :func:`~torchx_elastic.agent.console.output.sinks.format_prefix`)."""
    if flag_value:
        template = flag_value
    elif os.environ.get(PREFIX_TEMPLATE_ENV):
        template = os.environ[PREFIX_TEMPLATE_ENV]
    else:
        template = DEFAULT_PREFIX
    try:
        format_prefix(template, node=0, rank=0, local_rank=0)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return template


def _local_ranks(text: str) -> frozenset[int] | None:
    if not text:
        return None
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(
            f"--local_ranks_filter {text!r}: must be a comma-separated list of integers e.g."
            " --local_ranks_filter=0,1,2"
        ) from None
    return ranks


class PortRule(Enum):
    """A rule of the rendezvous endpoint's port; each front-end says it in its own names (the
    agent's flags, ``LaunchConfig``'s fields)."""

    FREE_PORT_ONE_NODE = auto()  # port 0 (a free port) only works for a single node
    STATIC_FIXED_PORT = auto()  # static: the workers' store is the agents', on a fixed port


def broken_port_rule(endpoint: Endpoint, backend: str, max_nodes: int) -> PortRule | None:
    """The rule ``endpoint`` breaks for ``backend`` and up to ``max_nodes`` nodes, if any."""
    if endpoint.port != 0:
        return None
    if max_nodes > 1:
        return PortRule.FREE_PORT_ONE_NODE
    if backend == "static":
        return PortRule.STATIC_FIXED_PORT
    return None


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the nodes meet, from the ``--rdzv-*`` and ``--master-*`` flags."""

    backend: str
    endpoint: Endpoint
    run_id: str
    configs: dict[str, Any]
    master_addr: str | None = None
    """Static rendezvous only (torch: the workers' store is the agents'), as the port."""
    master_port: int | None = None


def _rendezvous(args: argparse.Namespace, nodes: NodeRange) -> Rendezvous:
    """Backend, endpoint, run id, configs and (static only) the master address and port."""
    backend, endpoint_text, run_id = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id
    if args.standalone or (
        backend == "static"
        and not endpoint_text
        and args.master_port is None
        and nodes.max_nodes == 1  # torchrun: one node needs no fixed port
    ):
        backend, endpoint_text, run_id = "c10d", "localhost:0", str(uuid.uuid4())
    conf = rdzv_configs(args.rdzv_conf, backend)
    master_port = DEFAULT_MASTER_PORT if args.master_port is None else args.master_port
    if backend == "static" and not endpoint_text:
        host = args.master_addr
        endpoint_text = (
            f"{host}:{master_port}"
            if host.startswith("[") or ":" not in host
            else f"[{host}]:{master_port}"
        )
    try:
        endpoint = Endpoint.parse(endpoint_text)
    except ValueError as err:
        raise UsageError(str(err)) from None
    rule = broken_port_rule(endpoint, backend, nodes.max_nodes)
    if rule is PortRule.FREE_PORT_ONE_NODE:
        raise UsageError(
            f"--rdzv-endpoint {args.rdzv_endpoint!r}: port 0 (a free port) only works for a"
            f" single node, but --nnodes is {args.nnodes!r}; give the rank-0 node's port"
        )
    if rule is PortRule.STATIC_FIXED_PORT:
        raise UsageError(
            f"--rdzv-backend static needs a fixed port (the workers' store is the agents'),"
            f" not {endpoint}; give --master-port or --rdzv-endpoint HOST:PORT"
        )
    if backend != "static":
        if args.node_rank != 0:
            log.warning(
                "node_rank is only used for static rdzv_backend. It will be ignored for"
                " rdzv_backend=%s.",
                backend,
            )
        return Rendezvous(backend, endpoint, run_id, conf)
    conf["rank"] = _static_node_rank(args, conf, nodes)
    return Rendezvous(backend, endpoint, run_id, conf, endpoint.host, endpoint.port)


def _static_node_rank(args: argparse.Namespace, conf: dict[str, Any], nodes: NodeRange) -> int:
    """``--node-rank`` (dist.ddp and old scripts: ``--rdzv-conf rank=N``), checked."""
    node_rank: int = args.node_rank
    if "rank" in conf and node_rank == 0:
        node_rank = _int("--rdzv-conf rank", conf["rank"])
    if not 0 <= node_rank < nodes.max_nodes:
        raise UsageError(
            f"--node-rank {node_rank} is not in 0..{nodes.max_nodes - 1} (--nnodes {args.nnodes!r})"
        )
    return node_rank


def shutdown_timeout_s(given: float | None) -> float:
    """The seconds workers get between SIGTERM and SIGKILL: ``given``, else
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 (torch's)."""
    if given is not None:
        return float(given)
    return float(os.environ.get(SHUTDOWN_TIMEOUT_ENV, DEFAULT_SHUTDOWN_TIMEOUT_S))


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """The whole configuration, checked; bad input is a :class:`UsageError`."""
    try:
        nodes = NodeRange.parse(args.nnodes)
    except ValueError as err:
        raise UsageError(f"--nnodes {err}") from None
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts {args.max_restarts} is negative; give 0 or more")
    if args.spares < 0:
        raise UsageError(f"--spares {args.spares} is negative; give 0 or more")
    try:
        no_retry = NoRetryRule.parse(args.no_retry_on)
    except ValueError as err:
        raise UsageError(f"--no-retry-on {args.no_retry_on!r}: {err}") from None
    rdzv = _rendezvous(args, nodes)
    rdzv.configs.setdefault("timeout", RDZV_TIMEOUT_S)  # torch's LaunchConfig adds it (torchrun)
    worker = worker_command(args)
    nproc = local_world_size(str(args.nproc_per_node))
    if args.numa_binding is not None:
        raise UsageError(
            f"--numa-binding {args.numa_binding}: NUMA binding is not supported by this agent"
            " (it binds workers to the CPUs of their GPU); leave the flag out"
        )
    try:
        show_ranks = parse_rank_filter(args.console_ranks)
    except ValueError as err:
        raise UsageError(str(err)) from None
    timeout_s = _shutdown_timeout_flag(args)
    console = _console_config(args, nproc, show_ranks)
    return AgentConfig(
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        nproc_per_node=nproc,
        run_id=rdzv.run_id,
        role=args.role,
        rdzv_backend=rdzv.backend,
        rdzv_endpoint=rdzv.endpoint,
        rdzv_configs=rdzv.configs,
        worker=worker,
        max_restarts=args.max_restarts,
        no_retry=no_retry,
        health_check=args.health_check,
        spares=args.spares,
        monitor_interval_s=args.monitor_interval,
        start_method=args.start_method,
        local_addr=args.local_addr,
        master_addr=rdzv.master_addr,
        master_port=rdzv.master_port,
        log_dir=args.log_dir,
        logs_specs_name=args.logs_specs,
        console=console,
        exit_barrier_timeout_s=args.exit_barrier_timeout,
        shutdown_timeout_s=timeout_s,
        hang_timeout_s=args.hang_timeout_s,
        signals_to_handle=args.signals_to_handle,
        virtual_local_rank=args.virtual_local_rank,
        event_log_handler=args.event_log_handler,
        job_secret=_secret(),
    )


def _shutdown_timeout_flag(args: argparse.Namespace) -> float:
    """``--shutdown-timeout``, else ``--term-timeout-s``, else as :func:`shutdown_timeout_s`."""
    given = args.shutdown_timeout
    timeout_s = shutdown_timeout_s(args.term_timeout_s if given is None else given)
    if timeout_s < 0:
        raise UsageError(f"--shutdown-timeout {timeout_s:g} is negative")
    return timeout_s


def _console_config(
    args: argparse.Namespace, nproc: int, show_ranks: frozenset[int] | None
) -> ConsoleConfig:
    return ConsoleConfig(
        mode=args.console,
        prefix_template=prefix_template(args.log_line_prefix_template),
        streams=console_streams(str(args.redirects), str(args.tee), nproc),
        show_ranks=show_ranks,
        show_local_ranks=_local_ranks(args.local_ranks_filter),
        status_interval_s=args.status_interval_s,
        duplicate_stdout_filters=tuple(f for f in args.duplicate_stdout_filters if f),
        duplicate_stderr_filters=tuple(f for f in args.duplicate_stderr_filters if f),
    )


def _secret() -> bytes | None:
    try:
        return read_secret()
    except ValueError as err:
        raise UsageError(str(err)) from None


def apply_process_environment(config: AgentConfig, warn: Any = None) -> str | None:
    """What torchrun sets in its own environment for the workers to inherit.

    torchrun warns about ``OMP_NUM_THREADS`` on every node; under ``torchx run`` (every
    replica has ``TORCHX_RANK0_HOST``) the warning is returned instead, for node 0 alone to
    print once the first rendezvous round told it its rank: once per job.
    """
    deferred = None
    if "OMP_NUM_THREADS" not in os.environ and config.nproc_per_node > 1:
        if RANK0_ENV in os.environ:
            deferred = OMP_WARNING
        else:
            (warn or log.warning)(OMP_WARNING)
        os.environ["OMP_NUM_THREADS"] = "1"
    if config.signals_to_handle is not None:
        os.environ[SIGNALS_ENV] = config.signals_to_handle
    hide_from_workers()
    return deferred
