"""The workers' store: a fresh ``TCPStore`` hosted by the rank-0 agent for every attempt.

torchrun shares one agent-hosted store with the workers of every attempt
(``TORCHELASTIC_USE_AGENT_STORE=True``) and torch's ``env://`` init connects to it without a
per-attempt key prefix ("We create a new TCPStore for every retry", torch/distributed/
rendezvous.py). A restarted group then reads the keys of the previous attempt (gloo's peer
addresses, init barriers) and connects to dead peers or hangs. This keeps torchrun's worker
environment but makes that promise true: the rank-0 agent hosts a new store for each
attempt and tells the other agents its port through the rendezvous store.
"""

from __future__ import annotations

import datetime

# public API (torch.distributed.TCPStore); torch re-exports it in a way mypy does not see
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from torchx_elastic.agent import compat

WORKER_STORE_KEY = "torchx_elastic/worker_store/"
STORE_TIMEOUT_S = 900.0


class WorkerStoreHost:
    """Where the workers of each round find their store (MASTER_ADDR, MASTER_PORT)."""

    def __init__(self, backend: str) -> None:
        self._backend = backend
        self._store: TCPStore | None = None
        self._rounds = 0

    def address(self, rnd: compat.Round, master_addr: str, master_port: int) -> tuple[str, int]:
        """The store the workers of ``rnd`` use; ``master_addr`` / ``master_port``: the one
        torchrun would give them (the agents' own store with ``static``)."""
        index, self._rounds = self._rounds, self._rounds + 1
        self.close()
        if self._backend == "static" and index == 0:
            return master_addr, master_port  # the agents' store, new for the first attempt
        # a dynamic backend's store is the round's own; static's is the same every round,
        # whose agents restart together (nodes of a static job cannot come and go)
        key = f"{WORKER_STORE_KEY}{index if self._backend == 'static' else 'round'}"
        if rnd.rank == 0:
            store = TCPStore(
                host_name=master_addr,
                port=0,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
            )
            self._store = store
            rnd.store.set(key, f"{master_addr} {store.port}")
            return master_addr, int(store.port)
        addr, port = rnd.store.get(key).decode().rsplit(" ", 1)
        return addr, int(port)

    def close(self) -> None:
        """Stop hosting the previous attempt's store (its workers are gone)."""
        self._store = None
