"""Who is in the rendezvous, as the agent's own rendezvous at the bottom of the stack tells
(rounds/handler.py): the round's members, the nodes waiting, this node, the verdicts.

Given any layer of the stack (each offers the handler at its bottom: wrapped.py). Where the
bottom is torch's own handler (``--rdzv-conf handler=torch``, or a backend other than
c10d over TCP), which tells none of this through its public interface, every question
answers "nobody known": the agent then runs as torchrun's does, without the messages,
the standby policy and the verdicts that need it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler

from torchx_elastic.agent.rendezvous.rounds.handler import RoundsRendezvous
from torchx_elastic.agent.rendezvous.rounds.keys import Node
from torchx_elastic.agent.rendezvous.signed_store import SignedStore


def rounds(handler: RendezvousHandler | None) -> RoundsRendezvous | None:
    """The agent's own rendezvous under ``handler``'s layers (None: torch's handler)."""
    if handler is None:
        return None
    bottom = getattr(handler, "torch_handler", None)
    inner = bottom() if callable(bottom) else handler
    return inner if isinstance(inner, RoundsRendezvous) else None


def round_members(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> "addr (agent pid N)" of this node's last round."""
    own = rounds(handler)
    return {} if own is None else {rank: n.name for rank, n in own.members().items()}


def round_node_ids(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> the id of each member of this node's last round."""
    own = rounds(handler)
    return {} if own is None else {rank: n.id for rank, n in own.members().items()}


def round_addresses(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> the address each member of this node's last round published."""
    own = rounds(handler)
    return {} if own is None else {rank: n.addr for rank, n in own.members().items()}


def round_addresses_seen_waiting(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> address of the members of the last round a node that never trained (a
    spare, a new node) saw complete while it waited, with no store call (the store's host
    may be lost): the round its peers that trained in it count from as well, not one it came
    into since, whose members the others may never have seen (they would pick another
    successor)."""
    own = rounds(handler)
    return {} if own is None else {r: n.addr for r, n in own.round_seen_waiting().items()}


def this_node(handler: RendezvousHandler) -> Node | None:
    own = rounds(handler)
    return None if own is None else own.node


def this_node_id(handler: RendezvousHandler) -> str | None:
    node = this_node(handler)
    return None if node is None else node.id


def this_node_address(handler: RendezvousHandler) -> str | None:
    node = this_node(handler)
    return None if node is None else node.addr


def peer_hosts(handler: RendezvousHandler) -> list[str]:
    """The hosts of the other members of this node's last round and of the nodes waiting
    for the next (spares: a member whose only other member is the lost store's host still
    hears them), as last read."""
    own = rounds(handler)
    if own is None:
        return []
    addrs = {n.addr for n in own.members().values()} | {n.addr for n in own.waiting_seen()}
    return sorted(addrs - {own.node.addr})


def standbys(handler: RendezvousHandler) -> tuple[int, bool]:
    """(nodes standing by while the job is at its maximum, whether this node is one)."""
    own = rounds(handler)
    return (0, False) if own is None else own.standbys()


def standbys_seen(handler: RendezvousHandler) -> tuple[int, bool]:
    """:func:`standbys` as last seen, with no store call (the store's host may be lost)."""
    own = rounds(handler)
    return (0, False) if own is None else own.standbys_seen()


def present_members(handler: RendezvousHandler) -> set[str]:
    """Names of the nodes known to be in the rendezvous now (this node included): those
    that came to the round this node waits in, or waited in last; else the members of its
    last round and the nodes waiting for the next."""
    own = rounds(handler)
    return set() if own is None else {node.name for node in own.present()}


def waiting_names(handler: RendezvousHandler) -> list[str]:
    own = rounds(handler)
    return [] if own is None else sorted({n.name for n in own.waiting_nodes()})


def state_node_ids(handler: RendezvousHandler) -> list[str]:
    """The sorted ids of the members of this node's round and of the nodes waiting."""
    own = rounds(handler)
    return [] if own is None else own.state_node_ids()


def state_round(handler: RendezvousHandler) -> int:
    own = rounds(handler)
    return 0 if own is None else own.state_round()


def handler_store(handler: RendezvousHandler) -> Any:
    """The rendezvous store (None: torch's handler does not tell)."""
    own = rounds(handler)
    return None if own is None else own.store


def store_answer_age_s(handler: RendezvousHandler) -> float | None:
    """Seconds since the rendezvous store last answered this node (None: not yet)."""
    own = rounds(handler)
    return None if own is None else own.store_answer_age_s()


def dropped_from_round(handler: RendezvousHandler) -> bool:
    """Whether a watcher said this node dead while the others went on without it."""
    own = rounds(handler)
    return own is not None and own.dropped()


def dropped_ids(handler: RendezvousHandler, store: SignedStore | None = None) -> set[str] | None:
    """The ids of the nodes the rendezvous dropped so far (None: torch's handler)."""
    own = rounds(handler)
    return None if own is None else own.dropped_ids(store)


def round_moved(handler: RendezvousHandler) -> bool:
    """Whether the job moved past this node's last round (a verdict, a member restarting)."""
    own = rounds(handler)
    return own is not None and own.moved_on()


def expire_nodes(
    handler: RendezvousHandler, node_ids: set[str], store: SignedStore | None = None
) -> bool:
    """Drop ``node_ids`` from the rendezvous (rounds/handler.py's ``drop``); whether a
    member of the round was among them. ``store``: the caller's own connection."""
    own = rounds(handler)
    return own is not None and own.drop(node_ids, store)


def withdraw(handler: RendezvousHandler) -> None:
    """This node leaves the rendezvous for good before it trains (it failed its first
    round): no round admits it (where the store still answers)."""
    own = rounds(handler)
    if own is not None:
        try:
            own.drop({own.node.id})
        except RendezvousError:  # the store is gone: nobody to tell
            pass


def set_reform_last_call(handler: RendezvousHandler, seconds: float) -> bool:
    """The last call of the rounds after the first (False: torch's handler keeps its own)."""
    own = rounds(handler)
    if own is None:
        return False
    own.reform_last_call_s = seconds
    return True


def continue_from(
    handler: RendezvousHandler, last: RendezvousHandler, lost: Callable[[str], bool] | None
) -> None:
    """``handler``, on the store the job moved to, takes over from ``last`` (the rounds
    handler's ``continue_from``): its first round completes once the survivors of the last
    round came. ``lost``: whether a member's address is the lost host's (None: one host)."""
    own, before = rounds(handler), rounds(last)
    if own is not None and before is not None:
        own.continue_from(before, None if lost is None else (lambda node: lost(node.addr)))
