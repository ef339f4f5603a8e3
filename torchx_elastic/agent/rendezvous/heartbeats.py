"""Each node's liveness at a store cost that does not grow with the number of nodes.

torch's c10d rendezvous keeps every node's last heartbeat in its one state blob, and each
keep-alive rewrites the whole blob with a compare-and-set: every node moves O(N) bytes per
interval, and a heartbeat that keeps losing the race to other nodes' writes looks like a
dead node. Here torch's rendezvous keeps its protocol (its handler joins, leaves, completes
rounds and closes through that blob), with its own keep-alive set so far apart that it
never drops a node (parameters.py), and every node of the rendezvous:

- **beats**: adds one to a key of its own, ``<prefix><run id>/beat/<node>``, every
  ``keep_alive_interval`` (a few bytes), from before it enters the rendezvous state until
  it leaves the rendezvous;
- **watches** the :data:`WATCHED_PEERS` nodes after it on a ring of every node in the state
  (ordered by a hash of their keys, so that the nodes of one rack are not neighbours):
  their beat keys in one ``multi_get`` per interval;
- **finds a watched node lost** when its beat did not advance over
  ``keep_alive_max_attempt`` of this node's reads, one interval apart, that span the
  dead-after time (interval x attempts): from what that node did, never from whether a
  write of its won a race. A store that pauses holds this node's reads too: a pause of any
  length costs one read, not a drop. The nearest watcher acts at the dead-after time, the
  next one an interval later if the node is still there;
- **removes it** from torch's state with one compare-and-set (torch's own removal of an
  expired node, agent/compat.py), tried again up to :data:`CAS_TRIES` times after a random
  delay of up to ``cas_backoff_max_seconds`` when another write came first. The
  membership changed: the survivors re-form as with torch's own removal;
- **marks** the lost node (``dropped/<node>``, deleted by that node when it joins again)
  so that the survivors tell its loss from a member that left the round on purpose, and
  counts the members of the complete round it has seen silent for half the dead-after
  time (``suspects/<round>``): a node whose ranks failed waits for the verdict while that
  count is not zero (liveness.py).

Steady state, per node and interval: one ``add`` (its beat), one ``multi_get`` of three
small keys, one ``add`` that reads the state's version (state_version.py); nothing that
grows with N. The state blob is written when the membership changes only.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

from torchx_elastic.agent import compat

log = logging.getLogger(__name__)

T = TypeVar("T")
KEY_PREFIX = "torchx_elastic/liveness/"
WATCHED_PEERS = 3  # each node watches that many; each node is watched by that many
CAS_TRIES = 4  # compare-and-sets of one removal, each after a random delay
DEFAULT_BACKOFF_MAX_S = 0.25
QUERY_WAIT_S = 2.0  # the supervision loop's questions wait that long for the store at most


def beat_key(run_id: str, node: str) -> str:
    return f"{KEY_PREFIX}{run_id}/beat/{node}"


def dropped_key(run_id: str, node: str) -> str:
    return f"{KEY_PREFIX}{run_id}/dropped/{node}"


def suspects_key(run_id: str, round_: int) -> str:
    return f"{KEY_PREFIX}{run_id}/suspects/{round_}"


def _ring_position(node: str) -> tuple[bytes, str]:
    return hashlib.sha1(node.encode()).digest(), node  # noqa: S324 (an order, not a secret)


def ring_after(nodes: Iterable[str], me: str, count: int) -> list[str]:
    """The ``count`` nodes after ``me`` on the ring of ``nodes`` and ``me``."""
    order = sorted({*nodes, me}, key=_ring_position)
    at = order.index(me)
    return (order[at + 1 :] + order[:at])[:count]


@dataclass(frozen=True)
class Timing:
    """The liveness rule: a beat every ``interval_s``, lost after ``max_attempt`` reads
    without one (``--rdzv-conf keep_alive_interval / keep_alive_max_attempt``)."""

    interval_s: float
    max_attempt: int
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S

    @property
    def dead_after_s(self) -> float:
        return self.interval_s * self.max_attempt


@dataclass
class _Watched:
    """A watched node's beat as this node read it."""

    value: bytes
    since_s: float  # when this node saw it change last (or read it first)
    reads: int = 0  # reads since then that found it unchanged
    suspected_in: int | None = None  # the round whose suspects count counts it


