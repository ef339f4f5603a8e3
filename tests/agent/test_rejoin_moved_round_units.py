"""A node that waits for rank 0's address of a round that a verdict re-formed meanwhile
(``compat.reform_without``) joins the next round (``compat.rejoin_moved_rounds``): rank 0,
which had not read the round complete yet, went to the next round and never sets that
address (torch's wait: its read timeout, then an error). On torch's own handler and c10d
backend over one ``HashStore``, rank 0 and the lost node written into the state by hand."""

from __future__ import annotations

import pickle
import threading
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import HashStore, PrefixStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent import compat

from .test_keyed_liveness_units import _torch_now

RUN = "job"
RANK0, LOST = dr._NodeDesc("a", 1, 0), dr._NodeDesc("z", 1, 0)  # sorted first and last


def handler_of(store: Any) -> Any:
    params = RendezvousParameters(
        backend="c10d",
        endpoint="localhost:0",
        run_id=RUN,
        min_nodes=2,
        max_nodes=3,
        local_addr="m",
        last_call_timeout=1,
    )
    handler = dr.create_handler(store, C10dRendezvousBackend(store, RUN), params)
    assert compat.leave_into_wait_list(handler) and compat.rejoin_moved_rounds(handler)
    return handler


def write(store: Any, change: Any) -> Any:
    """The stored state, changed by ``change`` and written back (a node's write)."""
    backend = C10dRendezvousBackend(store, RUN)
    got = backend.get_state()
    state = pickle.loads(got[0]) if got is not None else dr._RendezvousState()
    change(state)
    assert backend.set_state(pickle.dumps(state), got[1] if got is not None else None)[2]
    return state


@pytest.fixture
def quick_rank0_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "RANK0_WAIT_S", 0.1)


@pytest.mark.usefixtures("quick_rank0_waits")
def test_a_node_waiting_for_rank_0_of_a_round_the_job_left_joins_the_next() -> None:
    store = HashStore()
    store.set_timeout(timedelta(seconds=30))  # torch's wait for the address: up to this
    handler = handler_of(store)
    me = handler._this_node

    def forming(state: Any) -> None:  # round 0, with rank 0 and the node lost later
        state.participants = {RANK0: 0, LOST: 0}
        state.last_heartbeats = dict.fromkeys(state.participants, _torch_now())

    write(store, forming)
    outcome: dict[str, Any] = {}

    def join() -> None:
        try:
            outcome["round"] = compat.next_round(handler, "m")
        except Exception as err:  # noqa: BLE001 (the test's answer)
            outcome["error"] = err

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    round0 = PrefixStore(f"torch.rendezvous.{RUN}.0", store)
    # this node's join completes round 0 (its maximum) and it waits for rank 0's address;
    # rank 0 had not read round 0 complete when the verdict on the lost node re-formed it:
    # rank 0 and this node are in round 1
    for _ in range(300):  # until its join's write completed round 0 (a bound, not a pace)
        state = pickle.loads(C10dRendezvousBackend(store, RUN).get_state()[0])
        if state.complete:
            break
        joiner.join(0.1)
    assert (state.round, state.complete, state.participants[me]) == (0, True, 1)
    assert joiner.is_alive() and not round0.check(["MASTER_ADDR"])
    settings = handler._settings
    write(store, lambda state: compat.reform_without(state, {LOST}, settings))
    round1 = PrefixStore(f"torch.rendezvous.{RUN}.1", store)
    # this node completes round 1 at its last call (1 s) and waits for its rank 0
    for _ in range(100):
        state = C10dRendezvousBackend(store, RUN).get_state()
        if state is not None and pickle.loads(state[0]).complete:
            break
        joiner.join(0.1)
    assert pickle.loads(C10dRendezvousBackend(store, RUN).get_state()[0]).round == 1
    round1.set("MASTER_ADDR", "a")  # rank 0, in round 1
    round1.set("MASTER_PORT", "29501")
    joiner.join(30)
    assert "error" not in outcome, outcome.get("error")
    rnd = outcome["round"]
    assert (rnd.rank, rnd.world_size, rnd.master_addr, rnd.master_port) == (1, 2, "a", 29501)
    assert not round0.check(["MASTER_ADDR"])  # round 0's rank 0 never said


def test_a_wait_for_rank_0_outside_a_rejoining_handler_is_torchs() -> None:
    store = HashStore()
    store.set("MASTER_PORT", "1")
    compat._wait_for_rank0(store, "never set")  # no check installed: torch's get waits


def test_a_look_reads_the_state_only_once_the_counter_says_a_round_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Counter:
        mark = 7

        def round_mark(self) -> int:
            return self.mark

        def held_round_mark(self) -> int:
            return 7  # the state this node holds was read at mark 7

    reads: list[int] = []
    rounds = iter([1, 1, 2])
    state = type("State", (), {"round": 1})()
    handler = type("Handler", (), {"_state_holder": type("Holder", (), {"state": state})()})()

    def read(held: Any) -> None:
        reads.append(1)
        state.round = next(rounds)

    monkeypatch.setattr(compat, "sync_now", read)
    counter = Counter()
    moved = compat._moved_since_first_look(handler, counter)
    assert not moved() and not moved() and reads == []  # the round joined; nothing moved
    counter.mark = 8  # a write moved a round: read, still round 1 (another change)
    assert not moved() and len(reads) == 1
    assert not moved() and len(reads) == 1  # the same mark: not read again
    counter.mark = 9
    assert not moved() and len(reads) == 2
    counter.mark = 10
    assert moved() and len(reads) == 3


def test_a_round_that_moved_before_the_first_look_is_found_at_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node read its round complete at mark 7, then was slow: a verdict re-formed the
    round (mark 8) before its wait for rank 0 first looked. The first look's mark is 8, but
    the state it holds is of 7: the next look reads the state and leaves the round."""

    class Counter:
        def round_mark(self) -> int:
            return 8

        def held_round_mark(self) -> int:
            return 7

    reads: list[int] = []
    state = type("State", (), {"round": 1})()
    handler = type("Handler", (), {"_state_holder": type("Holder", (), {"state": state})()})()

    def read(held: Any) -> None:
        reads.append(1)
        state.round = 2

    monkeypatch.setattr(compat, "sync_now", read)
    moved = compat._moved_since_first_look(handler, Counter())
    assert not moved() and reads == []  # the round joined
    assert moved() and reads == [1]  # its state was older than the mark: read, moved
