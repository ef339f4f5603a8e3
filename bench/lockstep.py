"""The lost-node benchmark's job: a gloo all_reduce loop in lockstep across the nodes.

Rank 0 appends ``step STEP WORLD TIME`` to ``--record-file`` every 5 steps, and
``done WORLD TIME`` at the end (``bench/records.py``). Each attempt trains
``--steps`` steps, ``--step-s`` apart; ``bench/node_loss.py`` reads when the world was back
at its size after a node was lost.
"""

import argparse
import time

import torch
import torch.distributed as dist
from records import append_line


def record(path: str, line: str) -> None:
    append_line(path, f"{line} {time.time():.6f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record-file", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-s", type=float, default=0.05, help="sleep per step")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(args.steps):
        dist.all_reduce(torch.ones(1))
        if rank == 0 and step % 5 == 0:
            record(args.record_file, f"step {step} {world}")
        time.sleep(args.step_s)
    dist.barrier()
    if rank == 0:
        record(args.record_file, f"done {world}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
