"""Run options of the docker scheduler, declared once.

``DockerOptions`` is the one declaration: ``run_opts()`` (what ``torchx runopts docker``
prints) is generated from its fields, and ``DockerOptions.from_cfg`` reads a resolved
torchx cfg back into it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchx.specs import CfgVal, runopts

IMAGE_PULL_POLICIES = ("missing", "always", "never")


def _option(default: Any, type_: type[Any] | Any, help: str) -> Any:
    return field(default=default, metadata={"type": type_, "help": help})


class DockerOptionsError(ValueError):
    """A run option value the scheduler cannot use."""


@dataclass(frozen=True)
class DockerOptions:
    copy_env: Optional[Tuple[str, ...]] = _option(
        None,
        List[str],
        "glob patterns of host environment variables copied into every container,"
        " e.g. NCCL_*,LOGLEVEL; the job's own env and the env option win",
    )
    env: Optional[Dict[str, str]] = _option(
        None,
        Dict[str, str],
        "environment variables for every container (ENV1:v1,ENV2:v2), applied over"
        " copy_env and under the job's own env",
    )
    image_pull: str = _option(
        "missing",
        str,
        "when to pull the role's image: missing (use the local image, pull only when it"
        " is not there), always (pull; fall back to a local image), never (local only)",
    )
    shm_size_mb: int = _option(
        0,
        int,
        "size of /dev/shm in MB (DataLoader workers need more than Docker's 64 MB);"
        " 0: the role's memMB",
    )
    restart_containers: bool = _option(
        False,
        bool,
        "let Docker restart a container whose agent exited non-zero (killed, OOM, crash) up"
        " to the job's max_retries times (restart policy on-failure); off: such a replica"
        " FAILS, and the job with it when fewer than min_replicas are left. torch 2.13's c10d"
        " rendezvous does not reliably take a restarted node back (see docs/docker.md)",
    )
    stop_timeout_s: int = _option(
        10,
        int,
        "seconds cancel waits after SIGTERM before it kills a container",
    )
    privileged: bool = _option(
        False, bool, "run the containers privileged (docker run --privileged)"
    )
    image_repo: Optional[str] = _option(
        None,
        str,
        "repository of the workspace image (torchx run --workspace, default: the current"
        " directory, built on the role's image), tagged by its content digest;"
        " default: torchx-workspace",
    )
    quiet: bool = _option(False, bool, "do not print the output of the workspace image build")

    def __post_init__(self) -> None:
        if self.image_pull not in IMAGE_PULL_POLICIES:
            raise DockerOptionsError(
                f"image_pull={self.image_pull!r} is not one of {', '.join(IMAGE_PULL_POLICIES)}"
            )
        if self.shm_size_mb < 0:
            raise DockerOptionsError(f"shm_size_mb={self.shm_size_mb} must be 0 or more")
        if self.stop_timeout_s < 0:
            raise DockerOptionsError(f"stop_timeout_s={self.stop_timeout_s} must be 0 or more")

    @classmethod
    def run_opts(cls) -> runopts:
        opts = runopts()
        for f in dataclasses.fields(cls):
            opts.add(f.name, type_=f.metadata["type"], default=f.default, help=f.metadata["help"])
        return opts

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, CfgVal]) -> DockerOptions:
        """The options of a torchx cfg (resolved or not); keys it does not know are ignored."""
        values: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = cfg.get(f.name)
            if value is None:
                continue
            if f.name == "copy_env":
                assert isinstance(value, list)
                value = tuple(value)
            values[f.name] = value
        return cls(**values)
