"""The rendezvous' parameters for one run: torch's ``RendezvousParameters`` (with the
agent's keep-alive defaults and ``is_host``), whether this node may host the store, and the
constants the handlers share. The settings themselves are read once, typed, in
``config/rdzv_settings.py`` (``AgentConfig.rdzv``).
"""

from __future__ import annotations

import socket

from torch.distributed.elastic.rendezvous import RendezvousParameters

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.launch import AgentConfig

# how long the host of the rendezvous keeps its store up after it named a mismatch, so the
# peers read the roll call (or their node-rank claims) and name it too (instead of a lost
# connection)
HOST_LINGER_S = 2.0


def rendezvous_parameters(config: AgentConfig) -> RendezvousParameters:
    """Parameters of torch's rendezvous handler for this run."""
    conf = config.rdzv.torch_conf()
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
