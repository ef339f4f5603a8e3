"""The launch benchmark's job: a tiny gloo DDP model trained for 20 steps on CPU.

Standard library and torch only (and ``bench/records.py``); reads the torch.distributed
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) set by whichever launcher started
it. It exits 1 when the job went wrong: a world of another size than ``--world-size``, or
ranks whose parameters differ after training (DDP keeps them equal). With ``BENCH_RECORD_FILE``
set, every rank records when its process was created, its first line ran, it enters its
training loop and it is about to exit (``bench/records.py``, read by ``bench/phases.py``).
"""

import argparse

from records import check_world_size, record, record_first_line

record_first_line()  # before importing torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=None, help="the expected one")
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
    world_size = dist.get_world_size()
    check_world_size(world_size, args.world_size)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    highest, lowest = params.clone(), params.clone()
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    if not torch.equal(highest, lowest):
        raise SystemExit(f"bench ddp: rank {rank}: the ranks' parameters differ after training")
    if rank == 0:
        print(f"bench ddp: {args.steps} steps, world size {world_size}, loss {loss.item():.4f}")
    dist.destroy_process_group()
    record("done", rank)


if __name__ == "__main__":
    main()