def _beat_until_stopped(
    ref: weakref.ref[Heartbeats],
    stopped: threading.Event,
    interval_s: float,
    clock: Callable[[], float],
) -> None:
    """The heartbeats' thread: a tick every interval until stopped (or the heartbeats are
    gone: it holds them weakly, as torch's keep-alive timer holds its handler)."""
    wait_s = interval_s
    while not stopped.wait(wait_s):
        beats = ref()
        if beats is None:
            return
        started_s = clock()
        try:
            beats.tick()
        except Exception as err:  # noqa: BLE001 - the store is away: the next tick
            log.debug("rendezvous heartbeat failed: %s", err)
        del beats
        wait_s = max(0.0, interval_s - (clock() - started_s))


class Heartbeats:
    """This node's beat and its watch of its ring neighbours (see the module's docstring).

    ``backend``: the rendezvous state as torch's handler reads and writes it (a
    :class:`~torchx_elastic.agent.rendezvous.state_version.VersionedBackend`: a read of an
    unchanged state costs a few bytes); ``settings``: torch's ``RendezvousSettings`` of the
    handler (its epilogue of a removed participant reads them)."""

    def __init__(
        self,
        store: Any,
        backend: RendezvousBackend,
        run_id: str,
        node: str,
        settings: Any,
        timing: Timing,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._backend = backend
        self._run_id = run_id
        self.node = node
        self._settings = settings
        self.timing = timing
        self._clock = clock
        self._sleep = sleep
        self._watched: dict[str, _Watched] = {}
        self._existing: set[str] = set()  # beat keys known to be there (never deleted)
        self._view: tuple[Any, compat.RendezvousView | None] = (None, None)
        self._heard_s: float | None = None  # when a watched beat advanced last
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._queries = ThreadPoolExecutor(1, thread_name_prefix="rendezvous-liveness")
        # a rendezvous dropped without a shutdown (a test's, a moved one's) beats no more
        weakref.finalize(self, self._stopped.set)

    # -- this node's thread ---------------------------------------------------------------

    def start(self) -> None:
        """Beat now (before this node enters the rendezvous state, so that its watchers
        find its key), then every interval on a thread of its own; once."""
        with self._lock:
            if self._thread is not None or self._stopped.is_set():
                return
            self.beat()
            self._thread = threading.Thread(
                target=_beat_until_stopped,
                args=(weakref.ref(self), self._stopped, self.timing.interval_s, self._clock),
                name="rendezvous-heartbeats",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        """No more beats nor watch (this node leaves the rendezvous): without waiting for a
        call that waits on a lost store."""
        self._stopped.set()
        self._queries.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> None:
        """One interval: this node's beat, then its watch."""
        self.beat()
        self.watch()

    def beat(self) -> None:
        self._store.add(beat_key(self._run_id, self.node), 1)

    def watch(self) -> None:
        """Read the beats of the nodes this node watches; remove those lost."""
        view = self._read_view()
        if view is None or view.closed or self.node not in view.nodes:
            self._forget(set())  # a closed rendezvous takes nobody; out of it: no watch
            return
        targets = ring_after(view.nodes, self.node, WATCHED_PEERS)
        self._forget(set(targets))
        if not targets:
            return
        values = self._read_beats(targets)
        now_s = self._clock()
        lost = [
            node
            for distance, (node, value) in enumerate(zip(targets, values, strict=True), start=1)
            if self._observe(node, value, now_s, distance, view)
        ]
        if lost:
            self._remove(lost)

    def _read_view(self) -> compat.RendezvousView | None:
        state = self._backend.get_state()
        if state is None:
            return None
        if state is not self._view[0]:  # the versioned backend hands back the same state
            self._view = (state, compat.rendezvous_view(state[0]))
        return self._view[1]

    def _read_beats(self, targets: list[str]) -> list[bytes]:
        """The beats of ``targets``, in one ``multi_get`` (b"" for a key not there: a node
        that never beat; ``multi_get`` would wait for it)."""
        keys = {node: beat_key(self._run_id, node) for node in targets}
        for key in keys.values():
            if key not in self._existing and self._store.check([key]):
                self._existing.add(key)
        present = [node for node in targets if keys[node] in self._existing]
        values = compat.multi_get(self._store, [keys[node] for node in present])
        found = dict(zip(present, values, strict=True))
        return [found.get(node, b"") for node in targets]

    def _observe(
        self, node: str, value: bytes, now_s: float, distance: int, view: compat.RendezvousView
    ) -> bool:
        """Whether ``node`` (the ``distance``-th after this one) is lost, by its beat."""
        seen = self._watched.get(node)
        if seen is None or seen.value != value:
            if seen is not None:
                self._heard_s = now_s
                self._unsuspect(seen)
            self._watched[node] = _Watched(value, now_s)
            return False
        seen.reads += 1
        timing = self.timing
        silent_s = now_s - seen.since_s
        late_s = (distance - 1) * timing.interval_s  # the nearest watcher acts first
        if seen.reads >= timing.max_attempt + distance - 1 and silent_s >= (
            timing.dead_after_s + late_s
        ):
            return True
        if silent_s >= timing.dead_after_s / 2 and view.complete and node in view.participants:
            self._suspect(seen, view.round)
        return False

    def _remove(self, lost: list[str]) -> None:
        """Mark the lost nodes, then take them out of torch's state."""
        keys = [dropped_key(self._run_id, node) for node in lost]
        compat.multi_set(self._store, keys, [self._watched[node].value for node in lost])
        if not self._cas_without(set(lost)):
            log.debug("could not remove %s from the rendezvous yet", lost)
            return  # the next interval tries again, if they are still silent
        for node in lost:
            self._unsuspect(self._watched.pop(node))
        log.info("rendezvous: no heartbeat from %s: removed from the rendezvous", ", ".join(lost))

    def _cas_without(self, nodes: set[str]) -> bool:
        """Whether torch's state is without ``nodes`` (this node's write, or another's)."""
        for attempt in range(CAS_TRIES):
            if attempt:
                self._sleep(random.uniform(0, self.timing.backoff_max_s))  # noqa: S311
            current = self._backend.get_state()
            if current is None:
                return True
            state = compat.without_nodes(current[0], nodes, self._settings)
            if state is None:
                return True
            written = self._backend.set_state(state, current[1])
            if written is not None and written[2]:
                return True
        return False

    def _suspect(self, seen: _Watched, round_: int) -> None:
        if seen.suspected_in == round_:
            return
        self._unsuspect(seen)
        self._store.add(suspects_key(self._run_id, round_), 1)
        seen.suspected_in = round_

    def _unsuspect(self, seen: _Watched) -> None:
        if seen.suspected_in is not None:
            self._store.add(suspects_key(self._run_id, seen.suspected_in), -1)
            seen.suspected_in = None

    def _forget(self, keep: set[str]) -> None:
        for node in [n for n in self._watched if n not in keep]:
            self._unsuspect(self._watched.pop(node))

    # -- what the others ask ------------------------------------------------------------

    def rejoin(self) -> None:
        """This node joins a round: a mark that it was lost (it was, and is back) goes."""
        self._store.delete_key(dropped_key(self._run_id, self.node))

    def freshest_peer_beat_age_s(self) -> float | None:
        """Seconds since this node saw a watched node's beat advance (None: never yet)."""
        heard_s = self._heard_s
        return None if heard_s is None else max(0.0, self._clock() - heard_s)

    def dropped(self, nodes: set[str]) -> set[str] | None:
        """Of ``nodes``, those a watcher found lost (and that did not join again since);
        None when the store did not answer within :data:`QUERY_WAIT_S`."""
        return self._ask(
            lambda: {n for n in nodes if self._store.check([dropped_key(self._run_id, n)])}
        )

    def suspected(self, round_: int) -> bool | None:
        """Whether a watcher has seen a member of ``round_`` silent for half the dead-after
        time (and not heard it since); None when the store did not answer in time."""
        return self._ask(lambda: int(self._store.add(suspects_key(self._run_id, round_), 0)) > 0)

    def _ask(self, query: Callable[[], T]) -> T | None:
        """``query`` on a thread of its own: a store that does not answer (its host is
        lost) keeps that thread, not the caller (the supervision loop)."""
        try:
            future = self._queries.submit(query)
        except RuntimeError:  # stopped
            return None
        try:
            return future.result(timeout=QUERY_WAIT_S)
        except Exception as err:  # noqa: BLE001 - the store is away: not known
            log.debug("rendezvous liveness query failed: %s", err)
            return None
