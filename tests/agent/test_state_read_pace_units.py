"""How often a node of the keyed liveness reads a rendezvous state that other nodes changed
(rendezvous/state_generation.py, ``compat.tune_state_syncs``): a change of membership alone
at the pace of the state's size, a move of a round at once. On torch's ``HashStore``, torch's
c10d backend and state holder, with the counter's clock driven by hand."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous import state_generation
from torchx_elastic.agent.rendezvous.state_generation import GenerationCachedBackend

from .test_keyed_liveness_units import _settings, _torch_now

RUN = "job"
NODES = [dr._NodeDesc(f"node-{i}", 1, 0) for i in range(4)]


class Node:
    """One node's tuned state holder on the shared store; the blob reads it did."""

    def __init__(self, store: Any, now: list[float]) -> None:
        self.reads = 0
        node = self

        class Counted(C10dRendezvousBackend):  # type: ignore[misc]
            def get_state(self) -> Any:
                node.reads += 1
                return super().get_state()

        self.backend = GenerationCachedBackend(
            Counted(store, RUN), store, RUN, clock=lambda: now[0]
        )
        self.holder = dr._BackendRendezvousStateHolder(self.backend, _settings(), 1)
        handler = SimpleNamespace(_state_holder=self.holder)
        assert compat.tune_state_syncs(handler, self.backend, 0.0)  # type: ignore[arg-type]

    def sync_later(self) -> None:
        """A sync past torch's one-second cache (the next poll of torch's join)."""
        self.holder._last_sync_time = 0.0
        self.holder.sync()

    def write(self, change: Any) -> None:
        self.holder.sync()
        change(self.holder.state)
        self.holder.mark_dirty()
        assert self.holder.sync() is True


def _state(round_: int, complete: bool, nodes: list[Any], beat: datetime) -> bytes:
    state = dr._RendezvousState()
    state.round, state.complete = round_, complete
    state.participants = {node: rank for rank, node in enumerate(nodes)}
    state.last_heartbeats = dict.fromkeys(nodes, beat)
    return pickle.dumps(state)


@pytest.fixture()
def job(monkeypatch: pytest.MonkeyPatch) -> tuple[Node, Node, list[float], float]:
    """A waiting reader and a writer of a round of NODES[:2], not complete; the state's read
    spaced 10 s apart (its bytes a second set so: a state of about 1,500 nodes)."""
    store, now = HashStore(), [1000.0]
    first = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    blob = _state(1, False, NODES[:2], _torch_now())
    assert first.set_state(blob)[2]  # type: ignore[index]
    spacing_s = 10.0
    monkeypatch.setattr(state_generation, "STATE_READ_BYTES_PER_S", len(blob) / spacing_s)
    reader, writer = Node(store, now), Node(store, now)
    reader.holder.sync()
    assert reader.reads == 1
    return reader, writer, now, spacing_s


def test_a_node_that_joined_is_read_by_the_waiting_nodes_at_the_pace_of_the_states_size(
    job: tuple[Node, Node, list[float], float],
) -> None:
    reader, writer, now, spacing_s = job
    writer.write(lambda state: state.participants.__setitem__(NODES[2], 0))
    now[0] += spacing_s - 1
    reader.sync_later()
    assert reader.reads == 1 and len(reader.holder.state.participants) == 2  # not yet
    now[0] += 1
    reader.sync_later()
    assert reader.reads == 2 and len(reader.holder.state.participants) == 3


def test_a_round_that_completes_is_read_at_the_next_sync(
    job: tuple[Node, Node, list[float], float],
) -> None:
    reader, writer, _, _ = job
    writer.write(lambda state: setattr(state, "complete", True))
    reader.sync_later()
    assert reader.reads == 2 and reader.holder.state.complete


def test_a_sync_asked_for_past_the_cache_reads_what_changed(
    job: tuple[Node, Node, list[float], float],
) -> None:
    reader, writer, _, _ = job
    writer.write(lambda state: state.participants.__setitem__(NODES[2], 0))
    reader.holder._last_sync_time = -1.0  # compat.sync_now: a failure wants the newest state
    reader.holder.sync()
    assert reader.reads == 2 and len(reader.holder.state.participants) == 3


def test_a_round_ended_by_torchs_clean_up_of_a_lost_node_is_read_at_the_next_sync(
    job: tuple[Node, Node, list[float], float],
) -> None:
    """A verdict (the lost node's heartbeat set to the epoch) changes membership only; the
    next node that reads it drops the node (torch's ``_sanitize``), which ends a complete
    round that had no one else: that node's write moves the round for everyone."""
    reader, writer, _, _ = job
    lost = NODES[3]
    epoch = datetime.fromtimestamp(0, timezone.utc)

    def leave_only(state: Any) -> None:
        state.participants = {lost: 0}
        state.last_heartbeats = {lost: _torch_now()}
        state.complete = True

    writer.write(leave_only)
    reader.sync_later()  # complete: read at once
    assert reader.reads == 2 and reader.holder.state.complete

    def verdict(state: Any) -> None:
        beat = state.last_heartbeats[lost]
        state.last_heartbeats[lost] = epoch if beat.tzinfo else epoch.replace(tzinfo=None)

    # as compat.expire_in_state writes it: a holder of its own, dropped after the write
    store = reader.backend._store
    verdicts = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    holder = dr._BackendRendezvousStateHolder(verdicts, _settings(), 0)
    holder.sync()
    verdict(holder.state)
    holder.mark_dirty()
    assert holder.sync() is True
    reader.sync_later()
    assert reader.reads == 2  # a membership change: at its pace
    writer.holder._last_sync_time = -1.0
    writer.holder.sync()  # reads the verdict: drops the node and ends the round, in its copy
    assert (writer.holder.state.round, writer.reads) == (2, 2)
    writer.write(lambda state: state.participants.__setitem__(NODES[0], 0))  # joins round 2
    reader.sync_later()
    state = reader.holder.state
    assert reader.reads == 3
    assert (state.round, state.complete, state.participants) == (2, False, {NODES[0]: 0})


def test_a_state_of_a_few_nodes_is_read_at_every_poll_as_torch_reads_it() -> None:
    store, now = HashStore(), [0.0]
    first = GenerationCachedBackend(C10dRendezvousBackend(store, RUN), store, RUN)
    assert first.set_state(_state(1, False, NODES[:2], _torch_now()))[2]  # type: ignore[index]
    reader, writer = Node(store, now), Node(store, now)
    reader.holder.sync()
    for count in range(2, 5):
        writer.write(lambda state: setattr(state, "deadline", None))
        reader.sync_later()  # the same moment: a state that small is due at every poll
        assert reader.reads == count
