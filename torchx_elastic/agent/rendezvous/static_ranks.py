"""A duplicate ``--node-rank`` with the static rendezvous, named by the nodes concerned.

torch's static backend takes each node's ``--node-rank`` on trust: two nodes given the same
rank start workers with the same global ranks, and the rank nobody took leaves the job
waiting for it (torchrun says nothing; the job hangs in ``init_process_group`` until its
timeout). After each static round every node claims its rank in the agents' store. A node
whose rank another node claimed first says so and stops; once as many claims as nodes are
in, a node that sees a rank claimed twice or not at all names them, with the hosts.
"""

from __future__ import annotations

import time
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous.diagnosis import Problem, RendezvousDiagnosis
from torchx_elastic.agent.rendezvous.observed import WrappedRendezvous
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry
from torchx_elastic.agent.rendezvous.waiting import HOST_LINGER_S
from torchx_elastic.contract import STATIC_RANK_KEY_PREFIX

CLAIMS_WAIT_S = 10.0  # a peer that claims nothing (torchrun's) only delays this check
POLL_S = 0.1
FIX = "give each node its own --node-rank, 0 to --nnodes - 1"


def duplicate(rank: int, first: str) -> Problem:
    return Problem(f"--node-rank {rank} is taken by {first}, which joined first", FIX)


def wrong_ranks(claimed_twice: dict[int, list[str]], missing: list[int], nodes: int) -> Problem:
    parts = [f"--node-rank {r} was given to {' and '.join(w)}" for r, w in claimed_twice.items()]
    if missing:
        parts.append(f"no node has --node-rank {', '.join(map(str, missing))} of {nodes}")
    return Problem("; ".join(parts), FIX)


def check_claims(
    store: Any, round_: int, rank: int, nodes: int, me: str, wait_s: float = CLAIMS_WAIT_S
) -> Problem | None:
    """Claim ``rank`` for ``me`` in round ``round_``; the problem with the job's node ranks,
    if there is one."""
    prefix = f"{STATIC_RANK_KEY_PREFIX}{round_}/"
    claim = int(store.add(f"{prefix}{rank}/count", 1))
    store.set(f"{prefix}{rank}/{claim}", me)
    claims = int(store.add(f"{prefix}count", 1))  # counted before all else: peers wait for it
    if claim > 1:
        return duplicate(rank, store.get(f"{prefix}{rank}/1").decode())
    deadline = time.monotonic() + wait_s
    while claims < nodes:
        if time.monotonic() >= deadline:
            return None  # a peer that claims nothing: nothing to compare
        time.sleep(POLL_S)
        claims = int(store.add(f"{prefix}count", 0))
    counts = {r: int(store.add(f"{prefix}{r}/count", 0)) for r in range(nodes)}
    claimed_twice = {
        r: [store.get(f"{prefix}{r}/{i}").decode() for i in range(1, count + 1)]
        for r, count in counts.items()
        if count > 1
    }
    missing = [r for r, count in counts.items() if count == 0]
    if not claimed_twice and not missing:
        return None
    return wrong_ranks(claimed_twice, missing, nodes)


class CheckedStaticRanks(WrappedRendezvous):
    """The static handler, whose every round checks the nodes' ``--node-rank``."""

    def __init__(self, handler: RendezvousHandler, config: AgentConfig) -> None:
        super().__init__(handler)
        self._config = config
        self._rounds = 0

    def next_rendezvous(self) -> RendezvousInfo:
        info = self.handler.next_rendezvous()
        store, rank, nodes = compat.round_placement(info)
        me = NodeEntry.of_this_node(self._config).name
        problem = check_claims(store, self._rounds, rank, nodes, me)
        self._rounds += 1
        if problem is not None:
            if rank == 0:  # node rank 0 hosts the store: its peers read their claims there
                time.sleep(HOST_LINGER_S)
            raise RendezvousDiagnosis(self._config.rdzv_endpoint, problem)
        return info
