"""The keyed liveness (``--rdzv-conf liveness=keys``): a heartbeat key per node, watched by
the nodes after it; verdicts written into torch's rendezvous state; the state read only when
it changed. On torch's ``HashStore`` and torch's own c10d backend and state holder, with a
clock driven by hand (no network, no sleeps)."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent.config import rdzv_conf
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.rdzv_settings import RendezvousSettings
from torchx_elastic.agent.rendezvous import handler as handler_module
from torchx_elastic.agent.rendezvous import keyed_liveness, liveness, membership, presence
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.keyed_liveness import (
    KeyedLiveness,
    dead_key,
    suspects_key,
    watched_after,
)
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner

RUN = "job"
INTERVAL_S, DEAD_AFTER_S = 2.0, 10.0


@dataclass(frozen=True)
class Node:  # a node of the rendezvous: what the liveness reads of it
    addr: str
    pid: int = 1

    def __str__(self) -> str:
        return f"{self.addr}_{self.pid}_0"


class _Handler:
    """The rendezvous as the liveness reads it (membership.py): this node and the nodes."""

    def __init__(self, me: Node, nodes: list[Node]) -> None:
        self.me, self.nodes = me, list(nodes)


class Cluster:
    """Nodes a..e, each with its liveness on one store; the verdicts recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int = 5) -> None:
        self.now = [100.0]
        self.store = HashStore()
        self.nodes = [Node(chr(ord("a") + i)) for i in range(count)]
        self.dropped: list[tuple[str, set[str]]] = []

        def expire(handler: Any, ids: set[str], *_: Any) -> bool:
            self.dropped.append((str(handler.me), ids))
            return True

        monkeypatch.setattr(membership, "expire_nodes", expire)
        monkeypatch.setattr(membership, "this_node_id", lambda h: str(h.me))
        monkeypatch.setattr(membership, "state_node_ids", lambda h: sorted(map(str, h.nodes)))
        monkeypatch.setattr(membership, "state_round", lambda h: 0)
        signed = SignedStore(self.store, StoreSigner(b"secret"))
        # torch's handlers, held here: the liveness holds its own weakly
        self.handlers = {str(node): _Handler(node, self.nodes) for node in self.nodes}
        self.beats = {
            str(node): KeyedLiveness(
                self.handlers[str(node)],
                signed,
                RUN,
                INTERVAL_S,
                DEAD_AFTER_S,
                clock=lambda: self.now[0],
            )
            for node in self.nodes
        }

    def run(self, seconds: float, silent: tuple[str, ...] = ()) -> None:
        """Every node ticks once an interval for ``seconds``, but the ``silent`` ones."""
        for _ in range(int(seconds / INTERVAL_S)):
            self.now[0] += INTERVAL_S
            for name, beats in self.beats.items():
                if name not in silent:
                    beats.tick()

    def suspects(self) -> int:
        return int(self.store.add(suspects_key(RUN), 0))


def test_each_node_watches_the_two_after_it_in_ring_order() -> None:
    ids = ["a", "b", "c", "d", "e"]
    assert [watched_after(ids, me) for me in ids] == [
        ["b", "c"],
        ["c", "d"],
        ["d", "e"],
        ["e", "a"],
        ["a", "b"],
    ]
    assert watched_after(["a", "b"], "a") == ["b"] and watched_after(["a"], "a") == []


def test_a_node_whose_key_stops_changing_is_dropped_by_its_two_watchers_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch)
    cluster.run(10)
    assert cluster.dropped == [] and cluster.suspects() == 0
    # a watcher sees c's last beat at its next tick: silent for half the dead-after time
    # (5 s) 8 s later, suspected; dead 4 s after that
    cluster.run(8, silent=("c_1_0",))
    assert cluster.dropped == [] and cluster.suspects() == 2  # by a and b, who watch c
    cluster.run(4, silent=("c_1_0",))
    assert cluster.dropped == [("a_1_0", {"c_1_0"}), ("b_1_0", {"c_1_0"})]
    assert cluster.suspects() == 0  # the verdict is in: nobody suspected any more
    assert cluster.store.check([dead_key(RUN, "c_1_0")])
    liveness_a = cluster.beats["a_1_0"]
    assert cluster.store.get(dead_key(RUN, "c_1_0")).endswith(b"dead 0")  # the state's round
    assert liveness_a.dead(["b_1_0", "c_1_0"], since_round=0) == {"c_1_0"}
    # c came back (it was stalled) and joined round 1: the old verdict is not about it
    assert liveness_a.dead(["c_1_0"], since_round=1) == set()


