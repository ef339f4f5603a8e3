"""``tests/netns/allreduce_loop.py`` with a progress report every step, as
``examples/progress.py`` and the docs recommend: ``torchx_elastic.progress(step + 1, steps)``
after each all_reduce (a no-op under torchrun). One line per 10 steps with the world size and
wall time, the same lines as the plain loop's.

``progress_loop.py STEPS STEP_S``
"""

import sys
import time

import torch
import torch.distributed as dist

import torchx_elastic

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
for step in range(steps):
    value = torch.ones(1)
    dist.all_reduce(value)
    torchx_elastic.progress(step + 1, steps)
    if rank == 0 and step % 10 == 0:
        print(f"step {step} world {int(value.item())} at {time.time():.3f}", flush=True)
    time.sleep(step_s)  # the steps' pace (not a wait for an event)
dist.barrier()
print(f"done world {world} at {time.time():.3f}", flush=True)
dist.destroy_process_group()
