"""``slurm``: torchx's own Slurm scheduler, made right for torchx-elastic's agent.

On top of torchx's ``slurm`` (an sbatch hetjob, one component per replica, ``srun``):

- ``--max_retries N`` of ``dist.ddp`` counts once: the agent restarts the worker group in place
  N times (seconds), and the job is no longer requeued after a failure on top of that (torchx's
  sbatch script requeues after any non-zero exit: (N+1)^2 runs, each requeue held about 120 s
  by Slurm for a new allocation). A node failure is still Slurm's to requeue (``--requeue``,
  set by torchx on every job).
- ``torchx status`` of a running job adds the rank-0 agent's ``[job progress]`` line, or what its
  first rendezvous round waits for (``waiting for nodes: 1 of 2 joined; ...``), read from
  replica 0's Slurm output file (``progress.py``).
- ``torchx status`` after ``torchx cancel``: sacct says ``CANCELLED by <uid>``, which torchx 0.7
  fails to translate (an ``AssertionError``); here it is ``CANCELLED``.

Everything else (run options, workspace, logs, cancel) is torchx's.
"""

from __future__ import annotations

from typing import Any

from torchx_elastic.schedulers.compat import slurm_scheduler_kwargs
from torchx_elastic.schedulers.slurm.scheduler import SlurmScheduler

__all__ = ["SlurmScheduler", "create_scheduler"]


def create_scheduler(session_name: str, **kwargs: Any) -> SlurmScheduler:
    """torchx's ``slurm`` factory, with the arguments the installed torchx line takes
    (its development line adds ``docker_client``)."""
    return SlurmScheduler(session_name, **slurm_scheduler_kwargs(kwargs))
