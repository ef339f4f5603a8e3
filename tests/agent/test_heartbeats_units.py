"""The agent's heartbeats of a c10d rendezvous (rendezvous/heartbeats.py, state_version.py):
a key per node, a watch of ring neighbours, a lost node removed from torch's state.

Real torch handlers on one in-process ``HashStore`` form the rounds; each node's heartbeats
are then driven tick by tick on a clock of the test's (no sleeps), or, in the last test,
run on their own threads on a real ``TCPStore`` while the test waits for the events."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch.distributed import HashStore, TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.rendezvous import heartbeats, liveness, state_version
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.heartbeats import (
    WATCHED_PEERS,
    Heartbeats,
    Timing,
    dropped_key,
    ring_after,
)
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.state_version import VersionedBackend, version_key
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous
from torchx_elastic.contract import SHARE_STORE_OPT_OUT_ENV

RUN_ID = "job"
CONF = {"keep_alive_interval": "1", "keep_alive_max_attempt": "3"}
TIMING = Timing(interval_s=1.0, max_attempt=3, backoff_max_s=0.5)
JOIN_S = 60.0  # a bound on a hang, not a speed
SECRET = b"s" * 32


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def params(nodes: int, addr: str, min_nodes: int, **conf: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend="c10d",
        endpoint="127.0.0.1:29500",
        run_id=RUN_ID,
        min_nodes=min_nodes,
        max_nodes=nodes,
        local_addr=addr,
        **{**CONF, **conf},
    )


def form_round(
    store: Any, nodes: int, secret: bytes | None = None, min_nodes: int = 0, **conf: str
) -> list[WrappedRendezvous]:
    """``nodes`` agents' c10d handlers on ``store`` (node i at 127.0.0.<i + 1>), in one
    round of all; its state signed with ``secret`` (None: unsigned, as the test's own
    readers); later rounds take ``min_nodes`` (0: all)."""
    handlers = [
        handler_on_store(
            compat.store_client(store),  # each agent's own connection
            params(nodes, f"127.0.0.{i + 1}", min_nodes or nodes, **conf),
            StoreSigner(secret),
            Endpoint("n", 1),
        )
        for i in range(nodes)
    ]
    # compat.next_round sets torch's opt-out of its shared store for its call only: set for
    # the whole test (the autouse fixture restores the environment), so that one node's
    # round that returns first does not take it from another's still forming
    os.environ[SHARE_STORE_OPT_OUT_ENV] = "1"
    threads = [threading.Thread(target=compat.next_round, args=(h,)) for h in handlers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    for handler in handlers:
        assert isinstance(handler, liveness.BeatingRendezvous)
        assert len(compat.round_members(handler)) == nodes
    return handlers  # type: ignore[return-value]


@pytest.fixture
def store() -> HashStore:
    return HashStore()


@pytest.fixture
def rendezvous(store: HashStore) -> Iterator[list[WrappedRendezvous]]:
    """Four nodes in a round, their own heartbeats stopped: the test drives them."""
    handlers = form_round(store, 4)
    for handler in handlers:
        beats = handler.heartbeats()
        assert beats is not None
        beats.stop()
    yield handlers
    for handler in handlers:
        handler.shutdown()


Drive = Callable[..., Heartbeats]


@pytest.fixture
def driven(store: HashStore) -> Iterator[Drive]:
    """Heartbeats of a handler's node that the test ticks, on its clock (stopped after)."""
    made: list[Heartbeats] = []

    def drive(
        handler: WrappedRendezvous,
        clock: Clock,
        backend: Any = None,
        sleep: Callable[[float], None] = lambda s: None,
    ) -> Heartbeats:
        node = compat.this_node_key(handler)
        assert node is not None
        if backend is None:
            backend = VersionedBackend(C10dRendezvousBackend(store, RUN_ID), store, RUN_ID)
        settings = compat.rendezvous_settings(handler)
        made.append(Heartbeats(store, backend, RUN_ID, node, settings, TIMING, clock, sleep))
        return made[-1]

    yield drive
    for beats in made:
        beats.stop()


def watchers_of(node: str, beats: list[Heartbeats]) -> list[Heartbeats]:
    """The nodes that watch ``node``, nearest first."""
    keys = [b.node for b in beats]
    distance = {b: ring_after(keys, b.node, WATCHED_PEERS).index(node) for b in beats
                if node in ring_after(keys, b.node, WATCHED_PEERS)}  # fmt: skip
    return sorted(distance, key=distance.__getitem__)


