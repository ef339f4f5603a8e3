"""The rendezvous' settings for one run, read once from the config: torch's
``RendezvousParameters`` (with the agent's keep-alive defaults and ``is_host``), the join
timeout, whether this node may host the store, and the constants the handlers share.

Computed once where the rendezvous is created (handler.py) and handed down to the layers
that need a figure of it (the waiting lines' join timeout), never read again per report.
"""

from __future__ import annotations

import socket

from torch.distributed.elastic.rendezvous import RendezvousParameters

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import liveness

DEFAULT_JOIN_TIMEOUT_S = 600.0
# how long the agent hosting the rendezvous keeps it up, closed, after an elastic job that
# ran with fewer than its maximum of nodes succeeded: a node that arrives meanwhile learns
# that the job has finished (--rdzv-conf finished_grace_s=SECONDS)
FINISHED_GRACE_KEY = "finished_grace_s"
DEFAULT_FINISHED_GRACE_S = 12.0
# how long the host of the rendezvous keeps its store up after it named a mismatch, so the
# peers read the roll call (or their node-rank claims) and name it too (instead of a lost
# connection)
HOST_LINGER_S = 2.0


def rendezvous_parameters(config: AgentConfig) -> RendezvousParameters:
    """Parameters of torch's rendezvous handler for this run."""
    conf = liveness.with_keep_alive_defaults(dict(config.rdzv_configs))
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


# --rdzv-conf handler=torch: torch's own c10d rendezvous, untouched, instead of the agent's
# (rounds/handler.py); so does liveness=state (torch's heartbeats are in its state)
HANDLER_KEY = "handler"
TORCH_HANDLER = "torch"


def own_protocol(conf: dict[str, str]) -> bool:
    """Whether the agent's own rendezvous runs (the default) rather than torch's."""
    return conf.get(HANDLER_KEY, "").strip().lower() != TORCH_HANDLER and liveness.keyed(conf)


def join_timeout_s(params: RendezvousParameters) -> float:
    return float(params.config.get("join_timeout", DEFAULT_JOIN_TIMEOUT_S))


def may_host(params: RendezvousParameters, endpoint_host: str) -> bool:
    """Whether this node may host the rendezvous store (as torch's c10d backend decides:
    ``is_host``, else the endpoint names this machine)."""
    flag = params.get_as_bool("is_host")
    if flag is not None:
        return bool(flag)
    return compat.is_this_machine(endpoint_host)


def hosts_rendezvous(config: AgentConfig) -> bool:
    """:func:`may_host` for this run's config (the doctor, the network watch)."""
    return may_host(rendezvous_parameters(config), config.rdzv_endpoint.host)


def finished_grace_s(config: AgentConfig) -> float:
    """How long a rendezvous host keeps the closed rendezvous up for late nodes: only in a
    job that never had its maximum of nodes (nobody else can be on the way otherwise: a
    node the job lost is gone)."""
    return float(config.rdzv_configs.get(FINISHED_GRACE_KEY, DEFAULT_FINISHED_GRACE_S))
