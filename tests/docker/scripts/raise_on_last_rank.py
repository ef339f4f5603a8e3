"""A gloo job whose last rank raises while the others wait in an all_reduce."""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    if dist.get_rank() == dist.get_world_size() - 1:
        raise ValueError("the last rank gives up")
    dist.all_reduce(value)


if __name__ == "__main__":
    main()
