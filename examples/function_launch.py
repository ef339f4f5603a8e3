"""Run a Python function on N workers and get each rank's return value back.

    python examples/function_launch.py              # 4 workers, a small sweep of learning rates
    python examples/function_launch.py --nproc 2 --crash   # rank 1 crashes once: restarted

``torchx_elastic.launch(fn, *args, nproc_per_node=N)`` is the short form of
``torchx_elastic.launcher.elastic_launch(LaunchConfig(...), fn)(*args)``, a drop-in for
torch's ``elastic_launch``. This process is the agent: the workers' lines come back
prefixed ``[n0 r3]``, ``progress()`` drives one progress bar, a crash restarts the group
(``max_restarts``), and an exception raised on a rank is raised here as one
``FunctionFailedError`` naming the rank, with its traceback.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import torchx_elastic
from torchx_elastic import progress


def fit(lr: float, steps: int, crash: bool) -> float:
    """A tiny data-parallel regression: every rank fits its shard, gradients are averaged."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if crash and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise RuntimeError("simulated crash on rank 1 (only in the first attempt)")
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(256, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    weights = torch.zeros(4, requires_grad=True)
    for step in range(steps):
        loss = ((x @ weights - y) ** 2).mean()
        loss.backward()
        assert weights.grad is not None
        dist.all_reduce(weights.grad)
        with torch.no_grad():
            weights -= lr * weights.grad / world
            weights.grad.zero_()
        progress(step + 1, steps)
    final = loss.detach().clone()
    dist.all_reduce(final)
    if rank == 0:
        print(f"lr={lr}: mean loss {final.item() / world:.4f}")
    dist.destroy_process_group()
    return final.item() / world


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--crash", action="store_true", help="rank 1 fails in the first attempt")
    args = parser.parse_args()
    for lr in (0.01, 0.1):
        losses = torchx_elastic.launch(
            fit, lr, args.steps, args.crash, nproc_per_node=args.nproc, max_restarts=1
        )
        print(f"lr={lr}: loss by rank {losses}")


if __name__ == "__main__":  # needed: spawned workers re-import this script (as multiprocessing)
    main()
