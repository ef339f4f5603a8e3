"""A node that leaves a complete round to join the next one joins the wait list in the same
write (``compat.leave_into_wait_list``): what torch's join would write next, one write less
per node of a re-forming round. On torch's own op executor, state holder and c10d backend
over a ``HashStore``; torch's one-second poll stops the join where it would wait."""

from __future__ import annotations

import pickle
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
A, B, C = (dr._NodeDesc(addr, 1, 0) for addr in ("a", "b", "c"))


class Waits(Exception):
    """torch's join polls: the node waits for the next round."""


def _executor(members: list[Any], leaves_into_wait_list: bool) -> tuple[Any, list[bytes]]:
    """Node A's op executor on a complete round 1 of ``members``; the writes it makes."""
    store, writes = HashStore(), []

    class Counted(C10dRendezvousBackend):  # type: ignore[misc]
        def set_state(self, state: bytes, token: Any = None) -> Any:
            writes.append(state)
            return super().set_state(state, token)

    state = dr._RendezvousState()
    state.round, state.complete = 1, True
    state.participants = {node: rank for rank, node in enumerate(members)}
    state.last_heartbeats = dict.fromkeys(members, _torch_now())  # naive before torch 2.5
    C10dRendezvousBackend(store, RUN).set_state(pickle.dumps(state))
    settings = dr.RendezvousSettings(
        RUN, 1, 3, dr.RendezvousTimeout(), timedelta(seconds=5), keep_alive_max_attempt=3
    )
    holder = dr._BackendRendezvousStateHolder(Counted(store, RUN), settings)
    executor = dr._DistributedRendezvousOpExecutor(A, holder, settings)
    if leaves_into_wait_list:
        assert compat.leave_into_wait_list(SimpleNamespace(_op_executor=executor))  # type: ignore[arg-type]
    return executor, writes


def _next_rendezvous(executor: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch's ``next_rendezvous``: its exit, then its join until the join would wait; the
    state it wrote last."""

    def poll(seconds: Any) -> None:
        raise Waits

    monkeypatch.setattr(dr, "_delay", poll)
    deadline = time.monotonic() + 60
    executor.run(dr._RendezvousExitOp(), deadline)
    with pytest.raises(Waits):
        executor.run(dr._RendezvousJoinOp(), deadline)
    return executor._state_holder.state


@pytest.mark.parametrize("leaves_into_wait_list", [True, False])
def test_a_node_that_leaves_a_round_the_others_keep_waits_for_the_next_in_one_write(
    monkeypatch: pytest.MonkeyPatch, leaves_into_wait_list: bool
) -> None:
    executor, writes = _executor([A, B, C], leaves_into_wait_list)
    state = _next_rendezvous(executor, monkeypatch)
    assert (state.round, state.complete) == (1, True)
    assert set(state.participants) == {B, C} and state.wait_list == {A}
    assert A in state.last_heartbeats
    assert len(writes) == (1 if leaves_into_wait_list else 2)  # torch's own: leave, then wait


def test_the_node_that_leaves_last_opens_the_next_round_as_torch_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    executor, writes = _executor([A], leaves_into_wait_list=True)
    state = _next_rendezvous(executor, monkeypatch)
    assert (state.round, state.complete) == (2, False)
    assert set(state.participants) == {A} and not state.wait_list
    assert len(writes) == 2  # its leave, then its join of the new round
