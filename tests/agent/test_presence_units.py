"""A lost peer named within a second (rendezvous/presence.py, supervision/peer_presence.py):
its presence port refuses connections, or it said it left; dropped from torch's rendezvous
at once (compat.expire_nodes); offered as the job's first failure while a node waits for it."""

from __future__ import annotations

import threading

from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent.console.failure.first_failure import (
    LOST_NODE,
    FirstFailure,
    RestartNotice,
    agree,
)
from torchx_elastic.agent.rendezvous import presence
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner


def test_peers_are_probed_in_ring_order_after_this_node_at_most_a_bound() -> None:
    assert presence.probed([0, 1, 2, 3], 2) == [3, 0, 1]
    assert presence.probed(list(range(100)), 98, count=4) == [99, 0, 1, 2]
    assert presence.probed([0], 0) == []


def test_a_closed_port_or_a_node_that_left_is_gone_a_live_one_or_an_unknown_one_is_not() -> None:
    store = SignedStore(HashStore(), StoreSigner(b"secret"))
    live, closed = presence.PresencePort("127.0.0.1"), presence.PresencePort("127.0.0.1")
    presence.publish(store, "h_1_0", live)
    presence.publish(store, "h_2_0", closed)
    closed.close()
    presence.say_left(store, "h_3_0")
    peers = {1: "h_1_0", 2: "h_2_0", 3: "h_3_0", 4: "h_4_0"}  # h_4_0 never published
    assert presence.gone_peers(store, peers) == {
        2: f"its agent is gone (nothing listens on its port {closed.address} any more)",
        3: "its agent was stopped",
    }
    live.close()


def test_an_entry_not_signed_with_the_jobs_secret_decides_nothing() -> None:
    raw = HashStore()
    raw.set(presence.key("h_1_0"), presence.LEFT)  # written without the job's secret
    assert presence.gone_peers(SignedStore(raw, StoreSigner(b"secret")), {1: "h_1_0"}) == {}


def _two_node_round() -> tuple[list[object], list[object]]:
    """Two of torch's handlers on one in-memory store, in one complete round."""
    store = HashStore()
    handlers = []
    for addr in ("127.0.0.1", "127.0.0.2"):
        params = RendezvousParameters("c10d", "localhost:0", "job", 2, 2, local_addr=addr)
        backend = C10dRendezvousBackend(store, "job")
        handlers.append(dynamic_rendezvous.create_handler(store, backend, params))
    infos: list[object] = [None, None]

    def join(i: int) -> None:
        infos[i] = handlers[i].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(infos)
    return handlers, infos


def test_a_lost_peer_found_while_waiting_is_the_jobs_first_failure_said_by_another_node() -> None:
    store = HashStore()
    lost = FirstFailure(
        2, 1, LOST_NODE, "node 1 (h1 (agent pid 7)) was lost: its agent was stopped"
    )
    asked: list[int] = []

    def lost_peer() -> FirstFailure | None:
        asked.append(1)
        return lost if len(asked) > 1 else None  # found at the second look

    assert agree(store, 0, None, wait_s=30, lost_peer=lost_peer) == lost
    assert agree(store, 0, None, wait_s=0.1) == lost  # the others read it back
    notice = RestartNotice(lost, 1, 3, 2)
    assert notice.said_by(0) and not notice.said_by(1)
    assert RestartNotice(FirstFailure(0, 0, LOST_NODE), 1, 3, 2).said_by(1)
    assert notice.line() == (
        "torchx-elastic: rank 2 (node 1) failed: node 1 (h1 (agent pid 7)) was lost: its agent"
        " was stopped; restarting every node: attempt 2 of 4 (2 restarts left), rendezvous"
        " round 2 next"
    )
