"""Whether a peer's agent is still there, asked of the peer itself.

torch's rendezvous knows a node is lost only once its heartbeats are stale (10 s by the
agent's defaults: liveness.py), while the peers of a killed node see their ranks fail within
a second. So every agent listens on a port of its own for as long as it runs (at the address
its peers reach it by: listen.py) and publishes it in the rendezvous store, under torch's id
of its node; an agent stopped by a signal replaces it with ``left`` before it stops its
workers. When a node's ranks fail, its agent asks the members that follow it in node-rank
order (at most :data:`PROBED_PEERS`, so each node is asked by that many, whatever the job's
size):

- ``left``: the agent was stopped (a deleted pod, a cancelled step): gone;
- the port refuses a connection: no process holds it any more (the kernel answers for a
  killed agent): gone;
- the port answers, or does not within :data:`PROBE_TIMEOUT_S` (a host cut off or gone with
  its address): nothing is decided here, the heartbeats decide as before.

A gone node is dropped from the rendezvous at once (membership.expire_nodes), so the
survivors re-form without waiting for its heartbeats to go stale.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous import listen
from torchx_elastic.agent.rendezvous.signed_store import SignedStore
from torchx_elastic.contract import PRESENCE_KEY_PREFIX

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0
PROBED_PEERS = 16
LEFT = b"left"


class PresencePort:
    """A port this agent holds open while it runs: connections are accepted and closed."""

    def __init__(self, host: str) -> None:
        """Listening at ``host``'s local address, as the agent's stores (``OSError``)."""
        self._sock = listen.listening_socket(host, 0)
        addr, port = self._sock.getsockname()[:2]
        self.address = f"[{addr}]:{port}" if ":" in str(addr) else f"{addr}:{port}"
        self._thread = threading.Thread(target=self._serve, name="presence", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            conn.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # ends a blocked accept()
        except OSError:
            pass
        self._sock.close()


def key(node_id: str) -> str:
    return f"{PRESENCE_KEY_PREFIX}{node_id}"


def publish(store: SignedStore, node_id: str, port: PresencePort) -> None:
    store.set(key(node_id), port.address)


def say_left(store: SignedStore, node_id: str) -> None:
    """This agent stops: its peers need not wait for its heartbeats to go stale."""
    try:
        store.set(key(node_id), LEFT)
    except Exception as err:  # noqa: BLE001 - the store may be gone with its host
        log.debug("cannot say this node left: %s", err)


def probed(ranks: list[int], own: int, count: int = PROBED_PEERS) -> list[int]:
    """The ranks after ``own`` in ring order, at most ``count`` of them."""
    ordered = sorted(set(ranks) - {own})
    after = [r for r in ordered if r > own] + [r for r in ordered if r < own]
    return after[:count]


def gone_peers(
    store: SignedStore, peers: Mapping[int, str], timeout_s: float = PROBE_TIMEOUT_S
) -> dict[int, str]:
    """Of ``peers`` (node rank -> torch's node id), those whose agent is gone -> why."""
    if not peers:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(peers), PROBED_PEERS)) as pool:
        found = pool.map(lambda rank: (rank, _why_gone(store, peers[rank], timeout_s)), peers)
        return {rank: why for rank, why in found if why is not None}


def _entry(store: SignedStore, node_id: str) -> bytes | None:
    """The node's presence entry; None where there is none (an agent of a version without a
    port, or not published yet), it is refused, or the store does not answer (torch's
    rendezvous tells)."""
    try:
        if not store.store.check([key(node_id)]):
            return None
        return store.get(key(node_id))
    except RefusedEntry as err:
        log.debug("skipped a presence entry: %s", err)
    except Exception as err:  # noqa: BLE001 - the store may be gone
        log.debug("cannot read a presence entry: %s", err)
    return None


def said_left(store: SignedStore, node_id: str) -> bool:
    """Whether the node's agent said, as a signal stopped it, that it left."""
    return _entry(store, node_id) == LEFT


def _why_gone(store: SignedStore, node_id: str, timeout_s: float) -> str | None:
    entry = _entry(store, node_id)
    if entry is None:
        return None
    if entry == LEFT:
        return "its agent was stopped"
    host, _, port = entry.decode().rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return f"its agent is gone (nothing listens on its port {host}:{port} any more)"
    except (OSError, ValueError) as err:
        log.debug("presence of %s at %s: %s", node_id, entry, err)
    return None
