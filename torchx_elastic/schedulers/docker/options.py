"""Run options of the docker scheduler, declared once (see ``schedulers/options.py``).

``DockerOptions`` is the one declaration: ``runopts()`` (what ``torchx runopts docker``
prints), ``from_cfg`` (a resolved torchx cfg read back) and the errors come from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

from torchx_elastic.schedulers.options import RunOptions, option

IMAGE_PULL_POLICIES = ("missing", "always", "never")


@dataclass(frozen=True)
class DockerOptions(RunOptions):
    SCHEDULER: ClassVar[str] = "docker"

    copy_env: Optional[Tuple[str, ...]] = option(
        None,
        type_=List[str],
        help="glob patterns of host environment variables copied into every container,"
        " e.g. NCCL_*,LOGLEVEL; the job's own env and the env option win",
    )
    env: Optional[Dict[str, str]] = option(
        None,
        type_=Dict[str, str],
        help="environment variables for every container (ENV1:v1,ENV2:v2), applied over"
        " copy_env and under the job's own env",
    )
    secret_env_file: Optional[str] = option(
        None,
        type_=str,
        help="host file of NAME=value lines (docker's --env-file format) read when the job is"
        " submitted and copied into each container, where the agent exports them: for"
        " credentials (API keys, tokens), which --env and env would leave in the container's"
        " config (docker inspect) and in the dry run",
    )
    image_pull: str = option(
        "missing",
        type_=str,
        choices=IMAGE_PULL_POLICIES,
        help="when to pull the role's image: missing (use the local image, pull only when it"
        " is not there), always (pull; fall back to a local image), never (local only)",
    )
    shm_size_mb: int = option(
        0,
        type_=int,
        minimum=0,
        help="size of /dev/shm in MB (DataLoader workers need more than Docker's 64 MB);"
        " 0: the role's memMB",
    )
    restart_containers: bool = option(
        False,
        type_=bool,
        help="let Docker restart a container whose agent exited non-zero (killed, OOM, crash) up"
        " to the job's max_retries times (restart policy on-failure); off: such a replica"
        " FAILS, and the job with it when fewer than min_replicas are left. torch 2.13's c10d"
        " rendezvous does not reliably take a restarted node back (see docs/docker.md)",
    )
    stop_timeout_s: int = option(
        10,
        type_=int,
        minimum=0,
        help="seconds cancel waits after SIGTERM before it kills a container",
    )
    privileged: bool = option(
        False, type_=bool, help="run the containers privileged (docker run --privileged)"
    )
    image_repo: Optional[str] = option(
        None,
        type_=str,
        help="repository of the workspace image (torchx run --workspace, default: the current"
        " directory, built on the role's image), tagged by its content digest;"
        " default: torchx-workspace",
    )
    quiet: bool = option(
        False, type_=bool, help="do not print the output of the workspace image build"
    )
