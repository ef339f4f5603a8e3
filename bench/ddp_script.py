"""The launch benchmark's job: a tiny gloo DDP model trained for 20 steps on CPU.

Standard library and torch only; reads the torch.distributed environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) set by whichever launcher started it. With ``BENCH_RECORD_FILE``
set, every rank appends ``proc <rank> <unix time> <pid>`` (when its process was created),
``script`` (its first line ran), ``start`` when it enters its training loop and ``done``
when it is about to exit (see ``bench/phases.py``).
"""

import argparse
import os
import time


def process_start_unix_s() -> float:
    """When this process was created (a forked worker: its fork; a spawned one: its exec)."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as boot:
        btime = next(int(line.split()[1]) for line in boot if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def record(event: str, rank: int, at: float | None = None) -> None:
    path = os.environ.get("BENCH_RECORD_FILE")
    if not path:
        return
    stamp = time.time() if at is None else at
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event} {rank} {stamp:.6f} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


if os.environ.get("BENCH_RECORD_FILE"):  # before importing torch: the script's first line
    record("script", int(os.environ.get("RANK", "-1")))
    record("proc", int(os.environ.get("RANK", "-1")), process_start_unix_s())

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


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
