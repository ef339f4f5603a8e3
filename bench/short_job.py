"""The short-job benchmark's job: init the process group, one ``all_reduce``, exit.

What users launch most (smoke runs, CI, sweeps of small trials): the launcher's own cost is
most of its time. Each rank adds ``rank + 1``; every rank checks the sum (``N (N + 1) / 2``)
and, with ``--world-size``, the size of the world, and exits 1 when either is wrong. Records
as ``bench/ddp_script.py`` does (``bench/records.py``); ``--hold-s`` keeps every rank a while
after the check (the memory benchmark samples the job then).
"""

import argparse
import time

from records import check_world_size, record, record_first_line

record_first_line()  # before importing torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=None, help="the expected one")
    parser.add_argument(
        "--hold-s", type=float, default=0.0, help="stay this long after the check (memory)"
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    record("start", rank)
    check_world_size(world_size, args.world_size)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    expected = world_size * (world_size + 1) / 2
    if total.item() != expected:
        raise SystemExit(f"bench short job: rank {rank}: sum {total.item()}, expected {expected}")
    if rank == 0:
        print(f"bench short job: world size {world_size}, sum {total.item():.0f}")
    time.sleep(args.hold_s)  # every rank still there: the memory benchmark samples the job
    dist.destroy_process_group()
    record("done", rank)


if __name__ == "__main__":
    main()
