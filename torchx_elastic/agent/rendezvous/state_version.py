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

The blob is also read whole now and then whatever the counter says, at most
:data:`VERIFY_BYTES_PER_S` bytes a second on average (and every :data:`VERIFY_MIN_S` at
least): a state written by something outside the job (which adds nothing to the counter)
is found, refused and said (signed_backend.py) within minutes even in a job of thousands of
nodes, and a write whose writer died before it added to the counter is read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

VERSION_KEY_PREFIX = "torchx_elastic/rendezvous_version/"
VERIFY_MIN_S = 10.0  # the state is read whole this often at most, whatever its size
VERIFY_BYTES_PER_S = 64.0  # and, for a larger state, at this many bytes a second
# torch's c10d backend's words for a store call that failed (the agent's lines strip the
# last sentence: handler.describe_error)
STORE_FAILED = "The connection to the C10d store has failed. See inner exception for details."


def version_key(run_id: str) -> str:
    return f"{VERSION_KEY_PREFIX}{run_id}"


class VersionedBackend(RendezvousBackend):
    """``backend`` (torch's c10d backend, signed where the job has a secret) with its
    state's version counter in ``store``; one call at a time (torch's handler and this
    node's heartbeats share it)."""

    def __init__(
        self,
        backend: RendezvousBackend,
        store: Any,
        run_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._store = store
        self._key = version_key(run_id)
        self._clock = clock
        self._lock = threading.Lock()
        # (the counter when it was read, what get_state() answered then, when it read it)
        self._cached: tuple[int, tuple[bytes, Token] | None, float] | None = None

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
            if cached is not None and cached[0] == version and not self._due(cached):
                return cached[1]
            state = self._backend.get_state()
            self._cached = (version, state, self._clock())
            return state

    def _due(self, cached: tuple[int, tuple[bytes, Token] | None, float]) -> bool:
        """Whether the state is read whole again, whatever the counter says."""
        size = len(cached[1][0]) if cached[1] is not None else 0
        every_s = max(VERIFY_MIN_S, size / VERIFY_BYTES_PER_S)
        return self._clock() - cached[2] >= every_s

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        with self._lock:
            self._cached = None  # the next read reads the state (this one's, or a newer)
            result = self._backend.set_state(state, token)
            if result is not None and result[2]:
                self._add(1)
            return result
