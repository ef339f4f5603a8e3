"""torch's rendezvous backend whose state is read again only after it changed.

torch's c10d rendezvous keeps one state blob holding every node (its size grows with the
number of nodes), and each node's handler reads it whole at every sync: at least once a
second while the agent checks for waiting nodes. :class:`VersionedBackend` is a
``RendezvousBackend`` (torch's public interface) around the job's backend that keeps a
small counter next to the blob: every write of the state that succeeded adds one to it,
and a read first reads the counter (a few bytes) and hands back the state it read last
while the counter has not moved. The blob itself crosses the network only when the
membership changed (a node joined, left, or was found lost: rendezvous/heartbeats.py),
not at every check.

A write always goes to the store (a compare-and-set against the state this node holds:
one that another node changed meanwhile fails and hands back the current state, as in
torch). The counter is added to after the write: a reader that reads it between the two
reads the new state at its next read, once the counter moved.
"""

from __future__ import annotations

import threading
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

VERSION_KEY_PREFIX = "torchx_elastic/rendezvous_version/"
# torch's c10d backend's words for a store call that failed (the agent's lines strip the
# last sentence: handler.describe_error)
STORE_FAILED = "The connection to the C10d store has failed. See inner exception for details."


def version_key(run_id: str) -> str:
    return f"{VERSION_KEY_PREFIX}{run_id}"


class VersionedBackend(RendezvousBackend):
    """``backend`` (torch's c10d backend, signed where the job has a secret) with its
    state's version counter in ``store``; one call at a time (torch's handler and this
    node's heartbeats share it)."""

    def __init__(self, backend: RendezvousBackend, store: Any, run_id: str) -> None:
        self._backend = backend
        self._store = store
        self._key = version_key(run_id)
        self._lock = threading.Lock()
        # (the counter when it was read, what get_state() answered then)
        self._cached: tuple[int, tuple[bytes, Token] | None] | None = None

    @property
    def name(self) -> str:
        return self._backend.name

    def _add(self, amount: int) -> int:
        """The counter plus ``amount``; a store that failed raises torch's
        ``RendezvousConnectionError``, as torch's c10d backend does for the state."""
        try:
            return int(self._store.add(self._key, amount))
        except (ValueError, RuntimeError, TimeoutError) as err:
            raise RendezvousConnectionError(STORE_FAILED) from err

    def get_state(self) -> tuple[bytes, Token] | None:
        with self._lock:
            version = self._add(0)
            cached = self._cached
            if cached is not None and cached[0] == version:
                return cached[1]
            state = self._backend.get_state()
            self._cached = (version, state)
            return state

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        with self._lock:
            self._cached = None  # the next read reads the state (this one's, or a newer)
            result = self._backend.set_state(state, token)
            if result is not None and result[2]:
                self._add(1)
            return result
