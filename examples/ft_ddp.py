"""Fault-tolerant DDP with torchft on CPU (gloo): a group that fails never stops the others.

Run it with:

    pip install 'torchx-elastic[ft]'
    torchx run -s local_cwd ft.ddp --replica_groups 2 -j 1x2 --max_retries 3 \
        --script examples/ft_ddp.py -- --steps 200

Written from torchft's documentation of its ``Manager``: the ``Manager`` joins this replica
group to the quorum that torchft's Lighthouse forms every step (``TORCHFT_LIGHTHOUSE``, set
by ``ft.ddp``), its fault-tolerant ``allreduce`` averages the gradients across the groups
of the quorum, and ``torchft.Optimizer`` commits a step only when every rank of the group
could do it (a group that fails mid-step fails the others' allreduce of that step: they skip
it and go on without it). A group that comes back after a restart gets the weights and the
step from a healthy group (``state_dict``/``load_state_dict``) and trains on at the next step.

Within a group, the ranks average their gradients with a plain gloo process group (the
group's own rendezvous), so every rank of every group holds the same model.
Each rank reports its step with ``torchx_elastic.progress`` (the console's progress bar) and
rank 0 of each group prints one line per step: the step, the groups in the quorum, the time
(and one per step it did not commit, with the reason).
"""

import argparse
import os
import time
from datetime import timedelta
from typing import Any, Dict

import torch
import torch.distributed as dist
from torchft import Manager, Optimizer, ProcessGroupGloo

from torchx_elastic import progress


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--step-s",
        type=float,
        default=0.05,
        help="extra seconds of computation per step, before the gradients are exchanged",
    )
    args = parser.parse_args()

    group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo")  # this replica group's own ranks
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"group {group} rank {rank} pid {os.getpid()} attempt {attempt}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)

    def state_dict() -> Dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: Dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"ft_ddp_{group}",
        timeout=timedelta(seconds=10),
    )
    optimizer = Optimizer(manager, inner)

    generator = torch.Generator().manual_seed(1000 * group + rank)
    while manager.current_step() < args.steps:
        inputs = torch.randn(16, 8, generator=generator)
        optimizer.zero_grad()  # starts this step's quorum
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        # a real model's forward and backward: most of a step, before the gradients are
        # exchanged, so a group that fails mid-step fails the others' allreduce (the path
        # torchft's Manager must survive) rather than a pause between two steps
        time.sleep(args.step_s)
        for param in model.parameters():
            assert param.grad is not None
            # torchft averages the gradients across the groups of the quorum; a failure of
            # another group is reported to the Manager (this step is then not committed).
            # Not torchft.DistributedDataParallel: its comm hook (torchft 0.2.0) fails an
            # assertion when the allreduce fails inside wait(), which restarted this group
            manager.allreduce(param.grad).wait()
            # ... and the group's ranks average theirs
            dist.all_reduce(param.grad)
            param.grad /= world_size
        before = manager.current_step()
        # applied only if every rank of this group could do this step, its allreduce with the
        # other groups of the quorum included (torchft's should_commit)
        optimizer.step()
        step = manager.current_step()
        if step > before:
            progress(step, args.steps)
            if rank == 0:
                print(
                    f"group {group} step {step} quorum {manager.num_participants()}"
                    f" loss {loss.item():.4f} t {time.time():.3f}",
                    flush=True,
                )
        elif rank == 0:  # e.g. another group failed during the allreduce: this group goes on
            error = manager.errored()
            reason = error.original_exception if error else "another rank's error"
            print(
                f"group {group} step {before + 1} not committed ({str(reason).splitlines()[0]})"
                f" t {time.time():.3f}",
                flush=True,
            )
    dist.destroy_process_group()
    manager.shutdown()


if __name__ == "__main__":
    main()
