"""A node's join of the job's first round brings into the round, in the same write, the
nodes of the roll call that are not in it yet (``compat.gather_first_round``): the others
find themselves in the round and write nothing. On torch's own op executors, state holders
and c10d backend over one ``HashStore`` (torch's one-second poll stops a join where it would
wait); then the agent's own stack of handlers, the roll call read by each node's tick."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from tests.agent.test_waiting_units import config
from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous import roll_call, waiting
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.parameters import rendezvous_parameters
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner

RUN = "job"
A, B, C, D = (dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c", "d"))


class Waits(Exception):
    """torch's join polls: the node waits."""


class Job:
    """An empty rendezvous in one store; each node's op executor on it, gathering the first
    round's ``came`` (a list the test fills: the roll call as the node read it); ``nodes``:
    a round's (min, max); the state writes of each node."""

    def __init__(self, nodes: tuple[int, int] = (2, 4), round_: int = 0) -> None:
        self.store = HashStore()
        if round_:
            state = dr._RendezvousState()
            state.round = round_
            C10dRendezvousBackend(self.store, RUN).set_state(pickle.dumps(state))
        self.settings = dr.RendezvousSettings(
            RUN, *nodes, dr.RendezvousTimeout(), timedelta(seconds=5), keep_alive_max_attempt=3
        )
        self.came: list[compat.NodeKey] = []
        self.writes: dict[Any, int] = {}
        self.executors = {node: self._executor(node) for node in (A, B, C, D)}

    def _executor(self, node: Any) -> Any:
        writes = self.writes

        class Counted(C10dRendezvousBackend):  # type: ignore[misc]
            def set_state(self, state: bytes, token: Any = None) -> Any:
                writes[node] = writes.get(node, 0) + 1
                return super().set_state(state, token)

        holder = dr._BackendRendezvousStateHolder(
            Counted(self.store, RUN), self.settings, cache_duration=0
        )
        executor = dr._DistributedRendezvousOpExecutor(node, holder, self.settings)
        handler = SimpleNamespace(_op_executor=executor)
        assert compat.gather_first_round(handler, lambda: list(self.came))  # type: ignore[arg-type]
        return executor

    def join(self, node: Any) -> Any:
        """``node``'s join until done (its state) or waiting (None)."""
        try:
            self.executors[node].run(dr._RendezvousJoinOp(), time.monotonic() + 60)
        except Waits:
            return None
        return self.executors[node]._state_holder.state

    def next_rendezvous(self, node: Any) -> Any:
        """torch's ``next_rendezvous``: ``node``'s exit, then its join until done or waiting
        (None)."""
        self.executors[node].run(dr._RendezvousExitOp(), time.monotonic() + 60)
        return self.join(node)

    def state(self) -> Any:
        return self.stored(self.store)

    @staticmethod
    def stored(store: Any) -> Any:
        """The rendezvous state in ``store`` (unsigned)."""
        got = C10dRendezvousBackend(store, RUN).get_state()
        return pickle.loads(got[0]) if got is not None else dr._RendezvousState()


def key(node: Any) -> compat.NodeKey:
    return (node.addr, node.pid, node.local_id)


@pytest.fixture
def polls_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def poll(seconds: Any) -> None:
        raise Waits

    monkeypatch.setattr(dr, "_delay", poll)


@pytest.mark.usefixtures("polls_stop")
def test_the_first_join_brings_every_node_of_the_roll_call_in_and_completes_the_round() -> None:
    job = Job()
    job.came = [key(n) for n in (D, B, A, C)]
    state = job.join(A)
    # one write: the round at its maximum, torch's ranks (its nodes sorted)
    assert job.writes == {A: 1}
    assert state.complete and state.participants == {A: 0, B: 1, C: 2, D: 3}
    assert set(state.last_heartbeats) == {A, B, C, D}
    for node in (B, C, D):  # each finds itself in the round: no write of its own, nor a
        # leave of the round it was brought into (torch's next_rendezvous leaves first)
        assert job.next_rendezvous(node).participants == state.participants
    assert job.writes == {A: 1}
    # once its own join ended, a node's next round leaves this one as torch's does (its
    # leave, then its join of the wait list)
    assert job.next_rendezvous(B) is None and job.writes == {A: 1, B: 2}
    assert B not in job.state().participants and B in job.state().wait_list


@pytest.mark.usefixtures("polls_stop")
def test_nodes_past_the_maximum_join_as_spares_by_themselves() -> None:
    job = Job(nodes=(2, 3))
    job.came = [key(n) for n in (D, B, C)]  # the roll call's order: D and B get the places
    state = job.join(A)
    assert state.complete and set(state.participants) == {A, B, D}
    assert job.join(C) is None  # a spare waits, as torch's join has it
    assert C in job.state().redundancy_list and job.writes == {A: 1, C: 1}


@pytest.mark.usefixtures("polls_stop")
def test_below_its_maximum_the_round_gets_its_last_call_and_the_rest_join_themselves() -> None:
    job = Job(nodes=(2, 4))
    job.came = [key(B)]
    assert job.join(A) is None
    state = job.state()
    assert not state.complete and set(state.participants) == {A, B}
    assert state.deadline is not None  # at its minimum: torch's last call
    job.came = [key(n) for n in (A, B, C)]
    assert job.join(C) is None and set(job.state().participants) == {A, B, C}
    assert job.join(B) is None  # in the round already: it waits, and writes nothing
    assert job.writes == {A: 1, C: 1}


