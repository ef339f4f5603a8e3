"""The job's restart count in the store (supervision/restart_budget.py): it only grows, the
largest of what the nodes know wins, and a store that is gone leaves the node's own count."""

from __future__ import annotations

import threading

from torch.distributed import TCPStore

from torchx_elastic.agent.supervision.restart_budget import SPENT_KEY, raise_to


def test_the_largest_count_any_node_knows_wins_and_never_goes_down() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert raise_to(store, 0) == 0  # a new job
    assert raise_to(store, 2) == 2
    assert raise_to(store, 1) == 2  # a node that knows less learns the job's count
    results: dict[int, int | None] = {}
    clients = [TCPStore("127.0.0.1", store.port, is_master=False) for _ in range(8)]
    threads = [
        threading.Thread(target=lambda c=c, n=n: results.update({n: raise_to(c, n)}))
        for n, c in enumerate(clients, start=3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert int(store.get(SPENT_KEY)) == 10  # the largest of 3..10, whatever the order
    assert all(r is not None and r >= n for n, r in results.items()) and len(results) == 8


class _Gone:
    def add(self, key: str, value: int) -> int:
        raise RuntimeError("Connection reset by peer")

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        raise AssertionError("not reached")


def test_no_store_or_a_lost_one_leaves_the_nodes_own_count() -> None:
    assert raise_to(None, 3) is None
    assert raise_to(_Gone(), 3) is None
