"""What the schedulers read of torchx beyond its public API, and what differs between its
releases: the one place that does (``tests/agent/test_public_api_only.py`` keeps it so).

torchx's scheduler hooks (``_submit_dryrun``, ``_run_opts``, ``_validate``, ...) are how
torchx documents implementing a scheduler, and are used as such everywhere. What is here
instead is the local scheduler's inner state: ``local_cwd`` adds to torchx's
``LocalScheduler``, whose running apps (``_apps``) and request layout (``PopenRequest``'s
``role_params``) are its own; the app a dry run carries (``AppDryRunInfo._app``), which
``torchx run --dryrun`` prints; where the Slurm scheduler recorded a job's directory; the
labels, job states and retry policies of torchx's own Kubernetes scheduler, which ours keeps
so that torchx's tools read its jobs; and what differs between torchx 0.7 and its
development line (the Slurm scheduler's states and arguments, ``Runner.wait``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Mapping
from typing import Any

from torchx.runner.api import Runner
from torchx.schedulers import kubernetes_scheduler as torchx_kubernetes
from torchx.schedulers.local_scheduler import LocalScheduler, PopenRequest, ReplicaParam
from torchx.specs import AppDef, AppDryRunInfo, CfgVal

__all__ = [
    "as_torchx_cfg",
    "asked_by_runner_wait",
    "local_app",
    "local_replicas",
    "local_roles",
    "show_app_as",
    "slurm_output_file",
    "slurm_scheduler_kwargs",
    "torchx_reads_every_slurm_state",
    "torchx_kubernetes",
]


def local_app(scheduler: LocalScheduler, app_id: str) -> Any:
    """torchx's record of a local app of this session (``log_dir``, ``state``,
    ``role_replicas``); None when the session has none of that id."""
    return scheduler._apps.get(app_id)


def local_replicas(request: PopenRequest) -> Iterator[ReplicaParam]:
    """The launch parameters (``env``, ``args``) of every replica of a local request, to
    complete before its processes start."""
    for replicas in local_roles(request).values():
        yield from replicas


def local_roles(request: PopenRequest) -> Mapping[str, list[ReplicaParam]]:
    """The same, by role: role name -> its replicas' launch parameters."""
    roles: Mapping[str, list[ReplicaParam]] = request.role_params
    return roles


def as_torchx_cfg(torchx_cfg: Mapping[str, CfgVal], resolved: Mapping[str, CfgVal]) -> Any:
    """``resolved`` in the form torchx handed its cfg over: torchx 0.7 a dict, its
    development line its own options dataclass (``from_cfg``), read back the same way."""
    from_cfg = getattr(type(torchx_cfg), "from_cfg", None)
    return from_cfg(resolved) if from_cfg else resolved


def show_app_as(info: AppDryRunInfo[Any], app: AppDef) -> None:
    """The app that ``torchx run --dryrun`` prints of ``info`` (and the runner remembers for
    the handle) becomes ``app``; the request is not touched. (torchx 0.7 keeps it in
    ``_app``; its development line in ``app``.)"""
    setattr(info, "app" if hasattr(info, "app") else "_app", app)


def slurm_output_file(app_id: str, role: str, replica: int) -> str:
    """Where torchx's Slurm scheduler has the stderr of a replica: ``slurm-<id>-<role>-<k>.err``
    in the job's ``job_dir`` (recorded in ``.torchxslurmjobdirs`` of the directory the job
    was run from) or, without one, in that directory; as its ``log_iter`` finds it."""
    from torchx.schedulers import slurm_scheduler

    name = f"slurm-{app_id}-{role}-{replica}.err"
    job_dir = slurm_scheduler._get_job_dirs().get(app_id)
    return os.path.join(job_dir, name) if job_dir else name


def torchx_reads_every_slurm_state() -> bool:
    """torchx's development line reads every sacct state itself (squeue first, then sacct,
    with "CANCELLED by 0"); torchx 0.7's describe fails on a cancelled job."""
    from torchx.schedulers import slurm_scheduler

    return hasattr(slurm_scheduler, "appstate_from_slurm_state")


def slurm_scheduler_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of a ``slurm`` factory call that the installed torchx line's
    ``SlurmScheduler`` takes (its development line adds ``docker_client``)."""
    from torchx.schedulers.slurm_scheduler import SlurmScheduler

    accepted = inspect.signature(SlurmScheduler.__init__).parameters
    return {key: value for key, value in kwargs.items() if key in accepted}


def asked_by_runner_wait() -> bool:
    """Whether torchx's ``Runner.wait`` is on the calling stack (it asks for a status again
    only after a sleep)."""
    wait_code = getattr(Runner.wait, "__code__", None)
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code is wait_code:
            return True
        frame = frame.f_back
    return False
