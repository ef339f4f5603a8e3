"""Peers that stopped answering: the settings of the heartbeats and what a survivor says.

Every node writes a heartbeat key and its peers watch it (keyed_liveness.py); a node silent
for ``keep_alive_interval * keep_alive_max_attempt`` seconds is said dead and dropped from
the agent's rendezvous (rounds/handler.py), which re-forms its round at once. A host that
vanished sends no TCP reset, so its peers' collectives would wait for it for as long as the
process group's timeout (30 minutes for gloo); the survivors stop their workers instead and
re-form without it.

Defaults, where ``--rdzv-conf`` does not set them (torch's are 5 s x 3 and a 30 s last
call): a heartbeat every 2 s, a node dead after 5 missed ones (10 s), and a last call of
3 s for the rounds after the first, when the nodes that re-form are already there.
``liveness=state`` (or ``handler=torch``) runs torch's own c10d rendezvous instead,
untouched: its heartbeats in its state, as torchrun's agent does, and none of this.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent.rendezvous import membership

if TYPE_CHECKING:
    from torchx_elastic.agent.rendezvous.keyed_liveness import KeyedLiveness

log = logging.getLogger(__name__)

KEEP_ALIVE_DEFAULTS = {"keep_alive_interval": "2", "keep_alive_max_attempt": "5"}
LAST_CALL_KEY = "last_call_timeout"
REFORM_LAST_CALL_S = 3.0
# --rdzv-conf liveness=keys (the default: keyed_liveness.py) or state (torch's heartbeats in
# its state, as torchrun's)
LIVENESS_KEY = "liveness"
DEFAULT_LIVENESS = "keys"


def with_keep_alive_defaults(conf: dict[str, str]) -> dict[str, str]:
    """``--rdzv-conf`` with the agent's keep-alive defaults where it gives none."""
    return {**KEEP_ALIVE_DEFAULTS, **conf}


def keyed(conf: dict[str, str]) -> bool:
    """Whether the keyed liveness replaces torch's heartbeats (``--rdzv-conf liveness``)."""
    return conf.get(LIVENESS_KEY, DEFAULT_LIVENESS).strip().lower() == "keys"


def mode(conf: dict[str, str], backend: str) -> str:
    """``keys`` or ``state``: who keeps a node's heartbeats (the keyed liveness of the
    agent's own rendezvous on c10d; torch's, in its state, under ``handler=torch``). Every
    node says it in the roll call, so that nodes of both kinds are named at once."""
    torch_handler = conf.get("handler", "").strip().lower() == "torch"
    return "keys" if backend == "c10d" and keyed(conf) and not torch_handler else "state"


def interval_s(conf: dict[str, str]) -> float:
    return float(with_keep_alive_defaults(conf)["keep_alive_interval"])


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


def dead_after_s(conf: dict[str, str]) -> float:
    """How long a node may miss heartbeats before torch drops it from the rendezvous."""
    full = with_keep_alive_defaults(conf)
    return float(full["keep_alive_interval"]) * float(full["keep_alive_max_attempt"])


def shorten_reform_last_call(handler: RendezvousHandler, conf: dict[str, str]) -> None:
    """After the first round, re-form in :data:`REFORM_LAST_CALL_S` (unless
    ``last_call_timeout`` was given): the nodes of a restart or of a new member are there
    within a second of each other, and a lost node is not coming back to this round."""
    reform = REFORM_LAST_CALL_S
    if LAST_CALL_KEY not in conf and not membership.set_reform_last_call(handler, reform):
        log.debug("torch's rendezvous handler keeps its last call: re-forming waits for it")


class SilentPeers:
    """Members of the running round that a watcher said dead (keyed_liveness.py), read once
    the rendezvous moved past this node's round (a verdict re-forms it at once); with
    torch's own rendezvous, which tells nobody's heartbeats, none."""

    def __init__(self, conf: dict[str, str]) -> None:
        del conf
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


def lost_peer_line(
    lost: dict[int, str], conf: dict[str, str], stopped: Collection[int] = ()
) -> str:
    """What a survivor says of the members ``lost``: silent for the dead-after time, or
    (node ranks ``stopped``) said by their agent to have stopped (the keyed liveness)."""
    silent = {rank: name for rank, name in lost.items() if rank not in stopped}
    left = {rank: name for rank, name in lost.items() if rank in stopped}
    parts = []
    if silent:
        parts.append(
            f"{', '.join(node_names(silent))} stopped answering (no rendezvous heartbeat for"
            f" {dead_after_s(conf):g}s)"
        )
    if left:
        parts.append(f"{', '.join(node_names(left))} left the job (its agent was stopped)")
    return f"torchx-elastic: {' and '.join(parts)}: stopping the workers and re-forming without it"


def dropped_line(conf: dict[str, str]) -> str:
    return (
        "torchx-elastic: the other nodes dropped this node from the rendezvous (they saw no"
        f" heartbeat from it for {dead_after_s(conf):g}s: its agent was stalled or starved of"
        " CPU) and went on without it: stopping its workers and joining again"
    )
