"""Glue: command line -> rendezvous handler, worker spec, agent run, exit code."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile
import time
import uuid

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from torchx_elastic.agent import bootstrap
from torchx_elastic.agent.cli import NodeRange, build_parser, parse_rdzv_conf
from torchx_elastic.agent.elastic_agent import ElasticAgent
from torchx_elastic.agent.endpoint import Endpoint
from torchx_elastic.agent.output import OutputSink, PrefixedConsole, RankOutput

log = logging.getLogger(__name__)

DEFAULT_JOIN_TIMEOUT_S = 600.0


class UsageError(Exception):
    """Bad input on the agent's command line: exit 2 with the message."""


def nproc_per_node(text: str) -> int:
    if text in ("auto", "cpu"):
        return os.cpu_count() or 1
    if text == "gpu":
        import torch

        return max(1, torch.cuda.device_count())
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--nproc-per-node {text!r} is not a whole number >= 1 (or auto, cpu, gpu)")
    return int(text)


def worker_command(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """Entrypoint and args of every worker: the bootstrap runs the script or module."""
    script_args = tuple(args.training_script_args)
    if args.no_python:
        if args.module:
            raise UsageError("--no-python and -m cannot be used together")
        return args.training_script, script_args
    target = ("-m", args.training_script) if args.module else (args.training_script,)
    return sys.executable, ("-m", bootstrap.__name__, *target, *script_args)


def wait_until_resolvable(host: str, timeout_s: float) -> None:
    """Pods start in any order: wait for the rank-0 host's name to resolve."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.getaddrinfo(host, None)
            return
        except socket.gaierror as err:
            if time.monotonic() >= deadline:
                raise UsageError(
                    f"rendezvous host {host!r} did not resolve within {timeout_s:.0f}s ({err});"
                    " check --rdzv-endpoint and that the rank-0 node is up and named so"
                ) from None
            time.sleep(1.0)


def rendezvous_parameters(args: argparse.Namespace, nodes: NodeRange) -> RendezvousParameters:
    conf = parse_rdzv_conf(args.rdzv_conf)
    if args.standalone:
        backend, endpoint, run_id = "c10d", Endpoint("localhost", 0), str(uuid.uuid4())
    else:
        backend, run_id = args.rdzv_backend, args.rdzv_id
        try:
            endpoint = Endpoint.parse(args.rdzv_endpoint)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if endpoint.port == 0 and nodes.max_nodes > 1:
        raise UsageError(
            f"--rdzv-endpoint {args.rdzv_endpoint!r}: port 0 (a free port) only works for a"
            f" single node, but --nnodes is {args.nnodes!r}; give the rank-0 node's port"
        )
    join_timeout_s = float(conf.get("join_timeout", DEFAULT_JOIN_TIMEOUT_S))
    wait_until_resolvable(endpoint.host, join_timeout_s)
    return RendezvousParameters(
        backend=backend,
        endpoint=str(endpoint),
        run_id=run_id,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        **conf,
    )


def launch(args: argparse.Namespace) -> int:
    try:
        nodes = NodeRange.parse(args.nnodes)
    except ValueError as err:
        raise UsageError(str(err)) from None
    entrypoint, worker_args = worker_command(args)
    rdzv_params = rendezvous_parameters(args, nodes)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="torchx_elastic_")
    rdzv_handler = get_rendezvous_handler(rdzv_params)
    spec = WorkerSpec(
        role=args.role,
        local_world_size=nproc_per_node(args.nproc_per_node),
        entrypoint=entrypoint,
        args=worker_args,
        rdzv_handler=rdzv_handler,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
    )

    def make_sink(ranks: list[RankOutput]) -> OutputSink:
        return PrefixedConsole(ranks, args.log_line_prefix_template, args.tee)

    agent = ElasticAgent(
        spec, log_dir, make_sink, exit_barrier_timeout=args.exit_barrier_timeout
    )
    try:
        result = agent.run()
    except SignalException as err:
        return 128 + int(err.sigval)
    finally:
        rdzv_handler.shutdown()
    if result is None or not result.is_failed():
        return 0
    report_failure(result, log_dir)
    return 1


def report_failure(result: RunResult, log_dir: str) -> None:
    lines = ["torchx-elastic: the job failed"]
    for rank, failure in sorted(result.failures.items(), key=lambda kv: kv[1].timestamp):
        how = (
            f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        )
        lines.append(f"  rank {rank} (local rank {failure.local_rank}, pid {failure.pid}): {how}")
        if failure.message and not failure.message.startswith("To enable traceback"):
            lines.append(f"    {failure.message}")
    lines.append(f"  logs: {log_dir}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "WARNING").upper(),
        format="[torchx-elastic %(levelname)s] %(message)s",
    )
    args = build_parser().parse_args(argv)
    try:
        code = launch(args)
    except UsageError as err:
        print(f"torchx-elastic: error: {err}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