def test_a_node_whose_agent_said_it_stopped_is_dropped_at_its_first_missed_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deleted pod's agent says ``left`` (its presence entry) as it stops: its watchers
    drop it as soon as a beat is missed, not the dead-after time later (a pod's network may
    go before its workers' connections close, so its peers' ranks need not fail)."""
    cluster = Cluster(monkeypatch)
    cluster.run(10)
    signed = SignedStore(cluster.store, StoreSigner(b"secret"))
    signed.set(presence.key("c_1_0"), presence.LEFT)
    cluster.run(2, silent=("c_1_0",))  # its watchers saw its last beat
    assert cluster.dropped == []
    cluster.run(2, silent=("c_1_0",))  # a beat missed
    assert cluster.dropped == [("a_1_0", {"c_1_0"}), ("b_1_0", {"c_1_0"})]
    assert cluster.store.get(dead_key(RUN, "c_1_0")).endswith(b"dead 0 left")
    liveness_d = cluster.beats["d_1_0"]
    assert liveness_d.dead(["b_1_0", "c_1_0"], since_round=0) == {"c_1_0"}
    assert liveness_d.stopped == {"c_1_0"}
    # a node silent without saying so waits for the dead-after time, as before
    cluster.run(4, silent=("c_1_0", "e_1_0"))
    assert all("e_1_0" not in ids for _, ids in cluster.dropped)


def test_a_store_that_pauses_for_longer_than_the_dead_after_time_accuses_nobody(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every heartbeat is late after the store's pause (nobody could write): a watcher counts
    only the time during which its own beats reached the store."""
    cluster = Cluster(monkeypatch)
    cluster.run(10)
    cluster.now[0] += 30.0  # the store paused: no tick of anyone went through
    cluster.run(20)
    assert cluster.dropped == [] and cluster.suspects() == 0


def test_a_watcher_that_stops_while_it_suspects_a_peer_takes_its_suspicion_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node whose agent stops (its pod deleted) while it suspects a peer leaves the job's
    count as it found it: else every later failure would wait for a verdict nobody gives."""
    cluster = Cluster(monkeypatch)
    cluster.run(10)
    cluster.run(8, silent=("c_1_0",))
    assert cluster.suspects() == 2  # by a and b
    cluster.beats["a_1_0"].stop()
    assert cluster.suspects() == 1
    cluster.beats["a_1_0"].stop()  # once only
    assert cluster.suspects() == 1
    cluster.now[0] += 1.0
    cluster.beats["c_1_0"].tick()  # c beats again, then b looks: b takes its own back
    cluster.beats["b_1_0"].tick()
    assert cluster.suspects() == 0 and cluster.dropped == []


def test_a_watcher_that_was_starved_of_cpu_accuses_nobody_and_is_dropped_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch)
    cluster.run(10)
    cluster.run(12, silent=("a_1_0",))  # a's agent got no CPU for 12 s
    cluster.run(4)  # a runs again: its peers' keys changed, and it saw that
    assert cluster.dropped == [("d_1_0", {"a_1_0"}), ("e_1_0", {"a_1_0"})]


def test_a_peers_heartbeat_seen_by_its_watcher_is_the_proof_that_peers_reach_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch)
    watcher = cluster.beats["a_1_0"]
    assert watcher.freshest_beat_age_s() is None  # nothing seen yet
    cluster.run(4)
    cluster.run(6, silent=("b_1_0", "c_1_0"))  # their last beats, seen at the first of these
    assert watcher.freshest_beat_age_s() == 4.0


def test_a_member_is_lost_once_the_round_moved_on_and_a_watcher_said_it_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervision loop's question, with the keyed liveness: once the job moved past
    this node's round, a member that a watcher said dead stopped answering; one without a
    verdict left for the next round (a restart)."""
    cluster = Cluster(monkeypatch, count=3)
    members = {0: "a (agent pid 1)", 1: "b (agent pid 1)", 2: "c (agent pid 1)"}
    layer = SimpleNamespace(keyed_liveness=lambda: cluster.beats["a_1_0"])
    monkeypatch.setattr(
        membership, "round_node_ids", lambda h: {0: "a_1_0", 1: "b_1_0", 2: "c_1_0"}
    )
    moved = [False]
    monkeypatch.setattr(membership, "round_moved", lambda h: moved[0])
    peers = liveness.SilentPeers()
    torch_a = cluster.handlers["a_1_0"]
    peers.new_round(torch_a)
    SignedStore(cluster.store, StoreSigner(b"secret")).set(dead_key(RUN, "b_1_0"), "dead 0")
    assert peers.lost(members, _Stack(layer, torch_a)) == {}  # not read before the round moved
    moved[0] = True
    cluster.store.set(dead_key(RUN, "c_1_0"), b"forged")  # not signed: no verdict
    assert peers.lost(members, _Stack(layer, torch_a)) == {1: "b (agent pid 1)"}
    SignedStore(cluster.store, StoreSigner(b"secret")).set(dead_key(RUN, "c_1_0"), "dead 0")
    assert peers.lost(members, _Stack(layer, torch_a)) == {
        1: "b (agent pid 1)",
        2: "c (agent pid 1)",
    }
    assert not peers.suspects(members, _Stack(layer, torch_a))
    cluster.store.add(suspects_key(RUN), 1)
    assert peers.suspects(members, _Stack(layer, torch_a))


class _Stack:
    """The agent's rendezvous stack as SilentPeers reads it: the keyed liveness, and torch's
    handler at the bottom."""

    def __init__(self, layer: Any, torch_handler: Any) -> None:
        self.keyed_liveness = layer.keyed_liveness
        self._torch = torch_handler

    def torch_handler(self) -> Any:
        return self._torch


