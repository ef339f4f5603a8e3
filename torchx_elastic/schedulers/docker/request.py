"""The docker scheduler's request: one network and one container per replica, as plain data.

``build_job`` has no side effects and needs no engine: ``torchx run --dryrun -s docker``
prints the ``DockerJob`` as YAML, and the golden-file tests compare that text. Only
``ContainerRequest.create_kwargs`` turns it into docker-py arguments (lazily importing
``docker.types``) when the job is scheduled.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torchx
import yaml
from torchx.schedulers.devices import get_device_mounts
from torchx.specs import AppDef, BindMount, DeviceMount, Role, VolumeMount, macros

from torchx_elastic.contract import RANK0_ENV, ROLE_RANK0_ENV
from torchx_elastic.schedulers.credentials import MASK, looks_like_credential
from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.names import DNS_LABEL_MAX, dns_label
from torchx_elastic.schedulers.workspace import WorkspaceBuild

# torchx's own labels, so tools that know torchx's local_docker read our containers too
LABEL_VERSION = "torchx.pytorch.org/version"
LABEL_APP_ID = "torchx.pytorch.org/app-id"
LABEL_ROLE_NAME = "torchx.pytorch.org/role-name"
LABEL_REPLICA_ID = "torchx.pytorch.org/replica-id"
# ours: which scheduler made the container, and the role's elastic bounds for status
LABEL_SCHEDULER = "torchx-elastic/scheduler"
LABEL_MIN_REPLICAS = "torchx-elastic/min-replicas"
LABEL_NUM_REPLICAS = "torchx-elastic/num-replicas"
LABEL_STOP_TIMEOUT_S = "torchx-elastic/stop-timeout-s"  # docker-py cannot set StopTimeout
# apps of several roles (ft.ddp): the role's place in the app (the first coordinates)
LABEL_ROLE_INDEX = "torchx-elastic/role-index"
SCHEDULER_NAME = "docker"

NAME_MAX_CHARS = DNS_LABEL_MAX  # a hostname label


def _app_id_tail(app_id: str, prefix: str, suffix: str) -> str:
    """``prefix + app_id + suffix`` in a valid hostname (63 chars at most): a long app id
    loses its head, not its random tail, so names stay unique."""
    whole = dns_label(app_id, max_length=len(app_id) + len("app-"))
    head = whole[-(NAME_MAX_CHARS - len(prefix) - len(suffix)) :].strip("-")
    return prefix + head + suffix


def container_name(app_id: str, role_name: str, replica_id: int) -> str:
    """``{app_id}-{role}-{replica}``, the app id's head cut to fit."""
    return _app_id_tail(app_id, "", f"-{dns_label(role_name, 20, fallback='role')}-{replica_id}")


def network_name(app_id: str) -> str:
    """``torchx-{app_id}``, the app id's head cut to fit."""
    return _app_id_tail(app_id, "torchx-", "")


def cancel_marker_name(app_id: str) -> str:
    """The empty volume that records ``torchx cancel`` of a job (labels cannot be changed)."""
    return f"{network_name(app_id)}-cancelled"


@dataclass(frozen=True)
class MountRequest:
    type: str  # bind | volume
    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class ContainerRequest:
    """One replica's container: everything ``docker run`` needs, engine-independent."""

    name: str
    hostname: str
    image: str
    command: List[str]
    environment: Dict[str, str]
    labels: Dict[str, str]
    mounts: List[MountRequest] = field(default_factory=list)
    devices: List[str] = field(default_factory=list)  # host:container:permissions
    gpus: int = 0
    cpus: float = 0.0  # 0: no limit
    mem_limit_mb: int = 0  # 0: no limit
    shm_size_mb: int = 0  # 0: Docker's default (64 MB)
    restart_max_retries: int = 0  # on-failure restarts of the container; 0: never
    stop_timeout_s: int = 10  # docker stop / torchx cancel: SIGTERM, then SIGKILL after this
    privileged: bool = False

    def create_kwargs(self, network: str) -> Dict[str, Any]:
        """Keyword arguments of docker-py's ``client.containers.create``."""
        from docker.types import DeviceRequest, Mount

        kwargs: Dict[str, Any] = {
            "image": self.image,
            "command": self.command,
            "name": self.name,
            "hostname": self.hostname,
            "environment": self.environment,
            "labels": self.labels,
            "network": network,
            "mounts": [
                Mount(target=m.target, source=m.source, type=m.type, read_only=m.read_only)
                for m in self.mounts
            ],
            "devices": self.devices,
            "privileged": self.privileged,
            "detach": True,
        }
        if self.gpus > 0:
            kwargs["device_requests"] = [
                DeviceRequest(count=self.gpus, capabilities=[["compute", "utility"]])
            ]
        if self.cpus > 0:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        if self.mem_limit_mb > 0:
            kwargs["mem_limit"] = f"{self.mem_limit_mb}m"
        if self.shm_size_mb > 0:
            kwargs["shm_size"] = f"{self.shm_size_mb}m"
        if self.restart_max_retries > 0:
            kwargs["restart_policy"] = {
                "Name": "on-failure",
                "MaximumRetryCount": self.restart_max_retries,
            }
        return kwargs


