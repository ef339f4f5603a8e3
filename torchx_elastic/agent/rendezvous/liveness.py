"""Peers that stopped answering: what the agent reads of them, and what a survivor says.

Every node writes a heartbeat key and its peers watch it (keyed_liveness.py); a node silent
for ``keep_alive_interval * keep_alive_max_attempt`` seconds is said dead and dropped from
the agent's rendezvous (rounds/handler.py), which re-forms its round at once. A host that
vanished sends no TCP reset, so its peers' collectives would wait for it for as long as the
process group's timeout (30 minutes for gloo); the survivors stop their workers instead and
re-form without it.

The settings and their defaults: config/rdzv_settings.py. ``liveness=state`` (or
``handler=torch``) runs torch's own c10d rendezvous instead, untouched: its heartbeats in
its state, as torchrun's agent does, and none of this.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent.config.rdzv_settings import RendezvousSettings
from torchx_elastic.agent.rendezvous import membership

if TYPE_CHECKING:
    from torchx_elastic.agent.rendezvous.keyed_liveness import KeyedLiveness

log = logging.getLogger(__name__)


def keyed_liveness_of(handler: RendezvousHandler) -> KeyedLiveness | None:
    """The keyed liveness of the agent's rendezvous stack (None: torch's heartbeats)."""
    ask = getattr(handler, "keyed_liveness", None)
    return ask() if callable(ask) else None


def freshest_peer_beat_age_s(handler: RendezvousHandler) -> float | None:
    """Seconds since the newest heartbeat of another node that this node saw through the
    store: proof that peers reached it (None: none seen, or torch's own rendezvous)."""
    keyed_ = keyed_liveness_of(handler)
    return None if keyed_ is None else keyed_.freshest_beat_age_s()


def stop_heartbeats(handler: RendezvousHandler) -> None:
    """End this node's heartbeats of a rendezvous it leaves open (the keyed liveness')."""
    keyed_ = keyed_liveness_of(handler)
    if keyed_ is not None:
        keyed_.stop()


def shorten_reform_last_call(handler: RendezvousHandler, settings: RendezvousSettings) -> None:
    """After the first round, re-form in the re-form's last call (3 s unless
    ``last_call_timeout`` was given): the nodes of a restart or of a new member are there
    within a second of each other, and a lost node is not coming back to this round."""
    if not membership.set_reform_last_call(handler, settings.reform_last_call_s):
        log.debug("torch's rendezvous handler keeps its last call: re-forming waits for it")


class SilentPeers:
    """Members of the running round that a watcher said dead (keyed_liveness.py), read once
    the rendezvous moved past this node's round (a verdict re-forms it at once); with
    torch's own rendezvous, which tells nobody's heartbeats, none."""

    def __init__(self) -> None:
        self._ids: dict[int, str] = {}  # node rank -> node id, of the round
        self._round = 0  # the round number when the round completed
        self.stopped: set[int] = set()  # of the members lost last, those whose agent stopped

    def new_round(self, handler: RendezvousHandler) -> None:
        self._ids = membership.round_node_ids(handler)
        self._round = membership.state_round(handler)

    def lost(self, members: dict[int, str], handler: RendezvousHandler) -> dict[int, str]:
        """Of ``members`` (node rank -> name), those a watcher said dead."""
        keyed_ = keyed_liveness_of(handler)
        if keyed_ is None or not membership.round_moved(handler):
            return {}
        ids = [self._ids[rank] for rank in members if rank in self._ids]
        dead = keyed_.dead(ids, self._round)
        lost = {rank: name for rank, name in members.items() if self._ids.get(rank) in dead}
        self.stopped = {rank for rank in lost if self._ids.get(rank) in keyed_.stopped}
        return lost

    def suspects(self, members: dict[int, str], handler: RendezvousHandler) -> bool:
        """Whether a watcher sees a node silent for a while now (its peers' failures may be
        its loss, which the rendezvous tells within seconds)."""
        del members
        keyed_ = keyed_liveness_of(handler)
        return keyed_ is not None and keyed_.suspects()


def absent_members(members: dict[int, str], handler: RendezvousHandler) -> dict[int, str]:
    """Members of a round (node rank -> name) that are not in the rendezvous any more."""
    present = membership.present_members(handler)
    return {rank: name for rank, name in members.items() if name not in present}


def node_names(members: dict[int, str]) -> list[str]:
    return [f"node {rank}: {name}" for rank, name in sorted(members.items())]


def lost_peer_line(lost: dict[int, str], dead_after_s: float, stopped: Collection[int] = ()) -> str:
    """What a survivor says of the members ``lost``: silent for the dead-after time, or
    (node ranks ``stopped``) said by their agent to have stopped (the keyed liveness)."""
    silent = {rank: name for rank, name in lost.items() if rank not in stopped}
    left = {rank: name for rank, name in lost.items() if rank in stopped}
    parts = []
    if silent:
        parts.append(
            f"{', '.join(node_names(silent))} stopped answering (no rendezvous heartbeat for"
            f" {dead_after_s:g}s)"
        )
    if left:
        parts.append(f"{', '.join(node_names(left))} left the job (its agent was stopped)")
    return f"torchx-elastic: {' and '.join(parts)}: stopping the workers and re-forming without it"


def dropped_line(dead_after_s: float) -> str:
    return (
        "torchx-elastic: the other nodes dropped this node from the rendezvous (they saw no"
        f" heartbeat from it for {dead_after_s:g}s: its agent was stalled or starved of"
        " CPU) and went on without it: stopping its workers and joining again"
    )