def state_nodes(store: Any) -> frozenset[str]:
    state = C10dRendezvousBackend(store, RUN_ID).get_state()
    assert state is not None
    view = compat.rendezvous_view(state[0])
    assert view is not None
    return view.nodes


def tick(beats: list[Heartbeats], clock: Clock, but: Heartbeats | None = None) -> None:
    """One interval: every node but ``but`` beats and watches."""
    clock.now_s += TIMING.interval_s
    for b in beats:
        if b is not but:
            b.tick()


def test_every_node_is_watched_by_the_same_number_of_ring_neighbours() -> None:
    nodes = [f"10.0.0.{i}_7_0" for i in range(50)]
    watched = [n for me in nodes for n in ring_after(nodes, me, WATCHED_PEERS)]
    assert all(watched.count(n) == WATCHED_PEERS for n in nodes)
    assert ring_after(["a"], "a", WATCHED_PEERS) == []
    assert ring_after(["a", "b"], "a", WATCHED_PEERS) == ["b"]


def test_a_silent_node_is_removed_by_its_nearest_watcher_after_the_dead_after_time(
    store: HashStore, rendezvous: list[WrappedRendezvous], driven: Drive
) -> None:
    clock = Clock()
    beats = [driven(h, clock) for h in rendezvous]
    # node 0's supervision loop, on the driven heartbeats
    survivor = liveness.BeatingRendezvous(rendezvous[0].torch_handler(), beats[0])
    silent = liveness.SilentPeers(CONF)
    silent.new_round(survivor)
    members = compat.round_members(survivor)
    dead = beats[3]
    nearest = watchers_of(dead.node, beats)[0]
    round_ = compat.rendezvous_round(survivor)
    assert round_ is not None
    tick([dead, *beats[:3]], clock)  # it beats last; every node reads its neighbours' beats
    for read in range(1, TIMING.max_attempt):
        tick(beats, clock, but=dead)
        assert dead.node in state_nodes(store), read  # not before its last missed beat
    # silent for half the dead-after time: a member whose ranks fail waits for the verdict
    assert nearest.suspected(round_)
    assert not silent.lost(members, survivor)
    tick(beats, clock, but=dead)
    assert dead.node not in state_nodes(store)
    assert store.check([dropped_key(RUN_ID, dead.node)])
    tick(beats, clock, but=dead)
    assert not nearest.suspected(round_)  # the verdict is in: nobody waits any more
    # the survivors read it: lost, not gone on purpose (it would be in the rendezvous again)
    compat.sync_now(survivor)
    assert silent.lost(members, survivor) == {
        rank: name for rank, name in members.items() if name.startswith("127.0.0.4 ")
    }
    # it comes back (a stalled agent): the mark goes as it joins again
    dead.rejoin()
    assert not store.check([dropped_key(RUN_ID, dead.node)])


def test_a_store_that_pauses_costs_one_read_not_a_drop(
    store: HashStore, rendezvous: list[WrappedRendezvous], driven: Drive
) -> None:
    """The watchers' reads wait for the store as the beats do: a pause far longer than the
    dead-after time counts as one missed beat."""
    clock = Clock()
    beats = [driven(h, clock) for h in rendezvous]
    tick(beats, clock)
    clock.now_s += 10 * TIMING.dead_after_s  # nobody reached the store meanwhile
    for _ in range(2 * TIMING.max_attempt):
        tick(beats, clock)
    assert state_nodes(store) == {b.node for b in beats}


class LosingBackend(RendezvousBackend):
    """A backend whose writes lose the race ``losses`` times (another node wrote first)."""

    def __init__(self, backend: RendezvousBackend, losses: int) -> None:
        self._backend = backend
        self.losses = losses
        self.writes = 0

    @property
    def name(self) -> str:
        return self._backend.name

    def get_state(self) -> Any:
        return self._backend.get_state()

    def set_state(self, state: bytes, token: Any = None) -> Any:
        self.writes += 1
        if self.losses > 0:
            self.losses -= 1
            current = self._backend.get_state()
            assert current is not None
            return current[0], current[1], False
        return self._backend.set_state(state, token)