@pytest.mark.usefixtures("polls_stop")
def test_later_rounds_and_an_unreadable_roll_call_join_only_the_node_itself() -> None:
    job = Job(round_=1)  # the job's first round is over: every later one is torch's
    job.came = [key(B)]
    assert job.join(A) is None and set(job.state().participants) == {A}

    def unreadable() -> list[compat.NodeKey]:
        raise ConnectionError("the store went away")

    job = Job()
    executor = job.executors[A]
    assert compat.gather_first_round(SimpleNamespace(_op_executor=executor), unreadable)  # type: ignore[arg-type]
    assert job.join(A) is None and set(job.state().participants) == {A}


def entry(host: str, **changes: Any) -> NodeEntry:
    published = NodeEntry(host, 7, "job", f"{host}.example", "2:4", 1, 0, "c10d", local_id=3)
    return dataclasses.replace(published, **changes)


def test_the_roll_call_names_the_peers_a_join_brings_in() -> None:
    me = entry("n0")
    entries = [
        me,
        entry("n1"),
        entry("n2", run_id="other"),  # another job on the endpoint
        entry("n3", left=True),
        entry("n4", nproc_per_node=2),  # said as a mismatch, never joined
        entry("n5", local_id=None),  # an agent that does not publish its node: joins itself
        entry("n6", liveness="keyed"),  # another liveness than n0's: a mismatch too
        entry("n7", local_id=0),
    ]
    assert roll_call.first_round_keys(entries, me) == [
        ("n0.example", 7, 3),
        ("n1.example", 7, 3),
        ("n7.example", 7, 0),
    ]


def test_an_entry_is_read_whatever_fields_a_later_agent_adds() -> None:
    published = entry("n1")
    assert NodeEntry.from_json(published.to_json()) == published
    without = entry("n1", local_id=None)
    assert b"local_id" not in without.to_json()  # as an agent before it writes the entry
    later = published.to_json()[:-1] + b', "zone": "eu-1"}'
    assert NodeEntry.from_json(later) == published
    assert NodeEntry.from_json(b"[1, 2]") is None


def test_the_agents_stack_forms_the_first_round_in_one_write() -> None:
    """Three nodes of the agent's own stack on one store, their roll call read by each
    one's tick: the first to join brings the two others in; their joins write nothing."""
    store = HashStore()
    signer = StoreSigner(None)
    writes: list[str] = []
    handlers = []
    for index in range(3):
        node_config = dataclasses.replace(config("3"), local_addr="127.0.0.1")
        params = rendezvous_parameters(node_config)
        handler = handler_on_store(store, params, signer, node_config.rdzv_endpoint)
        backend = compat._torch_handler(handler)._state_holder._backend

        def counted(
            state: bytes, token: Any = None, name: str = f"n{index}", inner: Any = backend.set_state
        ) -> Any:
            writes.append(name)
            return inner(state, token)

        backend.set_state = counted
        handlers.append(waiting.explained(handler, store, node_config, signer, index == 0, 60))
    for came in handlers[:2]:  # n0's and n1's agents came (as their joins start)
        came._publish()
    handlers[2]._check()  # n2's tick read the roll call
    outcome: dict[int, Any] = {}

    def join(index: int) -> None:
        outcome[index] = compat.round_placement(handlers[index].next_rendezvous())[1:]

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in (2, 0, 1)]
    threads[0].start()
    deadline = time.monotonic() + 30
    while not (writes and Job.stored(store).complete) and time.monotonic() < deadline:
        time.sleep(0.01)
    # n2's one write: the round at its maximum, torch's ranks (its nodes sorted)
    nodes = sorted(compat._torch_handler(h)._this_node for h in handlers)
    assert Job.stored(store).participants == {node: rank for rank, node in enumerate(nodes)}
    ranks = {i: nodes.index(compat._torch_handler(h)._this_node) for i, h in enumerate(handlers)}
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outcome == {i: (rank, 3) for i, rank in ranks.items()} and writes == ["n2"]
    for handler in handlers:
        handler.shutdown()


def test_a_node_that_cannot_publish_itself_says_so_and_joins_by_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unreachable:
        def add(self, key: str, amount: int) -> int:
            raise ConnectionError("the store went away")

    me = NodeEntry("n1", 7, "job", "n1", "2", 1, 0, "c10d", local_id=3)
    call = roll_call.RollCall(Unreachable(), me, StoreSigner(None), publish=False)
    handler = SimpleNamespace()  # never reached: only the roll call is
    explained = waiting.ExplainedRendezvous(handler, call, config("2"), False, 60)  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        explained._publish()
    assert "cannot publish this node in the roll call at n0:29500" in caplog.text
    assert explained.first_round_peers() == []  # nobody read: the node joins by itself


def test_the_explained_stack_is_freed_with_its_store_as_soon_as_it_is_dropped() -> None:
    """The first round's hook on torch's join holds the roll call's reader weakly: no
    reference cycle keeps torch's handler (and its store) alive until some later garbage
    collection, which may run in a forked process."""
    import gc
    import weakref

    store = HashStore()
    node_config = dataclasses.replace(config("2"), local_addr="127.0.0.1")
    params = rendezvous_parameters(node_config)
    bottom = handler_on_store(store, params, StoreSigner(None), node_config.rdzv_endpoint)
    stack = waiting.explained(bottom, store, node_config, StoreSigner(None), False, 60)
    torch_handler = weakref.ref(compat._torch_handler(stack))
    stack.shutdown()
    gc.disable()
    try:
        del stack, bottom
        assert torch_handler() is None
    finally:
        gc.enable()
