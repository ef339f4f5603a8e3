"""One progress bar for the whole node: every rank calls ``progress(step, total)``.

Run it with:

    python -m torchx_elastic.agent --nproc-per-node 4 examples/progress.py
    torchx run -s local_cwd dist.ddp -j 1x4 --script examples/progress.py

On a terminal the agent draws one live bar (slowest and fastest rank, rate, ETA) with the
ranks' log lines scrolling above it; without one (CI, ``kubectl logs``) it prints a plain
progress line every few seconds. ``progress`` is a no-op outside the agent, so the same
script runs under ``python`` or ``torchrun`` unchanged.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from torchx_elastic import heartbeat, progress


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-s", type=float, default=0.02, help="seconds per step on rank 0")
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    heartbeat()  # alive, before the first step is done
    # the ranks run at slightly different speeds, so slowest and fastest differ
    step_s = args.step_s * (1 + 0.1 * int(os.environ.get("LOCAL_RANK", "0")))
    total = torch.zeros(1)
    for step in range(args.steps):
        time.sleep(step_s)
        total += 1
        progress(step + 1, args.steps)
        if (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps}", flush=True)
    dist.all_reduce(total)
    if rank == 0:
        print(f"done: {int(total.item())} steps in all", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
