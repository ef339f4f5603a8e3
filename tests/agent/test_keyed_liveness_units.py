"""The keyed liveness (``--rdzv-conf liveness=keys``): a heartbeat key per node, watched by
the nodes after it; verdicts written into torch's rendezvous state; the state read only when
it changed. On torch's ``HashStore`` and torch's own c10d backend and state holder, with a
clock driven by hand (no network, no sleeps)."""

from __future__ import annotations

import base64
import gc
import inspect
import logging
import pickle
import signal
import subprocess
import sys
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent import compat
from torchx_elastic.agent.config import rdzv_conf
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.rendezvous import handler as handler_module
from torchx_elastic.agent.rendezvous import keyed_liveness, liveness, presence
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.keyed_liveness import (
    KeyedLiveness,
    dead_key,
    suspects_key,
    watched_after,
)
from torchx_elastic.agent.rendezvous.signed_backend import SignedRendezvousBackend
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.agent.rendezvous.state_generation import GenerationCachedBackend

RUN = "job"
INTERVAL_S, DEAD_AFTER_S = 2.0, 10.0


@dataclass(frozen=True)
class Node:  # torch's _NodeDesc: what the agent reads of it
    addr: str
    pid: int = 1

    def __str__(self) -> str:
        return f"{self.addr}_{self.pid}_0"


class _Handler:
    """torch's handler as the liveness reads it: this node and the synced state's nodes."""

    def __init__(self, me: Node, nodes: list[Node]) -> None:
        state = SimpleNamespace(
            participants={node: rank for rank, node in enumerate(nodes)},
            wait_list=set(),
            redundancy_list=set(),
        )
        self._this_node, self._state_holder = me, SimpleNamespace(state=state)


class Cluster:
    """Nodes a..e, each with its liveness on one store; the verdicts recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int = 5) -> None:
        self.now = [100.0]
        self.store = HashStore()
        self.nodes = [Node(chr(ord("a") + i)) for i in range(count)]
        self.dropped: list[tuple[str, set[str]]] = []

        def expire(backend: Any, handler: Any, ids: set[str], *_: Any) -> bool:
            self.dropped.append((compat.this_node_id(handler) or "?", ids))
            return True

        monkeypatch.setattr(compat, "expire_in_state", expire)
        signed = SignedStore(self.store, StoreSigner(b"secret"))
        # torch's handlers, held here: the liveness holds its own weakly
        self.handlers = {str(node): _Handler(node, self.nodes) for node in self.nodes}
        self.beats = {
            str(node): KeyedLiveness(
                self.handlers[str(node)],
                signed,
                None,
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


def test_a_member_is_lost_when_absent_from_the_rendezvous_and_said_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervision loop's question, with the keyed liveness: an absent member that a
    watcher said dead stopped answering; an absent one without a verdict left for the next
    round (a restart)."""
    cluster = Cluster(monkeypatch, count=3)
    members = {0: "a (agent pid 1)", 1: "b (agent pid 1)", 2: "c (agent pid 1)"}
    layer = SimpleNamespace(keyed_liveness=lambda: cluster.beats["a_1_0"])
    peers = liveness.SilentPeers({})
    torch_a = cluster.handlers["a_1_0"]
    peers.new_round(torch_a)
    torch_a._state_holder.state.participants = {Node("a"): 0}  # b and c are gone from it
    cluster.store.set(dead_key(RUN, "c_1_0"), b"forged")  # not signed: no verdict
    assert peers.lost(members, _Stack(layer, torch_a)) == {}
    SignedStore(cluster.store, StoreSigner(b"secret")).set(dead_key(RUN, "c_1_0"), "dead 0")
    monkeypatch.setattr(liveness, "DEAD_CHECK_S", 0.0)
    assert peers.lost(members, _Stack(layer, torch_a)) == {2: "c (agent pid 1)"}
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


def _torch_now() -> datetime:
    """Now, as torch's rendezvous writes heartbeats: naive UTC before torch 2.5, aware after."""
    now = datetime.now(timezone.utc)
    source = inspect.getsource(dr._DistributedRendezvousOpExecutor._keep_alive)
    return now if "timezone.utc" in source else now.replace(tzinfo=None)


def _state_with(nodes: list[Any], beat: datetime) -> bytes:
    state = dr._RendezvousState()
    state.round, state.complete = 1, True
    state.participants = {node: rank for rank, node in enumerate(nodes)}
    state.last_heartbeats = dict.fromkeys(nodes, beat)
    return pickle.dumps(state)


