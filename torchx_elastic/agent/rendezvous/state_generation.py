"""The rendezvous state read only when it changed: one counter read a sync otherwise.

torch's dynamic rendezvous re-reads its whole state blob (every node in it: O(N) bytes) on
every sync that its one-second cache does not serve, so N nodes waiting or training move
O(N^2) bytes a second through the store even when nothing changes. With the agent's keyed
liveness (keyed_liveness.py) the state changes only when membership does; then
:class:`GenerationCachedBackend`, a ``RendezvousBackend`` (torch's public interface) around
the agent's c10d backend, counts every successful write in a counter key beside the state
(:data:`~torchx_elastic.contract.STATE_GENERATION_KEY_PREFIX` + run id) and reads the
blob only when the counter moved since its last read. The handler's syncs ask it first
(:meth:`GenerationCachedBackend.must_read`, ``compat.tune_state_syncs``), so that an
unchanged state is not unpickled again either: a node's CPU a second stays flat with N.

The counter is read before the blob, and bumped after a write succeeded: a read that races a
write keeps the newer blob under the older count and reads again at the next sync, never the
reverse. Every node of the job writes through this backend; a writer that dies between its
write and the bump leaves the others one membership change behind, until the next write
(its own loss is one). A forged bump only costs a read.

While a round forms or re-forms the state changes with every join, so every waiting node
would still read the whole blob once a second (torch's poll): N reads of O(N) bytes a second.
Writers therefore also mark the moves a waiting node must see at once: a write that changed
the state's round, its completion or its closing adds :data:`ROUND_STEP` to the counter too
(:meth:`GenerationCachedBackend.mark_round_moved`, ``compat.tune_state_syncs``). A node whose
counter moved by membership alone reads the blob again only once a read of its size is due
(:meth:`GenerationCachedBackend.must_read`: at most :data:`STATE_READ_BYTES_PER_S` bytes a
second; a state of up to that many bytes, 150 to 180 nodes, is read once a second as torch
reads it, one of 1,000 nodes with pod names, about 100 KB, every 6 s): it learns of a
completed or new round within a second at any N, and of nodes that came or went up to that
spacing later (a slow node's view, which torch's protocol allows for: a write from a stale
view fails its compare-and-set and reads the state the write met).

A forged blob written without a bump is not read by a node that reads through the counter:
:meth:`GenerationCachedBackend.audit` reads past it (the keyed liveness has a few nodes of the
job do so every keep-alive interval, whatever its size, on their handler's own backend: the
state it verified last is the newest) and, where the signed backend below refuses what it
read, writes that state back over it and bumps the counter. A lock keeps the audit (on the
liveness' thread) and the handler's reads and writes apart.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from torchx_elastic.contract import STATE_GENERATION_KEY_PREFIX

_UNREAD = object()

# the counter's part that counts the moves of rounds (its low 32 bits count writes)
ROUND_STEP = 1 << 32
# a node reads a changed state again by membership alone at most this fast (bytes a second)
STATE_READ_BYTES_PER_S = 16 * 1024


class GenerationCachedBackend(RendezvousBackend):
    def __init__(
        self,
        backend: RendezvousBackend,
        store: Any,
        run_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._store = store
        self._key = f"{STATE_GENERATION_KEY_PREFIX}{run_id}"
        self._generation = -1  # the counter as the blob was last read
        self._seen = -1  # the counter as last read
        self._read_at = float("-inf")  # when the blob was last read (monotonic)
        self._cached: Any = _UNREAD
        self._lock = threading.RLock()

    @property
    def name(self) -> str:
        return self._backend.name

    def _add(self, amount: int) -> int:
        """The counter, moved by ``amount``; a store error as torch's c10d backend raises it
        (``RendezvousConnectionError``), which the agent's layers above expect."""
        try:
            return int(self._store.add(self._key, amount))
        except SignalException:
            raise  # a stop signal that came during the call: the agent stops, as torch's does
        except Exception as err:
            raise RendezvousConnectionError(
                "The connection to the C10d store has failed. See inner exception for details."
            ) from err

    def get_state(self) -> tuple[bytes, Token] | None:
        with self._lock:
            generation = self._add(0)
            if self._cached is not _UNREAD and generation == self._generation:
                return self._cached  # type: ignore[no-any-return]
            state = self._backend.get_state()
            self._generation, self._cached = generation, state
            self._seen, self._read_at = generation, self._clock()
            return state

    def unchanged(self, token: Token | None) -> bool:
        """Whether the stored state is still the one this backend last read, and ``token``
        that read's (one counter read): then a handler that holds it need not unpickle it
        again (compat.tune_state_syncs)."""
        with self._lock:
            if self._cached is _UNREAD or self._cached is None or token is None:
                return False
            self._seen = self._add(0)
            return token is self._cached[1] and self._seen == self._generation

    def must_read(self, token: Token | None) -> bool:
        """Whether a handler that holds the state of ``token`` must read the stored state
        now: it changed since this backend read it, and a round moved (the round, its
        completion or closing: :meth:`mark_round_moved`) or a read of the state's size is
        due (:data:`STATE_READ_BYTES_PER_S`)."""
        with self._lock:
            if self.unchanged(token):
                return False
            if self._cached is _UNREAD or self._cached is None or token is not self._cached[1]:
                return True
            if self._seen // ROUND_STEP != self._generation // ROUND_STEP:
                return True
            spacing_s = len(self._cached[0]) / STATE_READ_BYTES_PER_S
            # torch polls once a second: a smaller state is read as torch reads it
            return spacing_s <= 1.0 or self._clock() - self._read_at >= spacing_s

    def round_mark(self) -> int:
        """The counter's round part (one read): it changes when a write moved a round."""
        return self._add(0) // ROUND_STEP

    def held_round_mark(self) -> int:
        """The round part of the counter as read before the state was last read (no store
        call; -1 before the first read): what a handler holds is at least that new, so a
        round moved since it was read where :meth:`round_mark` says more."""
        return -1 if self._generation < 0 else self._generation // ROUND_STEP

    def mark_round_moved(self) -> None:
        """Tell every node that reads through a counter: this node's last write moved a round
        (they read the state at their next sync)."""
        with self._lock:
            self._add(ROUND_STEP)

    def audit(self) -> bool:
        """The state read past the counter; a refused one (forged, replayed) replaced by the
        newest state verified here (the counter's first: that node's handler reads it through
        this backend) and the counter bumped, so that every node reads the repaired state.
        Whether it wrote; False where the state is not signed (nothing is verified: a job
        without a secret)."""
        repair = getattr(self._backend, "repair", None)
        if repair is None:
            return False
        with self._lock:
            self.get_state()
            if not repair():
                return False
            self._cached = _UNREAD
            self._add(1)
            return True

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        with self._lock:
            self._cached = _UNREAD
            result = self._backend.set_state(state, token)
            if result is not None and result[2]:
                self._add(1)
            return result
