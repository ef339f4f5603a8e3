"""A gloo job whose last rank fails on the first attempt only: exercises max_retries."""

import os
import sys

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"attempt {attempt}: rank {rank} of world size {world_size}", flush=True)
    if attempt == 0 and rank == world_size - 1:
        sys.exit(f"rank {rank} fails on purpose on attempt 0")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
