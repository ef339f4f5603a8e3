"""A tiny gloo DDP job on CPU: every rank trains a linear model for a few steps.

Run it with:  torchx run -s local_cwd dist.ddp -j 2x2 --script examples/main.py
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of world size {world_size} (local rank {os.environ['LOCAL_RANK']})")

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        inputs = torch.randn(16, 8)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # every rank holds the same weights after DDP's gradient averaging
    weights = model.module.weight.detach().clone()
    dist.all_reduce(weights)
    if rank == 0:
        print(f"done: {args.steps} steps, final loss {loss.item():.4f}")
    # every rank is done before the process group goes away
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
