"""The launch benchmark's job: a tiny gloo DDP model trained for 20 steps on CPU.

Standard library and torch only; reads the torch.distributed environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) set by whichever launcher started it. With ``BENCH_RECORD_FILE``
set, every rank appends ``start <rank> <unix time> <pid>`` when it enters its training loop
and ``done <rank> <unix time> <pid>`` when it is about to exit (see ``bench/phases.py``).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def record(event: str, rank: int) -> None:
    path = os.environ.get("BENCH_RECORD_FILE")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event} {rank} {time.time():.6f} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.zeros(())
    rank = dist.get_rank()
    record("start", rank)
    for _ in range(args.steps):
        inputs = torch.randn(16, 8)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        world_size = dist.get_world_size()
        print(f"bench ddp: {args.steps} steps, world size {world_size}, loss {loss.item():.4f}")
    dist.destroy_process_group()
    record("done", rank)


if __name__ == "__main__":
    main()
