"""Peers that stopped answering, told by torch's own rendezvous heartbeats.

torch's c10d rendezvous handler sends this node's heartbeat through the rendezvous store
every ``keep_alive_interval`` seconds and, on every sync of the rendezvous state, drops a
node whose last heartbeat is older than ``keep_alive_interval * keep_alive_max_attempt``
(``DynamicRendezvousHandler._keep_alive``, ``_RendezvousStateHolder._sanitize``). The agent
reads that verdict (it syncs the state on every check for waiting nodes): a member of the
running round that torch dropped has stopped answering. A host that vanished sends no TCP
reset, so its peers' collectives would wait for it for as long as the process group's
timeout (30 minutes for gloo); the survivors stop their workers instead and re-form
without it.

Defaults, where ``--rdzv-conf`` does not set them (torch's are 5 s x 3 and a 30 s last
call): a heartbeat every 2 s, a node dead after 5 missed ones (10 s), and a last call of
3 s for the rounds after the first, when the nodes that re-form are already there.

By default (``--rdzv-conf liveness=keys``) the heartbeats go to a key per node instead,
watched by the nodes that follow it (keyed_liveness.py): the same settings and the same
verdict, at a cost per node that does not grow with the job's size; torch's handler is made
with its own heartbeats off (:func:`torch_parameters`). ``liveness=state`` keeps torch's
heartbeats in its state, as torchrun's agent does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

from torchx_elastic.agent import compat

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
# torch's own keep-alive where the keyed liveness replaces it: never due (ten years, one
# attempt), so that no heartbeat written at a join expires while a job runs, and a verdict's
# (the epoch) always does
TORCH_KEEP_ALIVE_OFF_S = 10 * 365 * 24 * 3600
DEAD_CHECK_S = 0.5  # a member absent from the rendezvous: its verdict read this often


def with_keep_alive_defaults(conf: dict[str, str]) -> dict[str, str]:
    """``--rdzv-conf`` with the agent's keep-alive defaults where it gives none."""
    return {**KEEP_ALIVE_DEFAULTS, **conf}


def keyed(conf: dict[str, str]) -> bool:
    """Whether the keyed liveness replaces torch's heartbeats (``--rdzv-conf liveness``)."""
    return conf.get(LIVENESS_KEY, DEFAULT_LIVENESS).strip().lower() == "keys"


def mode(conf: dict[str, str], backend: str) -> str:
    """``keys`` or ``state``: who keeps a node's heartbeats (the keyed liveness on c10d)."""
    return "keys" if backend == "c10d" and keyed(conf) else "state"


def interval_s(conf: dict[str, str]) -> float:
    return float(with_keep_alive_defaults(conf)["keep_alive_interval"])


def torch_parameters(params: RendezvousParameters) -> RendezvousParameters:
    """The parameters torch's handler is made with: ``params``, with torch's own heartbeats
    off where the keyed liveness replaces them."""
    if not keyed(params.config):
        return params
    off = {"keep_alive_interval": str(TORCH_KEEP_ALIVE_OFF_S), "keep_alive_max_attempt": "1"}
    conf = {**params.config, **off}
    return RendezvousParameters(
        backend=params.backend,
        endpoint=params.endpoint,
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        **conf,
    )


def keyed_liveness_of(handler: RendezvousHandler) -> KeyedLiveness | None:
    """The keyed liveness of the agent's rendezvous stack (None: torch's heartbeats)."""
    ask = getattr(handler, "keyed_liveness", None)
    return ask() if callable(ask) else None


def freshest_peer_beat_age_s(handler: RendezvousHandler) -> float | None:
    """Seconds since the newest heartbeat of another node that this node saw through the
    store: proof that peers reached it."""
    keyed_ = keyed_liveness_of(handler)
    if keyed_ is not None:
        return keyed_.freshest_beat_age_s()
    return compat.freshest_peer_heartbeat_age_s(handler)


