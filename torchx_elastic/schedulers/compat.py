"""What the schedulers read of torchx beyond its public API, and what differs between its
releases: the one place that does (``tests/agent/test_public_api_only.py`` keeps it so).

torchx's scheduler hooks (``_submit_dryrun``, ``_run_opts``, ``_validate``, ...) are how
torchx documents implementing a scheduler, and are used as such everywhere. What is here
instead is the local scheduler's inner state: ``local_cwd`` adds to torchx's
``LocalScheduler``, whose running apps (``_apps``) and request layout (``PopenRequest``'s
``role_params``) are its own; the app a dry run carries (``AppDryRunInfo._app``), which
``torchx run --dryrun`` prints; and where the Slurm scheduler recorded a job's directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from torchx.schedulers.local_scheduler import LocalScheduler, PopenRequest, ReplicaParam
from torchx.specs import AppDef, AppDryRunInfo, CfgVal


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
    the handle) becomes ``app``; the request is not touched."""
    info._app = app


def slurm_output_file(app_id: str, role: str, replica: int) -> str:
    """Where torchx's Slurm scheduler has the stderr of a replica: ``slurm-<id>-<role>-<k>.err``
    in the job's ``job_dir`` (recorded in ``.torchxslurmjobdirs`` of the directory the job
    was run from) or, without one, in that directory; as its ``log_iter`` finds it."""
    from torchx.schedulers import slurm_scheduler

    name = f"slurm-{app_id}-{role}-{replica}.err"
    job_dir = slurm_scheduler._get_job_dirs().get(app_id)
    return os.path.join(job_dir, name) if job_dir else name
