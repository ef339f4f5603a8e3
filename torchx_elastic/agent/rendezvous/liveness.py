"""Peers that stopped answering: the agent's heartbeats of a c10d rendezvous, or torch's own.

A host that vanished sends no TCP reset, so its peers' collectives would wait for it for as
long as the process group's timeout (30 minutes for gloo); the survivors stop their workers
instead and re-form without it, once the rendezvous has found it lost and removed it.

On the c10d rendezvous over TCP, the agent's own heartbeats keep the liveness
(heartbeats.py: a key per node and a watch of three ring neighbours, so that a node's store
traffic does not grow with the number of nodes): :class:`BeatingRendezvous` runs them under
torch's handler, whose own keep-alive is set so far apart (:data:`TORCH_KEEP_ALIVE`) that
torch never drops a node itself. A watcher that finds a node lost marks it and removes it
from torch's state; the survivors read the mark. With another backend, torch's handler
sends this node's heartbeat through the rendezvous state every ``keep_alive_interval`` and,
on every sync, drops a node whose last heartbeat is older than ``keep_alive_interval *
keep_alive_max_attempt`` (``DynamicRendezvousHandler._keep_alive``,
``_RendezvousStateHolder._sanitize``); the agent reads that verdict from the state.

Defaults, where ``--rdzv-conf`` does not set them (torch's are 5 s x 3 and a 30 s last
call): a heartbeat every 2 s, a node dead after 5 missed ones (10 s), and a last call of
3 s for the rounds after the first, when the nodes that re-form are already there.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
)

from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous.heartbeats import DEFAULT_BACKOFF_MAX_S, Heartbeats, Timing
from torchx_elastic.agent.rendezvous.state_version import STORE_FAILED
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous

log = logging.getLogger(__name__)

KEEP_ALIVE_DEFAULTS = {"keep_alive_interval": "2", "keep_alive_max_attempt": "5"}
# torch's keep-alive under the agent's heartbeats: a heartbeat in its state once a day, a
# node it would drop itself after ten years of silence (never)
TORCH_KEEP_ALIVE = {"keep_alive_interval": "86400", "keep_alive_max_attempt": "3650"}
CAS_BACKOFF_KEY = "cas_backoff_max_seconds"
LAST_CALL_KEY = "last_call_timeout"
REFORM_LAST_CALL_S = 3.0


def with_keep_alive_defaults(conf: dict[str, str]) -> dict[str, str]:
    """``--rdzv-conf`` with the agent's keep-alive defaults where it gives none."""
    return {**KEEP_ALIVE_DEFAULTS, **conf}


def dead_after_s(conf: dict[str, str]) -> float:
    """How long a node may miss heartbeats before the rendezvous drops it."""
    full = with_keep_alive_defaults(conf)
    return float(full["keep_alive_interval"]) * float(full["keep_alive_max_attempt"])


def timing(conf: dict[str, str]) -> Timing:
    """The agent's heartbeats' rule from ``--rdzv-conf`` (its defaults where none given)."""
    full = with_keep_alive_defaults(conf)
    return Timing(
        float(full["keep_alive_interval"]),
        int(full["keep_alive_max_attempt"]),
        float(full.get(CAS_BACKOFF_KEY, DEFAULT_BACKOFF_MAX_S)),
    )


class BeatingRendezvous(WrappedRendezvous):
    """torch's c10d handler (its keep-alive quiet) with the agent's heartbeats: they beat
    from the first round this node joins until it leaves the rendezvous (``shutdown``, or
    ``abandon`` for a moved one)."""

    def __init__(self, handler: RendezvousHandler, beats: Heartbeats) -> None:
        super().__init__(handler)
        self._beats = beats

    def next_rendezvous(self) -> RendezvousInfo:
        try:
            self._beats.start()
            self._beats.rejoin()
        except (ValueError, RuntimeError, TimeoutError) as err:  # as torch's c10d backend
            raise RendezvousConnectionError(STORE_FAILED) from err
        return self.handler.next_rendezvous()

    def shutdown(self) -> bool:
        try:
            return self.handler.shutdown()
        finally:
            self._beats.stop()

    def abandon(self) -> None:
        self._beats.stop()
        super().abandon()

    def heartbeats(self) -> Heartbeats | None:
        return self._beats


def _agent_heartbeats(handler: RendezvousHandler) -> Heartbeats | None:
    return handler.heartbeats() if isinstance(handler, WrappedRendezvous) else None


def shorten_reform_last_call(handler: RendezvousHandler, conf: dict[str, str]) -> None:
    """After the first round, re-form in :data:`REFORM_LAST_CALL_S` (unless
    ``last_call_timeout`` was given): the nodes of a restart or of a new member are there
    within a second of each other, and a lost node is not coming back to this round."""
    if LAST_CALL_KEY not in conf and not compat.set_last_call_timeout(handler, REFORM_LAST_CALL_S):
        log.debug("this torch's rendezvous handler keeps its last call: re-forming waits for it")


class SilentPeers:
    """Members of the running round that the rendezvous dropped for missing heartbeats.

    A member absent from the rendezvous either left it on purpose (a restart: it leaves the
    round and joins the next one, its heartbeat fresh) or was dropped, silent for the
    dead-after time. Under the agent's heartbeats, the mark of its watcher tells which
    (heartbeats.py); under torch's keep-alive, the last heartbeat seen of each member.
    """

    def __init__(self, conf: dict[str, str]) -> None:
        self._silent_after_s = dead_after_s(conf) / 2
        self._last_beats: dict[str, datetime] = {}
        self._keys: dict[str, str] = {}  # member name -> its node key, of the round

    def new_round(self, handler: RendezvousHandler) -> None:
        self._last_beats = compat.heartbeats(handler)
        self._keys = compat.node_keys(handler)

    def lost(self, members: dict[int, str], handler: RendezvousHandler) -> dict[int, str]:
        """Of ``members`` (node rank -> name), those dropped: as of the handler's last sync."""
        beats = _agent_heartbeats(handler)
        if beats is not None:
            absent = absent_members(members, handler)
            if not absent:
                return {}
            keys = {name: self._keys[name] for name in absent.values() if name in self._keys}
            dropped = beats.dropped(set(keys.values())) or set()
            return {rank: name for rank, name in absent.items() if keys.get(name) in dropped}
        silent = self._silent(members, handler)
        return {rank: name for rank, name in members.items() if silent.get(name) is False}

    def suspects(self, members: dict[int, str], handler: RendezvousHandler) -> bool:
        """Whether a member still in the rendezvous has been silent for a while (its peers'
        failures may be its loss, which the rendezvous tells within seconds)."""
        beats = _agent_heartbeats(handler)
        if beats is not None:
            round_ = compat.rendezvous_round(handler)
            return round_ is not None and bool(beats.suspected(round_))
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


def lost_peer_line(lost: dict[int, str], conf: dict[str, str]) -> str:
    return (
        f"torchx-elastic: {', '.join(node_names(lost))} stopped answering (no rendezvous"
        f" heartbeat for {dead_after_s(conf):g}s): stopping the workers and re-forming without it"
    )


def dropped_line(conf: dict[str, str]) -> str:
    return (
        "torchx-elastic: the other nodes dropped this node from the rendezvous (they saw no"
        f" heartbeat from it for {dead_after_s(conf):g}s: its agent was stalled or starved of"
        " CPU) and went on without it: stopping its workers and joining again"
    )