def counted_backend(reads: list[str]) -> Any:
    """torch's c10d backend class whose every read of the blob is appended to ``reads``."""

    class Counted(C10dRendezvousBackend):  # type: ignore[misc]
        def get_state(self) -> Any:
            reads.append("blob")
            return super().get_state()

    return Counted


def test_the_keyed_stack_is_freed_with_its_store_as_soon_as_it_is_dropped() -> None:
    """No reference cycle keeps the rendezvous (and through it, the store) or the
    liveness alive until some later garbage collection, which may run in a forked worker."""
    params = dr.RendezvousParameters("c10d", "h0:1", RUN, 1, 2, local_addr="h0")
    settings = RendezvousSettings.parse(params.config)
    stack = handler_on_store(HashStore(), params, settings, StoreSigner(b"s"), Endpoint("h0", 1))
    holder = weakref.ref(stack.torch_handler())  # type: ignore[attr-defined]
    beats = weakref.ref(stack.keyed_liveness())  # type: ignore[attr-defined]
    stack.shutdown()
    gc.disable()
    try:
        del stack
        assert holder() is None and beats() is None
    finally:
        gc.enable()


EXIT_WITH_BEATS_RUNNING = """
import atexit, threading
# registered first, so it runs last: after the keyed liveness' own exit hook
atexit.register(lambda: print("liveness alive at exit:", any(
    t.name == "torchx-elastic-liveness" and t.is_alive() for t in threading.enumerate())))
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.rdzv_settings import RendezvousSettings
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
params = RendezvousParameters("c10d", "h0:1", "job", 2, 2, local_addr="h0")
settings = RendezvousSettings.parse(params.config)
stack = handler_on_store(HashStore(), params, settings, StoreSigner(None), Endpoint("h0", 1))
print("beats:", stack.keyed_liveness() is not None)
"""


def test_a_process_that_exits_without_stopping_its_beats_stops_them_first() -> None:
    """A daemon thread inside a store call as the interpreter finalizes aborts the process
    (torch 2.4: 'terminate called without an active exception', exit code -11 in about one
    exit in three): the beats a process started end before it exits, whatever its path."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_BEATS_RUNNING], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["beats: True", "liveness alive at exit: False"]


def test_the_liveness_setting_is_checked_before_the_rendezvous() -> None:
    rdzv_conf.check("c10d", {"liveness": "keys"})
    with pytest.raises(ValueError) as err:
        rdzv_conf.check("c10d", {"liveness": "gossip"})
    assert str(err.value) == "--rdzv-conf liveness='gossip': liveness must be state or keys"


def test_the_keyed_liveness_keeps_the_heartbeat_settings_given() -> None:
    params = dr.RendezvousParameters(
        "c10d",
        "h0:1",
        RUN,
        1,
        2,
        keep_alive_interval="2",
        keep_alive_max_attempt="15",
        liveness="keys",
    )
    # the agent's own verdict keeps the settings given
    settings = RendezvousSettings.parse(params.config)
    assert settings.keep_alive_interval_s == 2.0
    assert settings.dead_after_s == 30.0
    assert keyed_liveness.WATCHED == 2

    def mode(conf: dict[str, str], backend: str) -> str:
        return RendezvousSettings.parse(conf).liveness_mode(backend)

    # what each node says in the roll call (a node on torch's heartbeats drops keyed ones)
    assert mode({"liveness": "keys"}, "c10d") == mode({}, "c10d") == "keys"
    assert mode({"liveness": "state"}, "c10d") == "state"
    assert mode({"liveness": "keys"}, "static") == "state"
    assert mode({"handler": "torch"}, "c10d") == "state"  # torch's own heartbeats


class _Away:
    """A store whose host is gone: every call fails as torch's client does."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise RuntimeError("Connection reset by peer")

        return fail


def test_a_store_that_went_away_gives_no_verdict() -> None:
    """The supervision loop's questions get no verdict rather than an error."""
    handler = _Handler(Node("a"), [Node("a"), Node("b")])
    away = KeyedLiveness(handler, SignedStore(_Away(), StoreSigner(None)), RUN, 2.0, 10.0)
    assert away.dead(["b_1_0"], since_round=0) == set()
    assert not away.suspects()


def test_the_liveness_has_a_connection_of_its_own_that_a_waiting_call_does_not_hold() -> None:
    """torch's client holds its connection for a call that waits (torch's wait for rank 0's
    address after a round): the liveness' own connection beats meanwhile."""
    import threading

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    rendezvous = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=20))
    own = handler_module.own_connection(rendezvous)
    assert own is not rendezvous and (own.host, own.port) == (rendezvous.host, rendezvous.port)
    assert own.timeout == rendezvous.timeout
    got: list[bytes] = []
    waiting = threading.Thread(target=lambda: got.append(rendezvous.get("rank0 address")))
    waiting.start()
    own.set("beat", "1")  # through the rendezvous' connection: held until the get timed out
    own.set("rank0 address", "h0 29500")
    waiting.join(30)
    assert got == [b"h0 29500"]
    hashed = HashStore()
    assert handler_module.own_connection(hashed) is hashed  # no server to connect to again
