"""Rendezvous: torch's handler from the config, waiting for the rank-0 host, clear errors."""

from __future__ import annotations

import socket
import time

from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig

DEFAULT_JOIN_TIMEOUT_S = 600.0
# how long the agent hosting the rendezvous keeps it up, closed, after an elastic job that
# ran with fewer than its maximum of nodes succeeded: a node that arrives meanwhile learns
# that the job has finished (--rdzv-conf finished_grace_s=SECONDS)
FINISHED_GRACE_KEY = "finished_grace_s"
DEFAULT_FINISHED_GRACE_S = 5.0
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


class JobAlreadyFinished(Exception):
    """This node arrived after its job's rendezvous was closed: there is nothing to do."""

    def __init__(self, endpoint: Endpoint, run_id: str) -> None:
        super().__init__(
            f"the job this node came for has finished: its rendezvous (run id {run_id!r} at"
            f" {endpoint}) is closed, so this node exits without training"
        )


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


def rendezvous_parameters(config: AgentConfig) -> RendezvousParameters:
    """Parameters of torch's rendezvous handler for this run."""
    conf = dict(config.rdzv_configs)
    endpoint = config.rdzv_endpoint
    if "is_host" not in conf and socket.gethostname() == endpoint.host.split(".")[0]:
        # this node is the rank-0 host by name (a pod's or container's hostname): host the
        # store even while its own DNS record is not published yet
        conf["is_host"] = "true"
    return RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=str(endpoint),
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **conf,
    )


def join_timeout_s(params: RendezvousParameters) -> float:
    return float(params.config.get("join_timeout", DEFAULT_JOIN_TIMEOUT_S))


def finished_grace_s(config: AgentConfig) -> float:
    """How long a rendezvous host keeps the closed rendezvous up for late nodes: only after
    a round of fewer than the maximum of nodes (nobody else can be on the way otherwise)."""
    return float(config.rdzv_configs.get(FINISHED_GRACE_KEY, DEFAULT_FINISHED_GRACE_S))


def hosts_rendezvous(config: AgentConfig) -> bool:
    """Whether this node may host the rendezvous store (as torch's c10d backend decides:
    ``is_host``, else the endpoint names this machine)."""
    flag = rendezvous_parameters(config).get_as_bool("is_host")
    if flag is not None:
        return bool(flag)
    return compat.is_this_machine(config.rdzv_endpoint.host)


def create_handler(config: AgentConfig) -> RendezvousHandler:
    """The rendezvous handler, once the rank-0 host resolves; store errors made readable."""
    params = rendezvous_parameters(config)
    endpoint = config.rdzv_endpoint
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


def lost_nodes(before: dict[int, str], handler: RendezvousHandler) -> list[str]:
    """Members of an earlier round that are not in the rendezvous any more."""
    present = compat.present_members(handler)
    return [f"node {rank}: {name}" for rank, name in sorted(before.items()) if name not in present]
