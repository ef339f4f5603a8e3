"""Glue: command line -> rendezvous handler, worker spec, agent run, exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousParameters

from torchx_elastic.agent.config.cli import NodeRange
from torchx_elastic.agent.console.display import parse_rank_filter
from torchx_elastic.agent.console.output import format_prefix
from torchx_elastic.agent.console.session import ConsoleSession
from torchx_elastic.agent.rendezvous.handler import (
    RendezvousFailure,
    create_handler,
    describe_error,
    endpoint_of,
    lost_nodes,
    rendezvous_parameters,
    use_fresh_store_per_attempt,
)
from torchx_elastic.agent.supervision.elastic_agent import ElasticAgent, Supervision
from torchx_elastic.agent.supervision.watchdog import HangWatchdog
from torchx_elastic.agent.workers import bootstrap
from torchx_elastic.agent.workers.forkserver import ForkServer
from torchx_elastic.agent.workers.janitor import Janitor

log = logging.getLogger(__name__)


class UsageError(Exception):
    """Bad input on the agent's command line: exit 2 with the message."""


def nproc_per_node(text: str) -> int:
    if text in ("auto", "cpu"):
        return os.cpu_count() or 1
    if text == "gpu":
        import torch

        return max(1, torch.cuda.device_count())
    if not text.isdigit() or int(text) < 1:
        raise UsageError(
            f"--nproc-per-node {text!r} is not a whole number >= 1 (or auto, cpu, gpu)"
        )
    return int(text)


def worker_command(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """Entrypoint and args of every worker: the bootstrap runs the script or module."""
    script_args = tuple(args.training_script_args)
    if args.no_python and args.module:
        raise UsageError("--no-python and -m cannot be used together")
    if args.no_python:
        target: tuple[str, ...] = ("--exec", args.training_script)
    elif args.module:
        target = ("-m", args.training_script)
    else:
        target = (args.training_script,)
    return sys.executable, ("-m", bootstrap.__name__, *target, *script_args)


def launch(args: argparse.Namespace, fork_server: ForkServer | None = None) -> int:
    try:
        nodes = NodeRange.parse(args.nnodes)
        rdzv_params = rendezvous_parameters(args, nodes)
    except ValueError as err:
        raise UsageError(str(err)) from None
    entrypoint, worker_args = worker_command(args)
    local_world_size = nproc_per_node(args.nproc_per_node)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="torchx_elastic_")
    session = console_session(args, log_dir)
    try:
        use_fresh_store_per_attempt()
        rdzv_handler = create_handler(rdzv_params)
    except BaseException:
        session.close()
        raise
    janitor = Janitor()
    spec = WorkerSpec(
        role=args.role,
        local_world_size=local_world_size,
        entrypoint=entrypoint,
        args=worker_args,
        rdzv_handler=rdzv_handler,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
    )
    agent = ElasticAgent(
        spec,
        log_dir,
        session.make_sink,
        exit_barrier_timeout=args.exit_barrier_timeout,
        events=session.events,
        worker_extra_env=session.worker_env(),
        supervision=supervision(args, session, janitor, fork_server),
    )
    result: RunResult | None = None
    failure: RendezvousFailure | None = None
    code = 1
    try:
        result = agent.run()
        code = 1 if result is not None and result.is_failed() else 0
    except SignalException as err:
        code = 128 + int(err.sigval)
    except RendezvousError as err:
        failure = rendezvous_failure(err, agent, args, rdzv_params)
    finally:
        janitor.close()
        rdzv_handler.shutdown()
        session.close()
    session.finish(result, code, attempt=agent.attempt)
    if failure is not None:
        raise failure
    return code


def rendezvous_failure(
    err: RendezvousError,
    agent: ElasticAgent,
    args: argparse.Namespace,
    rdzv_params: RendezvousParameters,
) -> RendezvousFailure:
    what = describe_error(err)
    lost = lost_nodes(agent.last_round_members, agent.get_worker_group().spec.rdzv_handler)
    if lost:
        what += f" while waiting for {args.nnodes} node(s); lost since the last round: "
        what += ", ".join(lost)
    return RendezvousFailure(endpoint_of(rdzv_params), what)


def supervision(
    args: argparse.Namespace,
    session: ConsoleSession,
    janitor: Janitor,
    fork_server: ForkServer | None,
) -> Supervision:
    watchdog = None
    if args.hang_timeout_s > 0:
        watchdog = HangWatchdog(session.activity, args.hang_timeout_s)
    return Supervision(
        term_timeout_s=args.term_timeout_s,
        janitor=janitor,
        watchdog=watchdog,
        fork_server=fork_server,
    )


def console_session(args: argparse.Namespace, log_dir: str) -> ConsoleSession:
    """The console of this run, from the flags; bad flags are a :class:`UsageError`."""
    try:
        format_prefix(args.log_line_prefix_template, node=0, rank=0, local_rank=0)
        show_ranks = parse_rank_filter(args.console_ranks)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return ConsoleSession(
        log_dir,
        mode=args.console,
        prefix_template=args.log_line_prefix_template,
        tee=args.tee,
        show_ranks=show_ranks,
        role=args.role,
        status_interval_s=args.status_interval_s,
    )


def run(args: argparse.Namespace, fork_server: ForkServer | None = None) -> None:
    """Run the agent with parsed flags and exit with the job's exit code."""
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "WARNING").upper(),
        format="[torchx-elastic %(levelname)s] %(message)s",
    )
    try:
        code = launch(args, fork_server)
    except UsageError as err:
        print(f"torchx-elastic: error: {err}", file=sys.stderr)
        code = 2
    except RendezvousFailure as err:
        print(f"torchx-elastic: error: {err}", file=sys.stderr)
        code = 1
    finally:
        if fork_server is not None:
            fork_server.close()
    # the job is over: skip the interpreter's teardown of torch (most of a second)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