def stop_heartbeats(handler: RendezvousHandler) -> None:
    """End this node's heartbeats of a rendezvous it leaves open, without waiting for them:
    torch's keep-alive timer, or the keyed liveness' beats."""
    compat.stop_heartbeats(handler)
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
    if LAST_CALL_KEY not in conf and not compat.set_last_call_timeout(handler, REFORM_LAST_CALL_S):
        log.debug("this torch's rendezvous handler keeps its last call: re-forming waits for it")


class SilentPeers:
    """Members of the running round that the rendezvous dropped for missing heartbeats.

    A member absent from the rendezvous either left it on purpose (a restart: it leaves the
    round and joins the next one, its heartbeat fresh) or was dropped by torch, whose
    heartbeat was then older than the dead-after time: the last heartbeat seen of each
    member tells which.
    """

    def __init__(self, conf: dict[str, str]) -> None:
        self._silent_after_s = dead_after_s(conf) / 2
        self._last_beats: dict[str, datetime] = {}
        self._ids: dict[int, str] = {}  # node rank -> torch's node id, of the round
        self._round = 0  # the state's round number when the round completed
        self._dead_checked_s = 0.0
        self.stopped: set[int] = set()  # of the members lost last, those whose agent stopped
        self._present = compat.StateMemo(compat.present_members)
        self._absent: tuple[dict[int, str], set[str], dict[int, str]] | None = None

    def new_round(self, handler: RendezvousHandler) -> None:
        self._last_beats = compat.heartbeats(handler)
        self._ids = compat.round_node_ids(handler)
        self._round = compat.state_round(handler)

    def lost(self, members: dict[int, str], handler: RendezvousHandler) -> dict[int, str]:
        """Of ``members`` (node rank -> name), those dropped: as of the handler's last sync
        (with the keyed liveness: absent, and said dead by a watcher)."""
        keyed_ = keyed_liveness_of(handler)
        if keyed_ is not None:
            absent = self._absent_members(members, handler)
            now_s = time.monotonic()
            if not absent or now_s - self._dead_checked_s < DEAD_CHECK_S:
                return {}
            self._dead_checked_s = now_s
            ids = [self._ids[rank] for rank in absent if rank in self._ids]
            dead = keyed_.dead(ids, self._round)
            lost = {rank: name for rank, name in absent.items() if self._ids.get(rank) in dead}
            self.stopped = {rank for rank in lost if self._ids.get(rank) in keyed_.stopped}
            return lost
        silent = self._silent(members, handler)
        return {rank: name for rank, name in members.items() if silent.get(name) is False}

    def _absent_members(
        self, members: dict[int, str], handler: RendezvousHandler
    ) -> dict[int, str]:
        """:func:`absent_members`, computed again only when the members or the state changed
        (checked ten times a second: O(N) each time at every node otherwise)."""
        present = self._present(handler)
        last = self._absent
        if last is None or last[0] is not members or last[1] is not present:
            absent = {rank: name for rank, name in members.items() if name not in present}
            self._absent = last = (members, present, absent)
        return last[2]

    def suspects(self, members: dict[int, str], handler: RendezvousHandler) -> bool:
        """Whether a member still in the rendezvous has been silent for a while (its peers'
        failures may be its loss, which the rendezvous tells within seconds)."""
        keyed_ = keyed_liveness_of(handler)
        if keyed_ is not None:
            return keyed_.suspects()
        return any(self._silent(members, handler).values())

    def _silent(self, members: dict[int, str], handler: RendezvousHandler) -> dict[str, bool]:
        """Members silent for half the dead-after time -> whether still in the rendezvous."""
        self._last_beats.update(compat.heartbeats(handler))
        present = compat.present_members(handler)
        now = datetime.now(timezone.utc)
        return {
            name: name in present
            for name in members.values()
            if name in self._last_beats
            and (now - self._last_beats[name]).total_seconds() >= self._silent_after_s
        }


def absent_members(members: dict[int, str], handler: RendezvousHandler) -> dict[int, str]:
    """Members of a round (node rank -> name) that are not in the rendezvous any more."""
    present = compat.present_members(handler)
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
