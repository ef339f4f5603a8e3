"""Liveness whose cost per node does not grow with the job: a heartbeat key per node.

- every node writes its own key (:func:`beat_key`: a counter, signed) every
  ``keep_alive_interval``: a plain ``set``, which no other node's write can make fail, on
  a thread and a store connection of its own (handler.py's ``own_connection``), so that
  nothing else the node does (a join that waits) delays its beats;
- every node watches the :data:`WATCHED` nodes after it in the rendezvous' sorted node ids
  (the round's members and the nodes waiting: rounds/handler.py): one ``check`` and one
  ``multi_get`` an interval, and every node is watched by as many peers whatever the job's
  size. A watched key that did not change for ``keep_alive_interval *
  keep_alive_max_attempt`` seconds of the watcher's own clock (no clock skew) is a dead
  node, but only time during which the watcher's own beats reached the store counts: a
  store that paused, or a watcher starved of CPU, accuses nobody (every beat is late then).
  A watched node that missed a beat and whose agent said it stopped (its presence entry is
  ``left``: a deleted pod, a cancelled step; presence.py) is dead at once: its peers need
  not wait for its beats to go stale, nor for their ranks to fail (a pod's network may go
  before its workers' connections close);
- the watcher says so (:func:`dead_key`: ``dead <round>``) and drops the node from the
  rendezvous (rounds/handler.py's ``drop``: never admitted again; the round it was a member
  of re-forms at once). A watched node silent for half that time is counted in
  :func:`suspects_key` meanwhile, which a node whose workers failed reads to wait for the
  verdict (rendezvous/liveness.py's ``SilentPeers``).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous import membership, presence
from torchx_elastic.agent.rendezvous.signed_store import SignedStore
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous
from torchx_elastic.contract import LIVENESS_KEY_PREFIX

log = logging.getLogger(__name__)

WATCHED = 2  # peers each node watches (each node is watched by as many)
STEADY_GAP_INTERVALS = 2.0  # a gap between this node's own beats that long: its store paused
# how long the end of the rendezvous waits for a beat in progress (a thread inside a store
# call as the interpreter exits aborts the process); a lost host's call is not waited for
STOP_WAIT_S = 2.0
DEAD = "dead"
LEFT_WORD = "left"  # a verdict's last word where the node's agent said it stopped


def beat_key(run_id: str, node_id: str) -> str:
    return f"{LIVENESS_KEY_PREFIX}{run_id}/beat/{node_id}"


def dead_key(run_id: str, node_id: str) -> str:
    return f"{LIVENESS_KEY_PREFIX}{run_id}/dead/{node_id}"


def suspects_key(run_id: str) -> str:
    return f"{LIVENESS_KEY_PREFIX}{run_id}/suspects"


def watched_after(node_ids: list[str], me: str, count: int = WATCHED) -> list[str]:
    """The ``count`` ids after ``me`` in ``node_ids`` (sorted), in ring order."""
    others = sorted(set(node_ids) - {me})
    after = [n for n in others if n > me] + [n for n in others if n < me]
    return after[:count]


# the liveness threads of this process: stopped before the interpreter exits, where nothing
# else stopped them (a daemon thread inside a store call as the interpreter finalizes aborts
# the process: "terminate called without an active exception")
_RUNNING: weakref.WeakKeyDictionary[KeyedLiveness, int] = weakref.WeakKeyDictionary()


def _end_running() -> None:
    """The exit hook while beats run (registered only then: a worker forked from a process
    with none sees the atexit handlers a fresh interpreter sees). Stops the beats this
    process started and waits for a tick in progress (never a store call here: a forked
    child's copy of the store's connection is its parent's)."""
    deadline_s = time.monotonic() + STOP_WAIT_S
    for beats in [beats for beats, pid in list(_RUNNING.items()) if pid == os.getpid()]:
        beats.end(deadline_s)


def _running_here(beats: KeyedLiveness | None) -> None:
    """``beats`` started (None: some stopped): the exit hook registered while any of this
    process' beats run, and only then."""
    if beats is not None:
        _RUNNING[beats] = os.getpid()
    atexit.unregister(_end_running)
    if any(pid == os.getpid() for pid in _RUNNING.values()):
        atexit.register(_end_running)


def watch_list(handler: RendezvousHandler) -> tuple[int, list[str]]:
    """The number of nodes in the handler's synced state, and those this node watches."""
    node_ids = membership.state_node_ids(handler)
    me = membership.this_node_id(handler)
    return len(node_ids), watched_after(node_ids, me) if me is not None else []


@dataclasses.dataclass
class _Watched:
    value: bytes | None  # its key's value (None: not written yet)
    changed_s: float  # when this node saw it change (its own monotonic clock)
    suspected: bool = False


class KeyedLiveness:
    """This node's heartbeat key and its watch of the next nodes (see the module's
    docstring). ``handler``: the agent's rendezvous (who is in it; held weakly: the beats
    end with it); ``store``: a connection of the liveness' own, for the beats and verdicts."""

    def __init__(
        self,
        handler: RendezvousHandler,
        store: SignedStore,
        run_id: str,
        interval_s: float,
        dead_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handler = weakref.ref(handler)
        self._store = store
        self._run_id = run_id
        self.interval_s = interval_s
        self.dead_after_s = dead_after_s
        self._clock = clock
        self._seq = 0
        self._last_beat_s: float | None = None
        self._steady_since_s: float | None = None  # this node's beats reached the store since
        self._watched: dict[str, _Watched] = {}
        self._written: set[str] = set()  # beat keys known to be in the store
        self.stopped: set[str] = set()  # nodes whose verdict says their agent was stopped
        self._lock = threading.Lock()  # _watched, read by other threads
        self._stop = threading.Event()
        # the beats on a thread of their own: a look that takes long (a verdict's retried
        # write) never delays them
        self._threads = (
            threading.Thread(target=self._beat_run, name="torchx-elastic-beat", daemon=True),
            threading.Thread(target=self._run, name="torchx-elastic-liveness", daemon=True),
        )

    def start(self) -> KeyedLiveness:
        for thread in self._threads:
            thread.start()
        _running_here(self)
        return self

    def end(self, deadline_s: float) -> None:
        """No more beats; the beat and look in progress waited for until ``deadline_s``
        (monotonic)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(max(0.0, deadline_s - time.monotonic()))

    def stop(self) -> None:
        """No more beats (the node leaves, or its rendezvous moved): its watchers drop it
        after the dead-after time unless it left the rendezvous itself. Waits up to
        :data:`STOP_WAIT_S` for a beat in progress, then takes back this node's suspicions
        from the job's count (left there, every later failure of another node would wait
        the whole dead-after time for a verdict that no watcher gives)."""
        self.end(time.monotonic() + STOP_WAIT_S)
        _RUNNING.pop(self, None)
        _running_here(None)
        with self._lock:
            cleared = sum(seen.suspected for seen in self._watched.values())
            for seen in self._watched.values():
                seen.suspected = False
        if cleared:
            try:
                self._store.add(suspects_key(self._run_id), -cleared)
            except Exception as err:  # noqa: BLE001 - the store is away: nothing to take back
                log.debug("cannot take back this node's suspicions: %s", err)

    def _every_interval(self, step: Callable[[], None]) -> None:
        while not self._stop.is_set():
            started_s = self._clock()
            step()
            self._stop.wait(max(0.0, self.interval_s - (self._clock() - started_s)))

    def _beat_run(self) -> None:
        def step() -> None:
            try:
                me = self._me()
                if me is not None:
                    self.beat(me)
            except Exception as err:  # noqa: BLE001 - the store is away: nobody is accused
                log.debug("liveness beat failed: %s", err)
                self._steady_since_s = None

        self._every_interval(step)

    def _run(self) -> None:
        def step() -> None:
            try:
                self.look()
            except Exception as err:  # noqa: BLE001 - the store is away: nobody is accused
                log.debug("liveness look failed: %s", err)

        self._every_interval(step)

    def _me(self) -> str | None:
        """This node's id; None once the rendezvous is gone (the beats end)."""
        handler = self._handler()
        if handler is None:
            self._stop.set()
            return None
        return membership.this_node_id(handler)

    def tick(self) -> None:
        """One beat of this node and one look (:meth:`look`): the two threads' steps."""
        me = self._me()
        if me is not None:
            self.beat(me)
            self.look()

    def look(self) -> None:
        """One look at the nodes this node watches."""
        handler = self._handler()
        if handler is None or membership.this_node_id(handler) is None:
            return
        _, watched = watch_list(handler)
        self.watch(handler, watched)

    def beat(self, me: str) -> None:
        self._seq += 1
        self._store.set(beat_key(self._run_id, me), str(self._seq))
        now_s = self._clock()
        late = self._last_beat_s is None or (
            now_s - self._last_beat_s > STEADY_GAP_INTERVALS * self.interval_s
        )
        if late or self._steady_since_s is None:
            self._steady_since_s = now_s
        self._last_beat_s = now_s

    def watch(self, handler: RendezvousHandler, watched: list[str]) -> None:
        """One look at the nodes ``watched`` (:func:`watched_after` this node)."""
        values = self._read([beat_key(self._run_id, node) for node in watched])
        now_s = self._clock()
        steady_s = now_s - (self._steady_since_s if self._steady_since_s is not None else now_s)
        dead: list[str] = []
        missed: list[str] = []
        suspected = 0
        with self._lock:
            previous, self._watched = self._watched, {}
            for node, value in zip(watched, values, strict=True):
                seen = previous.get(node)
                if seen is None or seen.value != value:
                    suspected -= seen is not None and seen.suspected
                    self._watched[node] = _Watched(value, now_s)
                    continue
                self._watched[node] = seen
                silent_s = min(now_s - seen.changed_s, steady_s)
                if silent_s >= self.dead_after_s:
                    dead.append(node)
                    continue
                if silent_s >= self.interval_s:
                    missed.append(node)  # a beat missed: did its agent say it stopped?
                if silent_s >= self.dead_after_s / 2 and not seen.suspected:
                    seen.suspected = True
                    suspected += 1
            # a node that left the state since was dropped or left: no longer suspected
            suspected -= sum(s.suspected for n, s in previous.items() if n not in self._watched)
        if suspected:
            self._store.add(suspects_key(self._run_id), suspected)
        # read outside the lock (other threads read the watch): its agent was stopped, so
        # there is no need to wait for its beats to go stale
        left = {node for node in missed if presence.said_left(self._store, node)}
        if dead or left:
            self._drop(handler, [*dead, *sorted(left)], left)

    def _read(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys``; None for one not written yet (never waited for: a key is
        looked for until it is there, then only read)."""
        unknown = [key for key in keys if key not in self._written]
        if unknown and self._store.check(unknown):
            self._written.update(unknown)
        elif unknown:
            self._written.update(key for key in unknown if self._store.check([key]))
        present = [key for key in keys if key in self._written]
        found = dict(zip(present, self._store.multi_get(present), strict=True)) if present else {}
        return [None if isinstance(v, RefusedEntry) else v for v in map(found.get, keys)]

    def _drop(self, handler: RendezvousHandler, dead: list[str], left: set[str]) -> None:
        verdict = f"{DEAD} {membership.state_round(handler)}"
        for node in dead:
            said = f"{verdict} {LEFT_WORD}" if node in left else verdict
            self._store.set(dead_key(self._run_id, node), said)
        dropped = membership.expire_nodes(handler, set(dead), self._store)
        with self._lock:
            cleared = sum(self._watched.pop(node).suspected for node in dead)
        if cleared:
            self._store.add(suspects_key(self._run_id), -cleared)
        log.info(
            "dropped from the rendezvous, silent for %gs or stopped: %s (%s)",
            self.dead_after_s,
            ", ".join(dead),
            "the round re-forms" if dropped else "not members of the round",
        )

    # -- what the supervision loop asks ------------------------------------------------

    def dead(self, node_ids: list[str], since_round: int) -> set[str]:
        """Of ``node_ids``, those a watcher said dead in round ``since_round`` or later (a
        node dropped after a stall that came back keeps its old verdict: a verdict is never
        deleted, so a read that follows a check finds it). None found where the store does
        not answer (its host is lost: the failover's and the network watch's to tell)."""
        found = set()
        for node in self._among_dropped(node_ids):
            key = dead_key(self._run_id, node)
            try:
                if not self._store.check([key]):
                    continue
                word, number, *why = self._store.get(key).decode().split(" ")
                if word == DEAD and number.isdigit() and int(number) >= since_round:
                    found.add(node)
                    if why == [LEFT_WORD]:
                        self.stopped.add(node)
            except Exception as err:  # noqa: BLE001 - refused, unreadable, or the store is away
                log.debug("skipped a liveness verdict: %s", err)
        return found

    def _among_dropped(self, node_ids: list[str]) -> list[str]:
        """Those of ``node_ids`` the rendezvous dropped (its index of verdicts, a few keys per
        verdict): only theirs are read, not every member's. All of them where the index is
        not readable."""
        handler = self._handler()
        try:
            dropped = membership.dropped_ids(handler, self._store) if handler else None
        except Exception as err:  # noqa: BLE001 - the store is away: read each one's
            log.debug("the rendezvous' verdicts are not readable: %s", err)
            return node_ids
        return node_ids if dropped is None else [n for n in node_ids if n in dropped]

    def suspects(self) -> bool:
        """Whether a watcher sees a node silent for half the dead-after time now (False where
        the store does not answer)."""
        try:
            return int(self._store.add(suspects_key(self._run_id), 0)) > 0
        except Exception as err:  # noqa: BLE001 - the store is away: nothing to wait for
            log.debug("suspects unknown: %s", err)
            return False

    def freshest_beat_age_s(self) -> float | None:
        """Seconds since a watched peer's heartbeat last changed (None: none watched yet):
        proof that a peer reached the store."""
        now_s = self._clock()
        with self._lock:
            ages = [now_s - seen.changed_s for seen in self._watched.values() if seen.value]
        return min(ages) if ages else None


class KeyedLivenessRendezvous(WrappedRendezvous):
    """The agent's rendezvous with the keyed liveness beside it (started here, stopped with the
    rendezvous: ``shutdown``, ``abandon``)."""

    def __init__(self, handler: RendezvousHandler, liveness: KeyedLiveness) -> None:
        super().__init__(handler)
        self.liveness = liveness.start()

    def keyed_liveness(self) -> KeyedLiveness | None:
        return self.liveness

    def shutdown(self) -> bool:
        self.liveness.stop()
        return self.handler.shutdown()

    def abandon(self) -> None:
        self.liveness.stop()
        super().abandon()
