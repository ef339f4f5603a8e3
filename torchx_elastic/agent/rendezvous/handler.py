"""Rendezvous: parameters from the command line, waiting for the rank-0 host, clear errors."""

from __future__ import annotations

import argparse
import os
import socket
import time
import uuid

from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from torchx_elastic.agent.config.cli import NodeRange, parse_rdzv_conf
from torchx_elastic.agent.config.endpoint import Endpoint

DEFAULT_JOIN_TIMEOUT_S = 600.0
_CHECK = (
    "check that the rank-0 node is running, that {host} resolves and port {port} is reachable"
    " from this node (--rdzv-endpoint / dist.ddp --rdzv_port, firewalls), and that no other"
    " program uses the port; raise the limit with --rdzv-conf join_timeout=SECONDS"
)


class RendezvousFailure(Exception):
    """The rendezvous did not complete: the message names the endpoint and what to check."""

    def __init__(self, endpoint: Endpoint, what: str) -> None:
        check = _CHECK.format(host=endpoint.host, port=endpoint.port)
        super().__init__(f"rendezvous at {endpoint} failed: {what}; {check}")


def use_fresh_store_per_attempt() -> None:
    """Give the workers of every attempt a new TCPStore.

    By default torch shares the agent's rendezvous TCPStore with the workers of every
    attempt, without a per-attempt key prefix: a restarted group then reads the previous
    attempt's keys (gloo's peer addresses, init barriers) and connects to dead peers
    ("Gloo connectFullMesh failed ... Connection refused") or hangs in init_process_group.
    torch's own opt-out makes rank 0 host a fresh store on a new port for each attempt.
    """
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def wait_until_resolvable(endpoint: Endpoint, timeout_s: float) -> None:
    """Nodes start in any order: wait for the rank-0 host's name to resolve."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.getaddrinfo(endpoint.host, endpoint.port)
            return
        except socket.gaierror as err:
            if time.monotonic() >= deadline:
                what = f"host {endpoint.host!r} did not resolve within {timeout_s:g}s ({err})"
                raise RendezvousFailure(endpoint, what) from None
            time.sleep(0.5)


def rendezvous_parameters(args: argparse.Namespace, nodes: NodeRange) -> RendezvousParameters:
    """Parameters of torch's rendezvous from the agent's flags (``ValueError`` on bad input)."""
    conf = parse_rdzv_conf(args.rdzv_conf)
    if args.standalone:
        backend, endpoint, run_id = "c10d", Endpoint("localhost", 0), str(uuid.uuid4())
    else:
        backend, run_id = args.rdzv_backend, args.rdzv_id
        endpoint = Endpoint.parse(args.rdzv_endpoint)
    if endpoint.port == 0 and nodes.max_nodes > 1:
        raise ValueError(
            f"--rdzv-endpoint {args.rdzv_endpoint!r}: port 0 (a free port) only works for a"
            f" single node, but --nnodes is {args.nnodes!r}; give the rank-0 node's port"
        )
    if "is_host" not in conf and socket.gethostname() == endpoint.host.split(".")[0]:
        # this node is the rank-0 host by name (a pod's or container's hostname): host the
        # store even while its own DNS record is not published yet
        conf["is_host"] = "true"
    return RendezvousParameters(
        backend=backend,
        endpoint=str(endpoint),
        run_id=run_id,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        **conf,
    )


def endpoint_of(params: RendezvousParameters) -> Endpoint:
    return Endpoint.parse(params.endpoint)


def join_timeout_s(params: RendezvousParameters) -> float:
    return float(params.config.get("join_timeout", DEFAULT_JOIN_TIMEOUT_S))


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The rendezvous handler, once the rank-0 host resolves; store errors made readable."""
    endpoint = endpoint_of(params)
    wait_until_resolvable(endpoint, join_timeout_s(params))
    try:
        return get_rendezvous_handler(params)
    except (RendezvousError, RuntimeError, TimeoutError, ValueError) as err:
        raise RendezvousFailure(endpoint, describe_error(err)) from None


def describe_error(err: BaseException) -> str:
    """The first line of an error and of its cause, without torch's internals."""
    lines: list[str] = []
    while err is not None and len(lines) < 2:
        text = (str(err).strip() or type(err).__name__).splitlines()[0]
        lines.append(text.removesuffix(" See inner exception for details.").rstrip(". "))
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return ": ".join(lines)


def round_members(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> "addr (agent pid N)" of the handler's last known round, if it tells."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    participants = getattr(state, "participants", None) or {}
    return {rank: f"{node.addr} (agent pid {node.pid})" for node, rank in participants.items()}


def lost_nodes(before: dict[int, str], handler: RendezvousHandler) -> list[str]:
    """Members of an earlier round that are not in the rendezvous any more."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    this_node = getattr(handler, "_this_node", None)
    present = {
        f"{node.addr} (agent pid {node.pid})"
        for node in (
            this_node,
            *(getattr(state, "participants", None) or {}),
            *(getattr(state, "wait_list", None) or ()),
        )
        if node is not None
    }
    return [f"node {rank}: {name}" for rank, name in sorted(before.items()) if name not in present]
