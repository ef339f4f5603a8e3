"""A node that leaves a complete round to join the next one writes what torch's join would
write next in the same write (``compat.leave_into_wait_list``): it joins the wait list, or,
the last to leave, the next round with the nodes of the wait list that left the same round.
A verdict on a lost member re-forms the round in its own write (``compat.reform_without``).
On torch's own op executors, state holders and c10d backend over one ``HashStore``; torch's
one-second poll stops a join where it would wait."""

from __future__ import annotations

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

from torchx_elastic.agent import compat

from .test_keyed_liveness_units import _torch_now

RUN = "job"
A, B, C, D = (dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c", "d"))


class Waits(Exception):
    """torch's join polls: the node waits for the next round."""


@pytest.fixture(autouse=True)
def _polls_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def poll(seconds: Any) -> None:
        raise Waits

    monkeypatch.setattr(dr, "_delay", poll)


class Job:
    """Complete round 1 of ``members`` with ``waiting`` on its wait list in one store, each
    node's op executor on it (with ``leave_into_wait_list`` where ``ours``, after
    ``compat.hold_joins(hold)`` where given, as the agent installs them), ``nodes``: a
    round's (min, max); the state writes of each node."""

    def __init__(
        self,
        members: list[Any],
        ours: bool = True,
        waiting: tuple[Any, ...] = (),
        nodes: tuple[int, int] = (1, 3),
        hold: Any = None,
    ) -> None:
        self.store = HashStore()
        self.hold = hold
        state = dr._RendezvousState()
        state.round, state.complete = 1, True
        state.participants = {member: rank for rank, member in enumerate(members)}
        state.wait_list = set(waiting)
        state.last_heartbeats = dict.fromkeys([*members, *waiting], _torch_now())
        C10dRendezvousBackend(self.store, RUN).set_state(pickle.dumps(state))
        self.settings = dr.RendezvousSettings(
            RUN, *nodes, dr.RendezvousTimeout(), timedelta(seconds=5), keep_alive_max_attempt=3
        )
        self.writes: dict[Any, list[bytes]] = {}
        self.executors = {node: self._executor(node, ours) for node in [*members, *waiting]}
        for member in members:  # each one's join of round 1 ended: it knows its members
            assert self.join(member) is not None

    def _executor(self, node: Any, ours: bool) -> Any:
        writes = self.writes.setdefault(node, [])

        class Counted(C10dRendezvousBackend):  # type: ignore[misc]
            def set_state(self, state: bytes, token: Any = None) -> Any:
                writes.append(state)
                return super().set_state(state, token)

        # every sync reads: a node's view is never its one-second cache's
        holder = dr._BackendRendezvousStateHolder(
            Counted(self.store, RUN), self.settings, cache_duration=0
        )
        executor = dr._DistributedRendezvousOpExecutor(node, holder, self.settings)
        if self.hold is not None:
            assert compat.hold_joins(SimpleNamespace(_op_executor=executor), self.hold)  # type: ignore[arg-type]
        if ours:
            assert compat.leave_into_wait_list(SimpleNamespace(_op_executor=executor))  # type: ignore[arg-type]
        return executor

    def join(self, node: Any) -> Any:
        """``node``'s join until done (its state) or waiting (None)."""
        executor = self.executors[node]
        try:
            executor.run(dr._RendezvousJoinOp(), time.monotonic() + 60)
        except Waits:
            return None
        return executor._state_holder.state

    def next_rendezvous(self, node: Any) -> Any:
        """torch's ``next_rendezvous``: ``node``'s exit, then its join until done or waiting
        (None)."""
        self.executors[node].run(dr._RendezvousExitOp(), time.monotonic() + 60)
        return self.join(node)

    def state(self) -> Any:
        return pickle.loads(C10dRendezvousBackend(self.store, RUN).get_state()[0])

    def token(self) -> Any:
        return C10dRendezvousBackend(self.store, RUN).get_state()[1]


@pytest.mark.parametrize("ours", [True, False])
def test_a_node_that_leaves_a_round_the_others_keep_waits_for_the_next_in_one_write(
    ours: bool,
) -> None:
    job = Job([A, B, C], ours)
    assert job.next_rendezvous(A) is None
    state = job.state()
    assert (state.round, state.complete) == (1, True)
    assert set(state.participants) == {B, C} and state.wait_list == {A}
    assert A in state.last_heartbeats
    assert len(job.writes[A]) == (1 if ours else 2)  # torch's own: leave, then wait


@pytest.mark.parametrize("ours", [True, False])
def test_the_last_to_leave_brings_those_that_left_before_it_into_the_next_round(
    ours: bool,
) -> None:
    """A full round again: complete with torch's ranks in the last leaver's one write, and
    the others' joins done at their next poll. torch's own exit opens the round, and each
    node then writes its join."""
    job = Job([A, B, C], ours)
    for node in (B, C):
        assert job.next_rendezvous(node) is None
    brought = job.next_rendezvous(A)
    if not ours:
        assert brought is None  # waits for B and C to join
        assert (job.state().round, dict(job.state().participants)) == (2, {A: 0})
        assert len(job.writes[A]) == 2  # its leave, then its join
        return
    assert (brought.round, brought.complete, brought.deadline) == (2, True, None)
    assert brought.participants == {A: 0, B: 1, C: 2} and not brought.wait_list
    assert set(brought.last_heartbeats) == {A, B, C}
    assert len(job.writes[A]) == 1
    for node in (B, C):  # their joins' next polls: done, nothing written
        before = len(job.writes[node])
        assert job.join(node).participants == {A: 0, B: 1, C: 2}
        assert len(job.writes[node]) == before


def test_the_last_to_leave_opens_the_next_round_alone_where_nobody_waits() -> None:
    job = Job([A])
    assert job.next_rendezvous(A) is None
    state = job.state()
    assert (state.round, state.complete, dict(state.participants)) == (2, False, {A: 0})
    assert state.deadline is not None  # its minimum: 1
    assert len(job.writes[A]) == 1  # its leave and its join of the new round, torch's two


def test_a_round_brought_below_its_maximum_waits_for_its_last_call() -> None:
    """Room for one more (maximum 4): the round has its minimum, so its deadline is set as
    the join that reached it sets it; it completes when that passes, as torch's would."""
    job = Job([A, B, C], nodes=(2, 4))
    for node in (B, C, A):
        assert job.next_rendezvous(node) is None
    state = job.state()
    assert (state.round, state.complete) == (2, False)
    assert set(state.participants) == {A, B, C} and state.deadline is not None
    assert len(job.writes[A]) == 1


def test_a_waiting_node_new_to_the_job_joins_itself() -> None:
    """D came to the wait list of round 1 (A's): it may have failed since (settings of its
    own, say), so A's leave does not count it into the next round; D's join joins it."""
    job = Job([A], waiting=(D,))
    assert job.next_rendezvous(A) is None
    state = job.state()
    assert (state.round, dict(state.participants), state.wait_list) == (2, {A: 0}, {D})
    assert job.join(D) is None  # in the round, for its last call
    assert set(job.state().participants) == {A, D}


def test_a_join_is_held_as_before_with_the_leave_beside_it() -> None:
    """Both put on the same op executor (the hold on torch's join, the leave's record of the
    round on it too): the hold still sees every join and holds D out of the round."""
    views: list[compat.JoinView] = []

    def hold(view: compat.JoinView) -> bool:
        views.append(view)
        return view.node == D

    job = Job([A], waiting=(D,), hold=hold)
    assert job.next_rendezvous(A) is None
    assert job.join(D) is None
    assert set(job.state().participants) == {A} and job.state().wait_list == {D}
    assert views[-1].node == D and views[-1].joining


def verdict(job: Job, *lost: Any, by: Any = None) -> int:
    """A watcher's verdict on ``lost``: as the keyed liveness writes it
    (``compat.expire_in_state``, through a backend of its own), or, ``by`` a node, as the
    presence port's does (``compat.expire_nodes``, through that node's handler); how many
    state writes it took."""
    ids = {compat.node_id(node) for node in lost}
    if by is not None:
        executor = job.executors[by]
        before = len(job.writes[by])
        handler = SimpleNamespace(
            _op_executor=executor,
            _state_holder=executor._state_holder,
            _heartbeat_lock=threading.Lock(),
        )
        assert compat.expire_nodes(handler, ids)  # type: ignore[arg-type]
        written = len(job.writes[by]) - before
        job.writes[by] = job.writes[by][:before]  # the verdict's, not the node's leave or join
        return written
    writes: list[bytes] = []

    class Verdicts(C10dRendezvousBackend):  # type: ignore[misc]
        def set_state(self, state: bytes, token: Any = None) -> Any:
            writes.append(state)
            return super().set_state(state, token)

    handler = SimpleNamespace(_settings=job.settings)
    assert compat.expire_in_state(Verdicts(job.store, RUN), handler, ids, 3, 0.0)  # type: ignore[arg-type]
    return len(writes)


@pytest.mark.parametrize("by", [None, A], ids=["keyed-liveness", "presence"])
@pytest.mark.parametrize("nodes", [(2, 4), (4, 4)], ids=["minimum-kept", "below-minimum"])
def test_a_verdict_on_a_lost_member_re_forms_the_round_in_its_own_write(
    nodes: tuple[int, int], by: Any
) -> None:
    """D is lost: the verdict's one write opens round 2 with A, B and C in it (a deadline
    where they are the minimum); each of them then leaves round 1 and joins round 2 without
    a write, and the round completes at its deadline with torch's ranks (one write)."""
    job = Job([A, B, C, D], nodes=nodes)
    assert verdict(job, D, by=by) == 1
    state = job.state()
    assert (state.round, state.complete, set(state.participants)) == (2, False, {A, B, C})
    assert (state.deadline is not None) == (nodes[0] <= 3)
    for node in (A, B, C):
        assert job.next_rendezvous(node) is None  # in round 2, for its last call
        assert job.writes[node] == []
    if state.deadline is None:
        return  # three nodes of a job of four at least: the round waits for a fourth
    state.deadline = _torch_now() - timedelta(seconds=1)  # the last call is over
    C10dRendezvousBackend(job.store, RUN).set_state(pickle.dumps(state), job.token())
    done = job.join(B)
    assert (done.round, done.complete, done.participants) == (2, True, {A: 0, B: 1, C: 2})
    assert len(job.writes[B]) == 1  # torch's: the round complete
    for node in (A, C):
        assert job.join(node).participants == {A: 0, B: 1, C: 2}
        assert job.writes[node] == []


def test_a_verdict_on_a_waiting_node_leaves_the_round_as_it_is() -> None:
    job = Job([A, B], waiting=(D,))
    assert verdict(job, D) == 1
    state = job.state()
    assert (state.round, state.complete, dict(state.participants)) == (1, True, {A: 0, B: 1})
    assert state.last_heartbeats[D].timestamp() == 0  # dropped at every node's next read


@pytest.mark.parametrize("ours", [True, False])
def test_a_member_that_left_before_the_verdict_joins_the_re_formed_round_itself(
    ours: bool,
) -> None:
    """B left round 1 (a failure of its own) before D's verdict: the verdict moves A and C;
    B, on the wait list, joins round 2 as torch's join has it."""
    job = Job([A, B, C, D], ours, nodes=(2, 4))
    assert job.next_rendezvous(B) is None
    assert verdict(job, D) == 1
    assert set(job.state().participants) == {A, C}
    assert job.join(B) is None
    assert set(job.state().participants) == {A, B, C}
