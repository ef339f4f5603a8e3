"""The rendezvous state read only when it changed: one counter read a sync otherwise.

torch's dynamic rendezvous re-reads its whole state blob (every node in it: O(N) bytes) on
every sync that its one-second cache does not serve, so N nodes waiting or training move
O(N^2) bytes a second through the store even when nothing changes. With the agent's keyed
liveness (keyed_liveness.py) the state changes only when membership does; then
:class:`GenerationCachedBackend`, a ``RendezvousBackend`` (torch's public interface) around
the agent's c10d backend, counts every successful write in a counter key beside the state
(:data:`~torchx_elastic.contract.STATE_GENERATION_KEY_PREFIX` + run id) and reads the
blob only when the counter moved since its last read. The handler's syncs ask it first
(:meth:`GenerationCachedBackend.unchanged`, ``compat.tune_state_syncs``), so that an
unchanged state is not unpickled again either: a node's CPU a second stays flat with N.

The counter is read before the blob, and bumped after a write succeeded: a read that races a
write keeps the newer blob under the older count and reads again at the next sync, never the
reverse. Every node of the job writes through this backend; a writer that dies between its
write and the bump leaves the others one membership change behind, until the next write
(its own loss is one). A forged bump only costs a read.

A forged blob written without a bump is not read by a node that reads through the counter:
:meth:`GenerationCachedBackend.audit` reads past it (the keyed liveness has a few nodes of the
job do so every keep-alive interval, whatever its size, on their handler's own backend: the
state it verified last is the newest) and, where the signed backend below refuses what it
read, writes that state back over it and bumps the counter. A lock keeps the audit (on the
liveness' thread) and the handler's reads and writes apart.
"""

from __future__ import annotations

import threading
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from torchx_elastic.contract import STATE_GENERATION_KEY_PREFIX

_UNREAD = object()


class GenerationCachedBackend(RendezvousBackend):
    def __init__(self, backend: RendezvousBackend, store: Any, run_id: str) -> None:
        self._backend = backend
        self._store = store
        self._key = f"{STATE_GENERATION_KEY_PREFIX}{run_id}"
        self._generation = -1
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
            return state

    def unchanged(self, token: Token | None) -> bool:
        """Whether the stored state is still the one this backend last read, and ``token``
        that read's (one counter read): then a handler that holds it need not unpickle it
        again (compat.tune_state_syncs)."""
        with self._lock:
            if self._cached is _UNREAD or self._cached is None or token is None:
                return False
            return token is self._cached[1] and self._add(0) == self._generation

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
