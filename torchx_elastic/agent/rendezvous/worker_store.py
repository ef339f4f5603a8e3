"""The workers' store: a fresh ``TCPStore`` hosted by the rank-0 agent for every attempt.

torchrun shares one agent-hosted store with the workers of every attempt
(``TORCHELASTIC_USE_AGENT_STORE=True``) and torch's ``env://`` init connects to it without a
per-attempt key prefix ("We create a new TCPStore for every retry", torch/distributed/
rendezvous.py). A restarted group then reads the keys of the previous attempt (gloo's peer
addresses, init barriers) and connects to dead peers or hangs. This keeps torchrun's worker
environment but makes that promise true: the rank-0 agent hosts a new store for each
attempt and tells the other agents its port through the rendezvous store (signed with the
job's secret), listening on the peers' address only (on loopback for a single-host job).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousError

from torchx_elastic.agent import compat
from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous import listen
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.contract import WORKER_STORE_KEY

STORE_TIMEOUT_S = 900.0


class WorkerStoreHost:
    """Where the workers of each round find their store (MASTER_ADDR, MASTER_PORT)."""

    def __init__(self, backend: str, signer: StoreSigner, single_host: bool = False) -> None:
        self._backend = backend
        self._signer = signer
        self._single_host = single_host  # every node reaches rank 0 over loopback
        self._store: Any = None
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
        shared = SignedStore(rnd.store, self._signer)
        if rnd.rank == 0:
            host = listen.LOOPBACK if self._single_host else master_addr
            store = listen.hosted_store(host, 0, STORE_TIMEOUT_S)
            self._store = store
            if self._single_host and not listen.is_loopback_host(master_addr):
                master_addr = listen.LOOPBACK  # the workers reach it where it listens
            shared.set(key, f"{master_addr} {store.port}")  # type: ignore[attr-defined]
            return master_addr, int(store.port)  # type: ignore[attr-defined]
        try:
            addr, port = shared.get(key).decode().rsplit(" ", 1)
        except RefusedEntry as err:  # someone outside the job replaced it: nothing to start
            raise RendezvousError(f"refused the workers' store address: {err}") from None
        return addr, int(port)

    def close(self) -> None:
        """Stop hosting the previous attempt's store (its workers are gone)."""
        self._store = None
