"""The restart benchmark's job: gloo DDP training in which the last rank crashes once.

Every rank appends a record to ``--record-file`` when it enters its training loop
("loop") and the crashing rank one just before it raises ("crash"):

    <event> <attempt> <rank> <unix time in s>

``attempt`` is ``TORCHELASTIC_RESTART_COUNT`` (set by torchrun and by torchx-elastic's
agent). On attempt 0 the last rank raises at ``--crash-step``; on later attempts every
rank trains to the end, so a launcher that restarts the group finishes with exit code 0.
``bench/restart.py`` turns the records into the crash-to-all-ranks-back latency.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from records import append_line
from torch.nn.parallel import DistributedDataParallel


def record(path: str, event: str, attempt: int, rank: int) -> None:
    append_line(path, f"{event} {attempt} {rank} {time.time():.6f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record-file", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--crash-step", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.05, help="sleep per step")
    args = parser.parse_args()

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    record(args.record_file, "loop", attempt, rank)
    for step in range(args.steps):
        if attempt == 0 and rank == world_size - 1 and step == args.crash_step:
            record(args.record_file, "crash", attempt, rank)
            raise RuntimeError(f"bench: rank {rank} crashes once at step {step}")
        inputs = torch.randn(16, 8)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
