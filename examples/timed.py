"""A gloo DDP job that trains for a set time, and can fail on purpose: try restarts, a lost
node (delete a pod mid-run) and cancel with it.

    torchx run -s kubernetes dist.ddp -j 2x1 --cpu 0.5 --max_retries 1 \
        --script examples/timed.py -- --seconds 60
    torchx run -s local_cwd dist.ddp -j 1x2 --max_retries 1 \
        --script examples/timed.py -- --seconds 5 --crash-rank 1 --crash-attempts 1

Every attempt starts the clock again. ``--crash-rank R`` makes rank R raise an error after
``--crash-after-s`` seconds in the first ``--crash-attempts`` attempts of its node (the
agent's ``TORCHELASTIC_RESTART_COUNT``; -1: every attempt). ``--seconds-alone S``: a world of
one rank trains S seconds instead, so that an elastic job waits for a node that comes later.
``--until-file PATH``: the job ends once PATH exists on any of its nodes (``kubectl exec POD
-- touch PATH``), at the same step on every rank; --seconds stays the longest it trains.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class CrashOnPurpose(RuntimeError):
    """The failure this script was asked to have."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to train")
    parser.add_argument(
        "--seconds-alone",
        type=float,
        default=None,
        help="how long a world of one rank trains (an elastic job waiting for its other nodes,"
        " whose arrival restarts it in a larger world); default: --seconds",
    )
    parser.add_argument("--crash-rank", type=int, default=-1, help="rank that fails (-1: none)")
    parser.add_argument("--crash-after-s", type=float, default=1.0)
    parser.add_argument("--crash-attempts", type=int, default=-1, help="-1: every attempt")
    parser.add_argument(
        "--until-file",
        default=None,
        help="end the job once this file exists on any of its nodes (--seconds at most)",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="report each step to the agent (torchx_elastic.progress: the job's progress line"
        " and torchx status)",
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank} of world size {world_size}, attempt {attempt}", flush=True)
    seconds = args.seconds if world_size > 1 or args.seconds_alone is None else args.seconds_alone
    crashes = args.crash_rank == rank and (args.crash_attempts < 0 or attempt < args.crash_attempts)

    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start_s = time.monotonic()
    step = 0
    while True:
        elapsed_s = time.monotonic() - start_s
        if crashes and elapsed_s >= args.crash_after_s:
            raise CrashOnPurpose(f"rank {rank} crashes on purpose at step {step}")
        # rank 0's clock, or the file on any node, decides for everyone: every rank stops at
        # the same step
        timed_out = rank == 0 and elapsed_s >= seconds
        told = args.until_file is not None and os.path.exists(args.until_file)
        stop = torch.tensor([1.0 if timed_out or told else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        inputs = torch.randn(16, 8)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if args.progress:
            from torchx_elastic import progress

            progress(step)
        time.sleep(0.05)
    print(f"rank {rank} done: {step} steps in {time.monotonic() - start_s:.0f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
