"""One restart budget for the job, not one per node (torch issue 108158).

torchrun's agents each count their own restarts: a node that joins late (a replaced pod, a
rejoining node) starts again from ``--max-restarts``, and its workers'
``TORCHELASTIC_RESTART_COUNT`` says 0 while the others say 3. Here the job's count lives in
the rendezvous store, as one integer under :data:`SPENT_KEY` (without the round's prefix, so
it outlives the rounds), and only ever grows:

- before joining a round, each node raises it to what the node knows (a compare-and-set
  loop: the larger value wins);
- once the round is complete, each node takes the stored value if it is larger: every member
  raised it before the round could complete, so every member reads at least the largest;
- a failed attempt adds one on every node alike (each node raises the store to its new count,
  so a node that joins before the next round learns it).

A restart for a membership change (a node lost or added) costs nothing, as before. A store
that cannot be reached (its host lost: the rendezvous moves, with a new store) leaves the
node's own count, which the next round's raise carries into the new store.

The value is a plain integer (what ``add`` keeps), not signed as the rendezvous' entries are:
it carries no code, and whoever can write the store can end the job anyway.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger(__name__)

SPENT_KEY = "torchx_elastic/restarts_spent"
_MAX_TRIES = 16  # compare-and-set races with the other nodes' raises; each loser rereads


class CounterStore(Protocol):
    """The part of ``torch.distributed.Store`` used here."""

    def add(self, key: str, value: int) -> int: ...

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...


def raise_to(store: CounterStore | None, known: int) -> int | None:
    """Raise the job's count to ``known`` unless it is larger already; the count then held
    (None when the store cannot be reached)."""
    if store is None:
        return None
    try:
        for _ in range(_MAX_TRIES):
            held = int(store.add(SPENT_KEY, 0))
            if held >= known:
                return held
            store.compare_set(SPENT_KEY, str(held), str(known))
        return int(store.add(SPENT_KEY, 0))
    except Exception as err:  # noqa: BLE001 - the store's host is gone: the node's own count
        log.debug("the job's restart count could not be kept in the store: %s", err)
        return None
