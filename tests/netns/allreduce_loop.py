"""A lockstep all_reduce loop: one line per 10 steps with the world size and wall time.

``allreduce_loop.py STEPS STEP_S``: STEPS steps, STEP_S apart; with ``UNTIL_WORLD=N`` in the
environment, a world smaller than N goes on stepping until the agents restart it with more
nodes (every rank of a world decides alike: its size is the same for all); with
``HOLD_FILE=PATH``, the loop goes on stepping until that file exists (the ranks agree through
the all_reduce: a test releases the job once it saw what it waits for, however slow the
machine).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
start = int(os.environ.get("START_STEP", "0"))
until_world = int(os.environ.get("UNTIL_WORLD", "0"))
hold = os.environ.get("HOLD_FILE", "")
held = bool(hold)
step = 0
while step < steps or world < until_world or held:
    value = torch.tensor([1.0, float(bool(hold) and not os.path.exists(hold))])
    dist.all_reduce(value)  # [the world's size, how many ranks are still held]
    held = value[1].item() > 0
    if rank == 0 and step % 10 == 0:
        print(f"step {step} world {int(value[0].item())} at {time.time():.3f}", flush=True)
    time.sleep(step_s)  # the steps' pace (not a wait for an event)
    step += 1
dist.barrier()
print(f"done world {world} at {time.time():.3f}", flush=True)
dist.destroy_process_group()
