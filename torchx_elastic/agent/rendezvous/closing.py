"""The end of a job (it succeeded, or failed for good): the agent that hosts the rendezvous
store leaves last.

Every node shuts its rendezvous down at the end (torch's ``shutdown()`` writes the closed
state into the store). A node whose store host exited first fails that write, and torch
prints a C++ trace and a ``failed to shutdown the rendezvous`` warning on a job that
succeeded (2 runs in 3 of a ``-j 2x2`` local job). So each node, once done with the store,
counts itself out in the last round's store, and the host waits (a bounded time) until
every node of that round has; the others never wait, so none of them reads the store while
its host leaves (torch's agents wait for each other in an exit barrier instead). A store
that goes away under a running node therefore means that its host's agent died: the
survivors move the rendezvous (failover.py).
"""

from __future__ import annotations

import logging
import time

from torchx_elastic.agent import compat
from torchx_elastic.contract import LEFT_KEY

log = logging.getLogger(__name__)

WAIT_S = 10.0  # a peer that never counts itself out (it died at its end) delays the host
POLL_S = 0.02


def leave_last(rnd: compat.Round | None, hosts_store: bool, wait_s: float = WAIT_S) -> None:
    """Count this node out of ``rnd`` (its last round); the store's host waits for the rest."""
    if rnd is None:
        return
    try:
        left = int(rnd.store.add(LEFT_KEY, 1))
        deadline = time.monotonic() + wait_s
        while hosts_store and left < rnd.world_size and time.monotonic() < deadline:
            time.sleep(POLL_S)
            left = int(rnd.store.add(LEFT_KEY, 0))
    except Exception as err:  # noqa: BLE001 - the store is gone: nothing left to wait for
        log.debug("leaving the rendezvous store: %s", err)
