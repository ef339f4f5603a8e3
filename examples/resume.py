"""Resume from a checkpoint after the agent restarts the workers.

    torchx run -s local_cwd dist.ddp -j 1x2 --max_retries 3 --script examples/resume.py -- \
        --checkpoint /tmp/resume.pt --crash-at-step 30

Rank 0 saves model, optimizer and step every ``--save-every`` steps; every attempt (the
agent sets ``TORCHELASTIC_RESTART_COUNT``) loads the latest checkpoint and carries on
from there. ``--crash-at-step`` makes rank 1 die once, in the first attempt, to show it.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchx_elastic import progress


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True, help="path of the checkpoint file")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    print(f"attempt {attempt}: resuming at step {start}")

    for step in range(start, args.steps):
        inputs = torch.randn(16, 8)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        progress(step + 1, args.steps)
        if rank == 0 and (step + 1) % args.save_every == 0:
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step + 1,
            }
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if attempt == 0 and rank == 1 and step == args.crash_at_step:
            raise RuntimeError(f"simulated crash at step {step}")
    if rank == 0:
        print(f"finished {args.steps} steps in attempt {attempt}, loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
