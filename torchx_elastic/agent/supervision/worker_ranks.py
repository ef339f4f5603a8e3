"""The global and role ranks of each node's workers in a round, as torch's agent gives them.

torch's agent assigns them in ``SimpleElasticAgent._assign_worker_ranks`` (private); the
agent runs the same algorithm on the same store keys, so a round's store holds what
torchrun's would.
"""

from __future__ import annotations

import json

from torch.distributed import Store  # type: ignore[attr-defined]

# torch's store keys of the worker ranks' assignment (api.py)
ROLE_INFO_PREFIX = "torchelastic/role_info/"
ASSIGNED_RANKS_PREFIX = "torchelastic/assigned_ranks/"


def assign_worker_ranks(
    store: Store, group_rank: int, group_world_size: int, role: str, nproc: int
) -> tuple[int, int, int, int]:
    """This node's first global rank, the world size, its first role rank and the role's
    world size: torch's agent's algorithm and store keys.

    Every node writes its role and worker count; node 0 hands out consecutive blocks of
    ranks in node order; nodes may run different numbers of workers. Node 0 reads and writes
    every node's entry in one round trip each (``multi_get``, ``multi_set``: as torch's agent
    since 2.4), every other node makes two calls.
    """
    store.set(f"{ROLE_INFO_PREFIX}{group_rank}", json.dumps([role, nproc]))
    if group_rank == 0:
        keys = [f"{ROLE_INFO_PREFIX}{i}" for i in range(group_world_size)]
        infos = [json.loads(info) for info in store.multi_get(keys)]
        world_size = sum(n for _, n in infos)
        role_sizes: dict[str, int] = {}
        for name, n in infos:
            role_sizes[name] = role_sizes.get(name, 0) + n
        base, role_bases = 0, dict.fromkeys(role_sizes, 0)
        values = []
        for name, n in infos:
            values.append(json.dumps([base, world_size, role_bases[name], role_sizes[name]]))
            base += n
            role_bases[name] += n
        keys = [f"{ASSIGNED_RANKS_PREFIX}{i}" for i in range(group_world_size)]
        store.multi_set(keys, values)  # type: ignore[attr-defined]
    base, world_size, role_base, role_world_size = json.loads(
        store.get(f"{ASSIGNED_RANKS_PREFIX}{group_rank}")
    )
    return int(base), int(world_size), int(role_base), int(role_world_size)


def first_rank_of(store: Store, group_rank: int) -> int:
    """The first global rank of node ``group_rank`` in a round (:func:`assign_worker_ranks`)."""
    return int(json.loads(store.get(f"{ASSIGNED_RANKS_PREFIX}{group_rank}"))[0])
