"""Where N keys are read or written, one batched call (``multi_get`` / ``multi_set``):
the worker ranks' assignment as torch's agent makes it, and the fallback for a store that
has no batched calls (agent/compat.py)."""

from __future__ import annotations

import json
from typing import Any

import torch.distributed as dist

from torchx_elastic.agent import compat
from torchx_elastic.agent.compat import ASSIGNED_RANKS_PREFIX, ROLE_INFO_PREFIX


class CountedStore(dist.Store):  # type: ignore[misc]
    """A store in Python, its calls counted; ``batched``: with ``multi_get``/``multi_set``
    (without, torch's ``PrefixStore`` over it answers "Not implemented")."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, bytes] = {}
        self.calls: list[str] = []

    def set(self, key: str, value: Any) -> None:
        self.calls.append("set")
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        self.calls.append("get")
        return self.data[key]


class BatchedStore(CountedStore):
    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.calls.append("multi_get")
        return [self.data[key] for key in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self.calls.append("multi_set")
        for key, value in zip(keys, values, strict=True):
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)


def test_node_0_assigns_the_ranks_of_every_node_in_one_read_and_one_write() -> None:
    store = BatchedStore()
    nodes = 64
    prefix = "torch.rendezvous.job.0"
    for node in range(1, nodes):  # what the other agents wrote
        info = json.dumps(["trainer", 2 + node % 2]).encode()
        store.data[f"{prefix}/{ROLE_INFO_PREFIX}{node}"] = info
    round_store = dist.PrefixStore(prefix, store)
    assert compat.assign_worker_ranks(round_store, 0, nodes, "trainer", 2) == (0, 160, 0, 160)
    assert store.calls == ["set", "multi_get", "multi_set", "get"]  # whatever the nodes
    # node 5's block, as torch's agent hands it out: after nodes 0..4 (2+3+2+3+2 workers)
    assigned = json.loads(store.data[f"{prefix}/{ASSIGNED_RANKS_PREFIX}5"])
    assert assigned == [12, 160, 12, 160]


def test_a_store_without_batched_calls_is_read_and_written_key_by_key() -> None:
    store = CountedStore()
    prefixed = dist.PrefixStore("p", store)
    compat.multi_set(prefixed, ["a", "b"], ["1", b"2"])
    assert compat.multi_get(prefixed, ["a", "b"]) == [b"1", b"2"]
    assert store.calls == ["set", "set", "get", "get"]
    assert compat.multi_get(prefixed, []) == []
