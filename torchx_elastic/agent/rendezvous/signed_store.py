"""Store entries signed with the job's secret: what every agent reads from the store.

Anyone who reaches the store's port can read and write it. Every entry an agent acts on is
written through :meth:`StoreSigner.seal` (an HMAC-SHA256 of the key and the value, keyed by
the job's secret) and read through :meth:`StoreSigner.open`, which refuses what it cannot
verify. :class:`SignedStore` does both around a torch ``Store`` (or a ``PrefixStore`` of a
round): ``set`` and ``compare_set`` sign, ``get``, ``multi_get`` and ``compare_set`` verify (the
caller says what it skipped), ``read`` verifies and logs one warning per refused entry.
:func:`signed_rounds` hands every rendezvous round's store, signed, to a round listener: every
exchange of the agents over the store goes through it. Without a secret (an unauthenticated
job) values pass through unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable
from typing import Any

from torchx_elastic.agent.console.store_entry import RefusedEntry

log = logging.getLogger(__name__)

MAGIC = b"txe1"
_MAC_BYTES = hashlib.sha256().digest_size
REFUSED = (
    "refused %s from the rendezvous store: %s (written by a process outside the job, or by a"
    " node given another secret); it is ignored and the job goes on"
)


class StoreSigner:
    """Signs and verifies store values with the job's secret (None: no authentication)."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self._refused: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def authenticated(self) -> bool:
        return self.secret is not None

    def _mac(self, key: str, value: bytes) -> bytes:
        assert self.secret is not None
        message = MAGIC + key.encode() + b"\0" + value
        return hmac.new(self.secret, message, hashlib.sha256).digest()

    def seal(self, key: str, value: bytes) -> bytes:
        if self.secret is None:
            return value
        return MAGIC + self._mac(key, value) + value

    def open(self, key: str, blob: bytes) -> bytes:
        """The value ``blob`` holds; :class:`RefusedEntry` when it is not the job's."""
        if self.secret is None:
            return blob
        mac, value = blob[len(MAGIC) : len(MAGIC) + _MAC_BYTES], blob[len(MAGIC) + _MAC_BYTES :]
        if not blob.startswith(MAGIC) or len(mac) != _MAC_BYTES:
            raise RefusedEntry(f"{key!r} is not signed")
        if not hmac.compare_digest(mac, self._mac(key, value)):
            raise RefusedEntry(f"{key!r} has a wrong signature")
        return value

    def warn_refused(self, what: str, reason: str, blob: bytes) -> None:
        """One warning per refused value (an agent reads the same entry again and again)."""
        digest = hashlib.sha256(what.encode() + b"\0" + blob).digest()
        with self._lock:
            if digest in self._refused:
                return
            self._refused.add(digest)
        log.warning(REFUSED, what, reason)


class SignedStore:
    """A torch ``Store`` whose values are signed on ``set`` and verified on ``get``.

    ``add`` and ``check`` pass through: counters and presence are hints only (a forged one
    can delay a job, not make an agent act on content)."""

    def __init__(self, store: Any, signer: StoreSigner) -> None:
        self.store = store
        self.signer = signer

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        self.store.set(key, self.signer.seal(key, data))

    def get(self, key: str) -> bytes:
        """The verified value (waits for the key as ``Store.get``); :class:`RefusedEntry`."""
        return self.signer.open(key, bytes(self.store.get(key)))

    def read(self, key: str, what: str) -> bytes | None:
        """The verified value, or None after one warning naming ``what`` was refused."""
        blob = bytes(self.store.get(key))
        try:
            return self.signer.open(key, blob)
        except RefusedEntry as err:
            self.signer.warn_refused(what, str(err), blob)
            return None

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        """torch's ``compare_set`` (``expected_value`` "": the key is not set yet) on signed
        values; the value now held, verified (:class:`RefusedEntry`)."""
        signer = self.signer
        expected = signer.seal(key, expected_value.encode()) if expected_value else b""
        desired = signer.seal(key, desired_value.encode())
        return signer.open(key, bytes(self.store.compare_set(key, expected, desired)))

    def multi_get(self, keys: list[str]) -> list[bytes | RefusedEntry]:
        """The verified values of ``keys`` in one round trip (each waits as ``Store.get``): a
        value that fails verification is its :class:`RefusedEntry`, returned, not raised (one
        forged entry does not hide the others)."""
        values: list[bytes | RefusedEntry] = []
        for key, blob in zip(keys, self.store.multi_get(keys), strict=True):
            try:
                values.append(self.signer.open(key, bytes(blob)))
            except RefusedEntry as err:
                values.append(err)
        return values

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        """``set`` of each key, in one round trip."""
        sealed = [self.signer.seal(k, v.encode()) for k, v in zip(keys, values, strict=True)]
        self.store.multi_set(keys, sealed)

    def add(self, key: str, value: int) -> int:
        return int(self.store.add(key, value))

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(keys))


def signed_rounds(
    on_round: Callable[[Any, int, int], None], signer: StoreSigner
) -> Callable[[Any, int, int], None]:
    """A round listener (store, node rank, nodes) that hands ``on_round`` the signed store."""

    def listener(store: Any, node_rank: int, num_nodes: int) -> None:
        on_round(SignedStore(store, signer), node_rank, num_nodes)

    return listener