def _settings() -> Any:
    return dr.RendezvousSettings(
        RUN,
        1,
        3,
        dr.RendezvousTimeout(),
        keep_alive_interval=timedelta(seconds=liveness.TORCH_KEEP_ALIVE_OFF_S),
        keep_alive_max_attempt=3,
    )


def test_a_verdict_drops_the_node_from_torchs_state_for_every_node_that_reads_it() -> None:
    store = HashStore()
    backend = C10dRendezvousBackend(store, RUN)
    nodes = [dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c")]
    # joined a year ago: torch's own heartbeats are off, and nothing that old expires
    backend.set_state(_state_with(nodes, _torch_now() - timedelta(days=365)))
    handler = SimpleNamespace(_settings=_settings())
    assert compat.expire_in_state(backend, handler, {str(nodes[2])}, 3, 0.0)  # type: ignore[arg-type]
    reader = dr._BackendRendezvousStateHolder(C10dRendezvousBackend(store, RUN), _settings())
    reader.sync()
    assert list(reader.state.participants) == nodes[:2]


def test_a_verdict_whose_write_lost_retries_on_the_state_it_met_without_reading_it() -> None:
    store = HashStore()
    nodes = [dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c", "d")]
    old = _torch_now() - timedelta(days=365)
    C10dRendezvousBackend(store, RUN).set_state(_state_with(nodes, old))
    reads: list[str] = []

    class Raced(counted_backend(reads)):  # type: ignore[misc]
        """Another node's verdict on d lands between this one's read and its write."""

        raced = False

        def set_state(self, state: bytes, token: Any = None) -> Any:
            if not Raced.raced:
                Raced.raced = True
                other = C10dRendezvousBackend(store, RUN)
                blob, other_token = other.get_state()
                theirs = pickle.loads(blob)
                del theirs.participants[nodes[3]], theirs.last_heartbeats[nodes[3]]
                other.set_state(pickle.dumps(theirs), other_token)
            return super().set_state(state, token)

    handler = SimpleNamespace(_settings=_settings())
    assert compat.expire_in_state(Raced(store, RUN), handler, {str(nodes[2])}, 3, 0.0)  # type: ignore[arg-type]
    assert reads == ["blob"]  # the second write's state came back with the first's loss
    reader = dr._BackendRendezvousStateHolder(C10dRendezvousBackend(store, RUN), _settings())
    reader.sync()
    assert list(reader.state.participants) == nodes[:2]  # both verdicts stand


def counted_backend(reads: list[str]) -> Any:
    """torch's c10d backend class whose every read of the blob is appended to ``reads``."""

    class Counted(C10dRendezvousBackend):  # type: ignore[misc]
        def get_state(self) -> Any:
            reads.append("blob")
            return super().get_state()

    return Counted


def test_the_state_is_read_only_when_a_node_wrote_it() -> None:
    store = HashStore()
    reads: list[str] = []
    Counted = counted_backend(reads)

    writer = GenerationCachedBackend(Counted(store, RUN), store, RUN)
    reader = GenerationCachedBackend(Counted(store, RUN), store, RUN)
    assert reader.get_state() is None and reader.get_state() is None  # no state yet: read
    reads.clear()
    result = writer.set_state(b"state 1")
    assert result is not None and result[2]
    token = reader.get_state()[1]  # type: ignore[index]
    assert [reader.get_state()[0] for _ in range(5)] == [b"state 1"] * 5  # type: ignore[index]
    assert reads == ["blob"]  # once, then one counter read each
    assert writer.set_state(b"state 2", token)[2]  # type: ignore[index]
    assert reader.get_state()[0] == b"state 2" and reads == ["blob", "blob"]  # type: ignore[index]


def test_the_round_mark_of_the_state_held_is_the_one_read_before_it() -> None:
    store = HashStore()
    writer = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    reader = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    assert reader.held_round_mark() == -1  # nothing read yet: any mark is newer
    assert writer.set_state(b"round 1")[2]  # type: ignore[index]
    writer.mark_round_moved()
    token = reader.get_state()[1]  # type: ignore[index]
    assert reader.held_round_mark() == reader.round_mark() == 1
    assert writer.set_state(b"round 2", token)[2]  # type: ignore[index]
    writer.mark_round_moved()  # after this node's read: its state is of the mark before
    assert (reader.held_round_mark(), reader.round_mark()) == (1, 2)


def _tuned_holder(nodes: list[Any], backend_class: Any, backoff_s: float) -> tuple[Any, Any]:
    """A writer of a state of ``nodes``, and a handler's state holder (its backend of
    ``backend_class``) tuned as the keyed liveness tunes it, after its first read."""
    store = HashStore()
    writer = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    assert writer.set_state(_state_with(nodes, _torch_now()))[2]  # type: ignore[index]
    backend = GenerationCachedBackend(backend_class(store, RUN), store, RUN)
    holder = dr._BackendRendezvousStateHolder(backend, _settings(), cache_duration=1)
    handler = SimpleNamespace(_state_holder=holder)
    assert compat.tune_state_syncs(handler, backend, backoff_s)  # type: ignore[arg-type]
    holder.sync()
    return writer, holder


def test_a_handlers_sync_keeps_the_state_it_holds_while_nobody_wrote_one() -> None:
    """torch's state holder unpickles the whole state on every read its one-second cache
    does not serve (O(N) CPU per node a second); with the counter it keeps the object it
    holds until a node writes, and reads then."""
    reads: list[str] = []
    nodes = [dr._NodeDesc(addr, 1, 0) for addr in ("a", "b")]
    writer, holder = _tuned_holder(nodes[:1], counted_backend(reads), 0.0)
    held = holder.state
    for _ in range(3):
        holder._last_sync_time = -1.0  # the cache expired
        assert holder.sync() is None
    assert holder.state is held and reads == ["blob"]  # one counter read a sync
    token = writer.get_state()[1]  # type: ignore[index]
    assert writer.set_state(_state_with(nodes, _torch_now()), token)[2]  # type: ignore[index]
    holder._last_sync_time = -1.0
    holder.sync()
    assert list(holder.state.participants) == nodes and reads == ["blob", "blob"]
    holder._last_sync_time = -1.0
    holder.mark_dirty()  # this node's own change: written as torch writes it
    holder.sync()
    assert holder._dirty is False and reads == ["blob", "blob"]
    holder._last_sync_time = -1.0
    holder.sync()  # after its own write: read once, then kept
    holder._last_sync_time = -1.0
    holder.sync()
    assert reads == ["blob", "blob", "blob"]


def test_a_write_that_lost_the_race_waits_a_random_time_and_reads_the_state_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A herd of nodes that re-form at once would fail each other's writes again and again;
    a node whose write lost waits up to the backoff, then decides on the state as it is."""
    nodes = [dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c")]
    other, holder = _tuned_holder(nodes[:1], C10dRendezvousBackend, 0.25)
    token = other.get_state()[1]  # type: ignore[index]
    assert other.set_state(_state_with(nodes[:2], _torch_now()), token)[2]  # type: ignore[index]
    assert other.set_state(_state_with(nodes, _torch_now()), other.get_state()[1])[2]  # type: ignore[index]
    waits: list[tuple[float, float]] = []
    monkeypatch.setattr(
        compat.random, "uniform", lambda low, high: waits.append((low, high)) or high
    )
    monkeypatch.setattr(compat.time, "sleep", lambda seconds: waits.append((seconds, seconds)))
    holder.state.participants[dr._NodeDesc("d", 1, 0)] = 3  # this node's write, on an old state
    holder.mark_dirty()
    assert holder.sync() is False  # lost the race
    assert waits == [(0, 0.25), (0.25, 0.25)]
    assert list(holder.state.participants) == nodes  # read again after the wait
    holder.mark_dirty()
    assert holder.sync() is True and waits == [(0, 0.25), (0.25, 0.25)]  # a write that won


def test_the_cas_backoff_grows_with_the_job_up_to_a_bound_and_yields_to_torchs() -> None:
    params = lambda nodes, **conf: dr.RendezvousParameters("c10d", "h:1", RUN, 1, nodes, **conf)  # noqa: E731
    assert handler_module.cas_backoff_s(params(2)) == pytest.approx(0.008)
    assert handler_module.cas_backoff_s(params(250)) == pytest.approx(1.0)
    assert handler_module.cas_backoff_s(params(4000)) == handler_module.CAS_BACKOFF_MAX_S
    assert handler_module.cas_backoff_s(params(4000, cas_backoff_max_seconds="0.5")) == 0.0


def test_the_keyed_stack_is_freed_with_its_store_as_soon_as_it_is_dropped() -> None:
    """No reference cycle keeps the state holder (and through its backend, the store) or the
    liveness alive until some later garbage collection, which may run in a forked worker."""
    params = dr.RendezvousParameters("c10d", "h0:1", RUN, 1, 2, local_addr="h0")
    stack = handler_on_store(HashStore(), params, StoreSigner(b"s"), Endpoint("h0", 1))
    holder = weakref.ref(stack.torch_handler()._state_holder)  # type: ignore[attr-defined]
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
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
params = RendezvousParameters("c10d", "h0:1", "job", 2, 2, local_addr="h0")
stack = handler_on_store(HashStore(), params, StoreSigner(None), Endpoint("h0", 1))
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


def test_what_is_derived_from_the_whole_state_is_derived_again_only_once_it_changed() -> None:
    computed: list[int] = []
    memo = compat.StateMemo(lambda h: computed.append(1) or len(computed))
    handler = _Handler(Node("a"), [Node("a"), Node("b")])
    assert [memo(handler) for _ in range(3)] == [1, 1, 1]
    handler._state_holder.state.wait_list.add(Node("c"))  # a join, in place
    assert memo(handler) == 2 and memo(handler) == 2
    handler._state_holder.state = SimpleNamespace(**vars(handler._state_holder.state))  # a read
    assert memo(handler) == 3


def test_a_forged_state_nobody_rereads_is_found_by_an_audit_and_repaired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In steady state nothing moves the counter, so a blob forged without a bump is read by
    an audit only; the audit writes the verified state back and bumps the counter."""
    store = HashStore()
    make = lambda: GenerationCachedBackend(  # noqa: E731
        SignedRendezvousBackend(C10dRendezvousBackend(store, RUN), StoreSigner(b"s"), RUN),
        store,
        RUN,
    )
    writer, reader = make(), make()
    assert writer.set_state(b"state 1")[2]  # type: ignore[index]
    for node in (writer, reader):  # both read the state once after its write
        assert node.get_state()[0] == b"state 1"  # type: ignore[index]
    key = f"torch.rendezvous.{RUN}"
    store.set(key, base64.b64encode(pickle.dumps({"anything": 1})))
    with caplog.at_level(logging.WARNING):
        assert reader.get_state()[0] == b"state 1"  # type: ignore[index]
        assert writer.get_state()[0] == b"state 1"  # type: ignore[index]
        assert caplog.records == []  # through the counter: not read
        assert reader.audit() is True
        assert [r.getMessage().split(": ")[0] for r in caplog.records] == [
            f"refused the rendezvous state '{key}' from the rendezvous store"
        ]
        assert writer.get_state()[0] == b"state 1"  # type: ignore[index]
        assert writer.audit() is False and reader.audit() is False  # it verifies
    assert len(caplog.records) == 1  # the repaired state is read and verified by all
    unsigned = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    assert unsigned.audit() is False  # a job without a secret verifies nothing


def test_about_two_nodes_of_the_job_audit_the_state_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    audits: list[str] = []
    cluster = Cluster(monkeypatch, count=5)
    for name, beats in cluster.beats.items():
        beats._audited = SimpleNamespace(audit=lambda name=name: audits.append(name))
    draws = iter([0.1, 0.5, 0.39, 0.41, 0.9] * 2)  # audits below 2 in 5
    for beats in cluster.beats.values():
        beats._chance = lambda: next(draws)
    cluster.run(2 * INTERVAL_S)
    assert audits == ["a_1_0", "c_1_0"] * 2


def test_a_node_that_has_not_joined_yet_audits_as_rarely_as_any_node_of_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Of the job's size (its --nnodes maximum), not the state's: a node whose handler has
    not read a state yet (every node before its first round, thousands at a job's start)
    would otherwise read the whole state every interval."""
    audits: list[float] = []
    handler = _Handler(Node("a"), [])
    store = SignedStore(HashStore(), StoreSigner(None))
    for job_nodes, draw in [(1000, 0.001), (1000, 0.003), (1, 0.9)]:
        beats = KeyedLiveness(
            handler, store, None, RUN, INTERVAL_S, DEAD_AFTER_S, job_nodes=job_nodes
        )
        beats._audited = SimpleNamespace(audit=lambda draw=draw: audits.append(draw))
        beats._chance = lambda draw=draw: draw
        beats.tick()
    assert audits == [0.001, 0.9]  # 2 in 1000 of the job's nodes; a node alone always


def test_the_liveness_setting_is_checked_before_the_rendezvous() -> None:
    rdzv_conf.check("c10d", {"liveness": "keys"})
    with pytest.raises(ValueError) as err:
        rdzv_conf.check("c10d", {"liveness": "gossip"})
    assert str(err.value) == "--rdzv-conf liveness='gossip': liveness must be state or keys"


def test_torchs_own_heartbeats_are_off_with_the_keyed_liveness() -> None:
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
    off = {
        "keep_alive_interval": str(liveness.TORCH_KEEP_ALIVE_OFF_S),
        "keep_alive_max_attempt": "1",
    }
    assert {key: liveness.torch_parameters(params).config[key] for key in off} == off
    # the agent's own verdict keeps the settings given
    assert liveness.interval_s(params.config) == 2.0
    assert liveness.dead_after_s(params.config) == 30.0
    as_torch = dr.RendezvousParameters("c10d", "h0:1", RUN, 1, 2, liveness="state")
    assert liveness.torch_parameters(as_torch) is as_torch
    default = dr.RendezvousParameters("c10d", "h0:1", RUN, 1, 2)  # the default: keys
    assert liveness.torch_parameters(default).config["keep_alive_max_attempt"] == "1"
    assert keyed_liveness.WATCHED == 2
    # what each node says in the roll call (a node on torch's heartbeats drops keyed ones)
    assert liveness.mode({"liveness": "keys"}, "c10d") == liveness.mode({}, "c10d") == "keys"
    assert liveness.mode({"liveness": "state"}, "c10d") == "state"
    assert liveness.mode({"liveness": "keys"}, "static") == "state"


class _Away:
    """A store whose host is gone: every call fails as torch's client does."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise RuntimeError("Connection reset by peer")

        return fail


def test_a_store_that_went_away_is_a_rendezvous_connection_error_or_no_verdict() -> None:
    """The layers above expect torch's ``RendezvousConnectionError`` from a backend (the
    failover moves the rendezvous on it), and the supervision loop's questions get no
    verdict rather than an error."""
    backend = GenerationCachedBackend(C10dRendezvousBackend(HashStore(), RUN), _Away(), RUN)
    with pytest.raises(RendezvousConnectionError):
        backend.get_state()
    handler = _Handler(Node("a"), [Node("a"), Node("b")])
    away = KeyedLiveness(handler, SignedStore(_Away(), StoreSigner(None)), None, RUN, 2.0, 10.0)
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


def test_beats_go_on_while_a_look_is_held() -> None:
    """A look that takes long (an audit through the handler's connection, a verdict's
    retried write) never delays the node's beats: they run on a thread of their own."""
    import threading
    import time

    store = HashStore()
    release, auditing = threading.Event(), threading.Event()

    class HeldAudit:
        def audit(self) -> bool:
            auditing.set()
            release.wait(30)
            return False

    me = Node("a")
    handler = _Handler(me, [me, Node("b")])
    beats = KeyedLiveness(
        handler,
        SignedStore(store, StoreSigner(None)),
        None,
        RUN,
        0.01,
        1.0,
        audited=HeldAudit(),
        chance=lambda: 0.0,
    ).start()
    try:
        assert auditing.wait(10)
        key = keyed_liveness.beat_key(RUN, str(me))
        first = int(store.get(key))
        deadline = time.monotonic() + 10
        while int(store.get(key)) < first + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert int(store.get(key)) >= first + 5  # the look is still held
        assert auditing.is_set() and not release.is_set()
    finally:
        release.set()
        beats.stop()


def test_a_stop_signal_during_a_counter_read_stops_the_agent_not_its_rendezvous() -> None:
    """torch raises its ``SignalException`` where the signal finds the agent: a store call
    of the state's counter is not a lost store (exit 143, the rendezvous left open)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    class Signalled:
        def add(self, key: str, amount: int) -> int:
            raise SignalException("Process 7 got signal: 15", sigval=signal.SIGTERM)

    backend = GenerationCachedBackend(C10dRendezvousBackend(HashStore(), RUN), Signalled(), RUN)
    with pytest.raises(SignalException):
        backend.get_state()

    class Lost:
        def add(self, key: str, amount: int) -> int:
            raise RuntimeError("Connection reset by peer")

    lost = GenerationCachedBackend(C10dRendezvousBackend(HashStore(), RUN), Lost(), RUN)
    with pytest.raises(RendezvousConnectionError):
        lost.get_state()
