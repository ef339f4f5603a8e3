"""Who a round admits, decided once by one node from the arrivals it read (handler.py).

A round completes when it has its minimum of nodes and either every member of the last
round that was not said dead came back (a re-form, the first round on a store the job moved
to included: the nodes that want in waited for it already) and no more can join, or the
last call passed since it had its minimum (the first round, or a member that does not come
back). It admits, up to its maximum, the members of
the last round that came back first, then a node new to the job at the address of a member
of the last round (a lost node's host, its agent started again), then the other arrivals:
a spare never takes the place of a member that came back, and the arrivals left out wait
for the next round. The nodes admitted are ranked as torch's c10d rendezvous ranks them:
by address, then agent pid.
"""

from __future__ import annotations

import dataclasses

from torchx_elastic.agent.rendezvous.rounds.keys import Node


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """What the deciding node read of a round ``number`` being formed: its arrivals by slot
    (None: a slot whose node was not written, or refused), how many members of the round
    before came back, and how many that round had that were not said dead."""

    number: int
    nodes: list[Node | None]
    back: int
    expected: int


def ready(arrivals: Arrivals, min_nodes: int, max_nodes: int, last_call_passed: bool) -> bool:
    """Whether the round can complete now (see the module's docstring)."""
    count = sum(node is not None for node in arrivals.nodes)
    if count < min_nodes:
        return False
    if last_call_passed:
        return True
    # a re-form: a round after the first, or the first on a store the job moved to
    reform = arrivals.number > 0 or arrivals.expected > 0
    everyone_back = reform and arrivals.back >= arrivals.expected
    return everyone_back or (arrivals.number == 0 and count >= max_nodes)


def members(
    arrivals: Arrivals, dropped: set[str], max_nodes: int, last_addrs: frozenset[str] = frozenset()
) -> list[int]:
    """The slots admitted, in rank order (see the module's docstring); ``last_addrs``: the
    addresses of the last round's members."""
    came = [
        (slot, node)
        for slot, node in enumerate(arrivals.nodes)
        if node is not None and node.id not in dropped
    ]
    previous = arrivals.number - 1
    returning = sorted(
        ((node.last_rank, slot) for slot, node in came if node.last_round == previous),
    )
    first = [slot for _, slot in returning]
    # the others as torch's c10d rendezvous ranks them: by address, then agent pid
    others = sorted((node.addr, node.pid, node.local_id, slot) for slot, node in came)
    again = [s for *_, s in others if s not in first and came_addr(arrivals, s) in last_addrs]
    taken = {*first, *again}
    rest = [s for *_, s in others if s not in taken]
    admitted = set((first + again + rest)[:max_nodes])
    return [s for *_, s in others if s in admitted]  # ranked as torch's: by address


def came_addr(arrivals: Arrivals, slot: int) -> str:
    node = arrivals.nodes[slot]
    return "" if node is None else node.addr
