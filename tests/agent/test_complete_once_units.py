"""One member completes a round at its last-call deadline, not each of them
(``compat.complete_once``). On torch's own op executors, state holders and c10d backend over
one ``HashStore``; torch's one-second poll stops a join where it would wait (the autouse
fixture imported)."""

from __future__ import annotations

import datetime
import pickle
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from tests.agent.test_keyed_liveness_units import _torch_now
from tests.agent.test_leave_into_wait_list_units import Waits, _polls_stop  # noqa: F401
from torchx_elastic.agent import compat

RUN = "job"
A, B, C = (dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c"))
UTC = datetime.timezone.utc


class OpenRound:
    """Round 1 open with A, B and C in it (min 2, max one more), its last-call deadline
    ``passed_s`` ago; each node's op executor on it, with or without ``complete_once``."""

    def __init__(self, passed_s: float, once: bool = True, between: int = 0) -> None:
        self.store = HashStore()
        now = _torch_now()  # the kind of time this torch keeps (naive before 2.5)
        state = dr._RendezvousState()
        state.round = 1
        # ``between`` more members, between A and B in torch's order (first in the state)
        members = [*(dr._NodeDesc(f"a{i:04}", 1, 0) for i in range(between)), A, B, C]
        state.participants = dict.fromkeys(members, 0)
        state.last_heartbeats = dict.fromkeys(members, now)
        state.deadline = now - timedelta(seconds=passed_s)
        C10dRendezvousBackend(self.store, RUN).set_state(pickle.dumps(state))
        self.settings = dr.RendezvousSettings(
            RUN,
            2,
            len(members) + 1,
            dr.RendezvousTimeout(),
            timedelta(seconds=5),
            keep_alive_max_attempt=3,
        )
        self.writes: list[Any] = []
        self.executors = {node: self._executor(node, once) for node in (A, B, C)}

    def _executor(self, node: Any, once: bool) -> Any:
        writes = self.writes

        class Counted(C10dRendezvousBackend):  # type: ignore[misc]
            def set_state(self, state: bytes, token: Any = None) -> Any:
                writes.append(node)
                return super().set_state(state, token)

        holder = dr._BackendRendezvousStateHolder(
            Counted(self.store, RUN), self.settings, cache_duration=0
        )
        executor = dr._DistributedRendezvousOpExecutor(node, holder, self.settings)
        if once:
            assert compat.complete_once(SimpleNamespace(_op_executor=executor))  # type: ignore[arg-type]
        return executor

    def join(self, node: Any) -> Any:
        """``node``'s join until done (the round's ranks) or waiting (None)."""
        try:
            self.executors[node].run(dr._RendezvousJoinOp(), time.monotonic() + 60)
        except Waits:
            return None
        state = self.executors[node]._state_holder.state
        assert state.complete
        return state.participants


def test_the_round_s_rank_0_to_be_completes_it_and_the_others_only_read_it() -> None:
    job = OpenRound(passed_s=0.5)
    assert job.join(C) is None and job.join(B) is None  # past the deadline, they wait
    assert job.writes == []
    ranks = job.join(A)
    assert ranks == {A: 0, B: 1, C: 2}  # torch's ranks
    assert job.join(B) == ranks and job.join(C) == ranks
    assert job.writes == [A]  # one write for the round, not one a member


def test_the_first_completes_it_at_the_deadline_not_at_the_poll_after_it() -> None:
    job = OpenRound(passed_s=-0.3)  # the deadline in 0.3 s
    assert job.join(B) is None  # the others poll (a second)
    assert job.join(A) == {A: 0, B: 1, C: 2}  # waits the 0.3 s, not its poll's second
    assert job.writes == [A]
    job = OpenRound(passed_s=-5.0)
    assert job.join(A) is None  # a deadline further than a poll away: polls as torch's


def test_without_it_every_member_past_the_deadline_writes_the_completion() -> None:
    """What torch's join does (the race ``complete_once`` removes)."""
    job = OpenRound(passed_s=0.5, once=False)
    assert job.join(C) == {A: 0, B: 1, C: 2}
    assert job.writes == [C]  # whoever polls first writes, each one of them where they race


def test_the_others_complete_it_one_after_another_once_the_first_is_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # member i of 3 may once the deadline is 10 s * (1 + i / 3) past: B at 13.3 s, C at 16.7 s
    monkeypatch.setattr(compat, "COMPLETER_GRACE_S", 10.0)
    job = OpenRound(passed_s=15.0)
    assert job.join(C) is None
    assert job.join(B) == {A: 0, B: 1, C: 2}
    assert job.writes == [B]
    job = OpenRound(passed_s=20.0)
    assert job.join(C) == {A: 0, B: 1, C: 2}


def test_a_member_that_is_not_first_does_not_count_its_place_while_the_first_may_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each member polls once a second while a round waits: counting its place among N
    members (N comparisons) is done only once a member other than the first may complete."""
    job = OpenRound(passed_s=0.5, between=300)
    compared = []
    less = dr._NodeDesc.__lt__
    monkeypatch.setattr(dr._NodeDesc, "__lt__", lambda a, b: compared.append(a) or less(a, b))
    assert job.join(B) is None and job.join(C) is None  # within the first's grace: they wait
    assert 0 < len(compared) <= 2  # one look each, at a member before it
    compared.clear()
    ranks = job.join(A)
    assert ranks is not None and ranks[A] == 0 and len(ranks) == 303
    assert job.writes == [A]
    assert len(compared) >= 302  # the first looked at every other member (and torch's ranks)


def test_a_time_in_the_state_s_own_kind() -> None:
    when = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    naive = SimpleNamespace(last_heartbeats={A: when.replace(tzinfo=None)}, deadline=None)
    aware = SimpleNamespace(last_heartbeats={A: when}, deadline=None)
    empty = SimpleNamespace(last_heartbeats={}, deadline=None)
    deadline_only = SimpleNamespace(last_heartbeats={}, deadline=when.replace(tzinfo=None))
    assert compat._state_time(naive, when) == when.replace(tzinfo=None)  # torch before 2.5
    assert compat._state_time(aware, when) == when
    assert compat._state_time(empty, when) == when
    assert compat._state_time(deadline_only, when).tzinfo is None