@dataclass(frozen=True)
class DockerJob:
    """The whole request: the job's network, its images and its containers (rank 0 first)."""

    app_id: str
    network: str
    network_labels: Dict[str, str]
    images: Tuple[str, ...]
    image_pull: str  # missing | always | never
    containers: List[ContainerRequest]
    workspace_builds: Tuple[WorkspaceBuild, ...] = ()  # built before the containers start
    secret_env_file: Optional[str] = None  # read when the job is submitted, not in the dry run

    def __str__(self) -> str:
        fields = asdict(self)
        for container in fields["containers"]:  # values of credential-looking names masked
            env = container["environment"]
            container["environment"] = {
                k: MASK if looks_like_credential(k) else v for k, v in env.items()
            }
        if not self.secret_env_file:
            del fields["secret_env_file"]
        if not self.workspace_builds:
            del fields["workspace_builds"]
        else:
            fields["workspace_builds"] = [asdict(b) for b in self.workspace_builds]
        return yaml.safe_dump(fields, sort_keys=False, width=100)

    def __repr__(self) -> str:
        return str(self)


def _copied_env(patterns: Optional[Tuple[str, ...]], host_env: Mapping[str, str]) -> Dict[str, str]:
    copied: Dict[str, str] = {}
    for pattern in patterns or ():
        for key in sorted(fnmatch.filter(host_env.keys(), pattern)):
            copied[key] = host_env[key]
    return copied


def _mounts(role: Role) -> Tuple[List[MountRequest], List[str]]:
    mounts: List[MountRequest] = []
    devices: List[str] = []
    for mount in [*role.mounts, *get_device_mounts(role.resource.devices)]:
        if isinstance(mount, BindMount):
            mounts.append(MountRequest("bind", mount.src_path, mount.dst_path, mount.read_only))
        elif isinstance(mount, VolumeMount):
            mounts.append(MountRequest("volume", mount.src, mount.dst_path, mount.read_only))
        elif isinstance(mount, DeviceMount):
            devices.append(f"{mount.src_path}:{mount.dst_path}:{mount.permissions}")
        else:
            raise TypeError(f"unknown mount type {type(mount).__name__}: {mount!r}")
    return mounts, devices


def build_job(
    app: AppDef, options: DockerOptions, app_id: str, host_env: Mapping[str, str]
) -> DockerJob:
    """The request for ``app`` as ``app_id``; ``host_env`` feeds the ``copy_env`` globs."""
    base_env = _copied_env(options.copy_env, host_env)
    base_env.update(options.env or {})
    rank0_host = container_name(app_id, app.roles[0].name, 0)
    containers: List[ContainerRequest] = []
    for role_index, role in enumerate(app.roles):
        mounts, devices = _mounts(role)
        resource = role.resource
        mem_limit_mb = max(int(resource.memMB), 0)
        for replica_id in range(role.num_replicas):
            values = macros.Values(
                img_root="",
                app_id=app_id,
                replica_id=str(replica_id),
                rank0_env=RANK0_ENV,
            )
            replica = values.apply(role)
            name = container_name(app_id, role.name, replica_id)
            environment = {**base_env, **replica.env, RANK0_ENV: rank0_host}
            several_roles = {}
            if len(app.roles) > 1:  # each role's own replica 0 (ft.ddp's groups)
                environment[ROLE_RANK0_ENV] = container_name(app_id, role.name, 0)
                several_roles[LABEL_ROLE_INDEX] = str(role_index)
            containers.append(
                ContainerRequest(
                    name=name,
                    hostname=name,
                    image=replica.image,
                    command=[replica.entrypoint, *replica.args],
                    environment=environment,
                    labels={
                        LABEL_VERSION: torchx.__version__,
                        LABEL_APP_ID: app_id,
                        LABEL_ROLE_NAME: role.name,
                        LABEL_REPLICA_ID: str(replica_id),
                        LABEL_SCHEDULER: SCHEDULER_NAME,
                        LABEL_MIN_REPLICAS: str(role.min_replicas or role.num_replicas),
                        LABEL_NUM_REPLICAS: str(role.num_replicas),
                        LABEL_STOP_TIMEOUT_S: str(options.stop_timeout_s),
                        **several_roles,
                    },
                    mounts=mounts,
                    devices=devices,
                    gpus=max(int(resource.gpu), 0),
                    cpus=max(float(resource.cpu), 0.0),
                    mem_limit_mb=mem_limit_mb,
                    shm_size_mb=options.shm_size_mb or mem_limit_mb,
                    restart_max_retries=role.max_retries if options.restart_containers else 0,
                    stop_timeout_s=options.stop_timeout_s,
                    privileged=options.privileged,
                )
            )
    images = tuple(dict.fromkeys(c.image for c in containers))
    return DockerJob(
        app_id=app_id,
        network=network_name(app_id),
        network_labels={LABEL_APP_ID: app_id, LABEL_SCHEDULER: SCHEDULER_NAME},
        images=images,
        image_pull=options.image_pull,
        containers=containers,
        secret_env_file=options.secret_env_file,
    )
