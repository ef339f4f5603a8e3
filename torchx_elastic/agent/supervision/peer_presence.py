"""A lost peer named within a second (rendezvous/presence.py), round by round.

At each round the agent publishes its presence port under its node's id; when its ranks
fail and no node names the job's first failure, it asks the members that follow it whether
their agent is there. A member whose agent is gone is dropped from torch's rendezvous at
once and offered as the first failure: ``rank 2 (node 1) failed first: node 1 (h1, agent
pid 512) was lost: its agent is gone (...)``. Every node then re-forms without it and no
restart is spent (supervision/loop.py): a lost node is not the script's failure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent import compat
from torchx_elastic.agent.console.failure.first_failure import LOST_NODE, FirstFailure
from torchx_elastic.agent.rendezvous import membership, presence
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.agent.supervision import worker_ranks
from torchx_elastic.agent.supervision.replacements import PID_MARK

log = logging.getLogger(__name__)


class PeerPresence:
    """This node's presence port, and what it knows of the current round's members."""

    def __init__(self, port: presence.PresencePort, signer: StoreSigner) -> None:
        self._port = port
        self._signer = signer
        self._handler: RendezvousHandler | None = None
        self._round: compat.Round | None = None
        self._ids: dict[int, str] = {}  # node rank -> torch's node id
        self._names: dict[int, str] = {}  # node rank -> "addr (agent pid N)"

    def _store(self) -> SignedStore | None:
        store = None if self._handler is None else membership.handler_store(self._handler)
        return None if store is None else SignedStore(store, self._signer)

    def new_round(self, handler: RendezvousHandler, rnd: compat.Round) -> None:
        """A round is complete: publish this node's port, remember the members."""
        self._handler, self._round = handler, rnd
        self._ids = membership.round_node_ids(handler)
        self._names = membership.round_members(handler)
        own, store = membership.this_node_id(handler), self._store()
        if len(self._ids) < 2 or own is None or store is None:
            return
        try:
            presence.publish(store, own, self._port)
        except Exception as err:  # noqa: BLE001 - a hint for the peers; the heartbeats remain
            log.debug("cannot publish this node's presence port: %s", err)

    def lost_peer(self) -> FirstFailure | None:
        """A member of the round that follows this node whose agent is gone, dropped from the
        rendezvous, as the job's first failure; None when none is found."""
        store, handler, rnd = self._store(), self._handler, self._round
        if store is None or handler is None or rnd is None or len(self._ids) < 2:
            return None
        ranks = presence.probed(list(self._ids), rnd.rank)
        gone = presence.gone_peers(store, {rank: self._ids[rank] for rank in ranks})
        if not gone:
            return None
        try:
            membership.expire_nodes(handler, {self._ids[rank] for rank in gone})
        except Exception as err:  # noqa: BLE001 - the heartbeats drop it a few seconds later
            log.debug("cannot drop the lost nodes from the rendezvous: %s", err)
        node = min(gone)
        try:
            rank = worker_ranks.first_rank_of(rnd.store, node)
        except Exception:  # noqa: BLE001 - the round's store may be gone with the node
            rank = -1
        name = plain_name(self._names.get(node, "?"))
        return FirstFailure(
            rank=rank,
            node=node,
            how=LOST_NODE,
            message=f"node {node} ({name}) was lost: {gone[node]}",
        )

    def gone(self, ranks: Sequence[int]) -> set[int]:
        """Of the current round's node ranks ``ranks`` (the first :data:`presence.PROBED_PEERS`
        of them), those whose agent is gone; nothing is changed in the rendezvous."""
        store = self._store()
        if store is None:
            return set()
        peers = {rank: self._ids[rank] for rank in ranks if rank in self._ids}
        chosen = dict(list(peers.items())[: presence.PROBED_PEERS])
        return set(presence.gone_peers(store, chosen))

    def leave(self) -> None:
        """This agent was stopped by a signal: its peers need not wait for its heartbeats."""
        store = self._store()
        own = None if self._handler is None else membership.this_node_id(self._handler)
        if store is not None and own is not None and len(self._ids) > 1:
            presence.say_left(store, own)

    def close(self) -> None:
        self._port.close()


def plain_name(name: str) -> str:
    """``h1 (agent pid 512)`` (``membership.round_members``) as ``h1, agent pid 512``."""
    host, mark, pid = name.partition(PID_MARK)
    return f"{host}, agent pid {pid.rstrip(')')}" if mark else name
