"""A lockstep all_reduce loop: one line per 10 steps with the world size and wall time."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
start = int(os.environ.get("START_STEP", "0"))
for step in range(steps):
    value = torch.ones(1)
    dist.all_reduce(value)
    if rank == 0 and step % 10 == 0:
        print(f"step {step} world {int(value.item())} at {time.time():.3f}", flush=True)
    time.sleep(step_s)
dist.barrier()
print(f"done world {world} at {time.time():.3f}", flush=True)
dist.destroy_process_group()