def test_a_removal_that_loses_the_race_tries_again_after_a_random_delay_a_few_times(
    store: HashStore, rendezvous: list[WrappedRendezvous], driven: Drive
) -> None:
    clock = Clock()
    beats = [driven(h, clock) for h in rendezvous]
    dead = beats[3]
    at = beats.index(watchers_of(dead.node, beats)[0])
    losing = LosingBackend(C10dRendezvousBackend(store, RUN_ID), losses=heartbeats.CAS_TRIES)
    delays: list[float] = []
    watcher = driven(rendezvous[at], clock, losing, delays.append)
    others = [b for b in beats if b is not dead and b.node != watcher.node]

    def interval() -> None:
        clock.now_s += TIMING.interval_s
        for other in others:
            other.beat()
        watcher.tick()

    watcher.tick()
    for _ in range(TIMING.max_attempt):
        interval()
    # every try lost: bounded, each after a random delay within the backoff
    assert losing.writes == heartbeats.CAS_TRIES
    assert len(delays) == heartbeats.CAS_TRIES - 1
    assert all(0 <= d <= TIMING.backoff_max_s for d in delays)
    assert dead.node in state_nodes(store)
    interval()  # the next interval tries again, and wins
    assert state_nodes(store) == {b.node for b in beats if b is not dead}


class CountingBackend(RendezvousBackend):
    def __init__(self, backend: RendezvousBackend) -> None:
        self._backend = backend
        self.reads = 0

    @property
    def name(self) -> str:
        return self._backend.name

    def get_state(self) -> Any:
        self.reads += 1
        return self._backend.get_state()

    def set_state(self, state: bytes, token: Any = None) -> Any:
        return self._backend.set_state(state, token)


def test_the_state_is_read_again_only_after_a_write_changed_it(store: HashStore) -> None:
    counted = CountingBackend(C10dRendezvousBackend(store, RUN_ID))
    clock = Clock()
    reader = VersionedBackend(counted, store, RUN_ID, clock)
    writer = VersionedBackend(C10dRendezvousBackend(store, RUN_ID), store, RUN_ID)
    assert reader.get_state() is None and counted.reads == 1
    written = writer.set_state(b"one")
    assert written is not None and written[2]
    first = reader.get_state()
    assert first is not None and first[0] == b"one" and counted.reads == 2
    for _ in range(5):
        assert reader.get_state() is first  # the counter alone: a few bytes
    assert counted.reads == 2
    stale = writer.set_state(b"two", None)  # a write on a state it did not see: lost
    assert stale is not None and not stale[2]
    assert int(store.add(version_key(RUN_ID), 0)) == 1
    assert reader.get_state() is first
    assert writer.set_state(b"two", first[1]) is not None
    second = reader.get_state()
    assert second is not None and second[0] == b"two" and counted.reads == 3
    # written by something outside the job (no count): read whole now and then all the same
    store.set(f"torch.rendezvous.{RUN_ID}", "b3V0c2lkZQ==")  # "outside", as torch encodes
    assert reader.get_state() is second
    clock.now_s += state_version.VERIFY_MIN_S
    third = reader.get_state()
    assert third is not None and third[0] == b"outside" and counted.reads == 4


def wait_until(done: Callable[[], bool], what: str, bound_s: float = JOIN_S) -> None:
    deadline = time.monotonic() + bound_s  # a bound on a hang, not a speed
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_agents_find_a_node_whose_heartbeats_stopped_lost_and_re_form_without_it() -> None:
    """Three agents' handlers on a real store, their heartbeats on their own threads: one
    stops beating (its host vanished); the others say it is lost and form a round of two."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    # the first round takes all three (its last call outlasts their joins), the next two
    handlers = form_round(server, 3, SECRET, min_nodes=2, last_call_timeout=str(int(JOIN_S)))
    survivors = handlers[:2]
    silent = [liveness.SilentPeers(CONF) for _ in survivors]
    members = [compat.round_members(h) for h in survivors]
    for peers, handler in zip(silent, survivors, strict=True):
        peers.new_round(handler)
    beats = handlers[2].heartbeats()
    assert beats is not None
    beats.stop()

    def everyone_sees_it_lost() -> bool:
        for peers, handler, known in zip(silent, survivors, members, strict=True):
            handler.num_nodes_waiting()
            if not peers.lost(known, handler):
                return False
        return True

    wait_until(everyone_sees_it_lost, "the survivors found the silent node lost")
    (lost,) = silent[0].lost(members[0], survivors[0]).values()
    assert lost.startswith("127.0.0.3 ")
    ages = [compat.freshest_peer_heartbeat_age_s(h) for h in survivors]
    assert all(age is not None for age in ages), ages  # they heard each other's beats
    rounds: list[compat.Round] = []
    for handler in survivors:  # as the supervision loop does after its first round
        liveness.shorten_reform_last_call(handler, CONF)
    threads = [
        threading.Thread(target=lambda h=h: rounds.append(compat.next_round(h))) for h in survivors
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert sorted((r.rank, r.world_size) for r in rounds) == [(0, 2), (1, 2)]
    for handler in handlers:
        handler.shutdown()
