"""A stateful fake of the Docker engine, as docker-py's ``DockerClient`` shows it.

Holds images, networks, volumes and containers; containers move created -> running -> exited
(``finish``), restart by their policy (``crash``), keep their output and answer
``logs`` in arbitrary chunks, the way the real stream does. Errors are docker-py's own
exception classes with the engine's status codes. Only what the scheduler calls exists.
"""

from __future__ import annotations

import io
import itertools
import os
import tarfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, Iterator, List, Optional, Union

from docker.errors import APIError, ImageNotFound, NotFound
from docker.models.containers import RUN_CREATE_KWARGS, RUN_HOST_CONFIG_KWARGS


@dataclass
class _Response:
    status_code: int
    reason: str = ""
    url: str = "http+docker://localhost/fake"


def api_error(status_code: int, explanation: str) -> APIError:
    error_class = NotFound if status_code == 404 else APIError
    return error_class(explanation, response=_Response(status_code), explanation=explanation)


def _labels_match(labels: Dict[str, str], filters: Optional[Dict[str, Any]]) -> bool:
    wanted = (filters or {}).get("label", [])
    for item in [wanted] if isinstance(wanted, str) else wanted:
        key, _, value = item.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


@dataclass
class FakeImage:
    name: str
    executables: tuple[str, ...] = ("python3", "sh", "sleep")


class FakeImages:
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self.pulls: List[str] = []

    def get(self, name: str) -> FakeImage:
        if name not in self._engine.local_images:
            raise ImageNotFound(f"No such image: {name}")
        return self._engine.local_images[name]

    def pull(self, name: str) -> FakeImage:
        self.pulls.append(name)
        if name not in self._engine.registry_images:
            raise api_error(404, f"pull access denied for {name}, repository does not exist")
        self._engine.local_images[name] = FakeImage(name)
        return self._engine.local_images[name]


@dataclass
class FakeNetwork:
    engine: FakeEngine
    name: str
    labels: Dict[str, str]

    def remove(self) -> None:
        if self.name not in self.engine.networks:
            raise api_error(404, f"network {self.name} not found")
        del self.engine.networks[self.name]


class FakeNetworks:
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    def create(
        self, name: str, driver: str = "bridge", labels: Optional[Dict[str, str]] = None
    ) -> FakeNetwork:
        if name in self._engine.networks:
            raise api_error(409, f"network with name {name} already exists")
        network = FakeNetwork(self._engine, name, dict(labels or {}))
        self._engine.networks[name] = network
        return network

    def get(self, name: str) -> FakeNetwork:
        if name not in self._engine.networks:
            raise api_error(404, f"network {name} not found")
        return self._engine.networks[name]

    def list(self, filters: Optional[Dict[str, Any]] = None) -> List[FakeNetwork]:
        return [n for n in self._engine.networks.values() if _labels_match(n.labels, filters)]


@dataclass
class FakeVolume:
    engine: FakeEngine
    name: str
    labels: Dict[str, str]

    @property
    def attrs(self) -> Dict[str, Any]:
        return {"Name": self.name, "Labels": dict(self.labels)}

    def remove(self, force: bool = False) -> None:
        if self.name not in self.engine.volumes:
            raise api_error(404, f"get {self.name}: no such volume")
        self.engine.calls.append(f"remove volume {self.name}")
        del self.engine.volumes[self.name]


class FakeVolumes:
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    def create(self, name: str, labels: Optional[Dict[str, str]] = None) -> FakeVolume:
        # like the engine: creating an existing volume returns it
        if name not in self._engine.volumes:
            self._engine.calls.append(f"create volume {name}")
            self._engine.volumes[name] = FakeVolume(self._engine, name, dict(labels or {}))
        return self._engine.volumes[name]

    def list(self, filters: Optional[Dict[str, Any]] = None) -> List[FakeVolume]:
        return [v for v in self._engine.volumes.values() if _labels_match(v.labels, filters)]


@dataclass
class FakeContainer:
    engine: FakeEngine
    name: str
    image: str
    command: List[str]
    kwargs: Dict[str, Any]
    status: str = "created"
    exit_code: int = 0
    oom_killed: bool = False
    error: str = ""
    finished_at: str = "0001-01-01T00:00:00Z"
    restart_count: int = 0
    output: List[tuple[str, bytes]] = field(default_factory=list)  # (stream, bytes)
    files: Dict[str, bytes] = field(default_factory=dict)  # absolute path -> content

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self.kwargs.get("labels") or {})

    @property
    def attrs(self) -> Dict[str, Any]:
        return {
            "Name": f"/{self.name}",
            "RestartCount": self.restart_count,
            "Config": {"Image": self.image, "Labels": self.labels},
            "State": {
                "Status": self.status,
                "ExitCode": self.exit_code,
                "OOMKilled": self.oom_killed,
                "Error": self.error,
                "FinishedAt": self.finished_at,
            },
        }

    def get_archive(self, path: str, chunk_size: int = 2048) -> tuple[Any, Dict[str, Any]]:
        """A tar stream of the files under ``path`` (named from its last component, as the
        engine's ``GET /containers/<id>/archive`` does), in chunks, and its stat."""
        self._check_exists()
        top = path.rstrip("/")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name, data in sorted(self.files.items()):
                if name.startswith(top + "/"):
                    info = tarfile.TarInfo(os.path.basename(top) + name[len(top) :])
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        data = buffer.getvalue()
        chunks = (data[i : i + chunk_size] for i in range(0, len(data), chunk_size))
        return chunks, {"name": os.path.basename(top), "size": len(data)}

    def put_archive(self, path: str, data: bytes) -> bool:
        """Extract the tar ``data`` under ``path`` (``docker cp`` into the container)."""
        self._check_exists()
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for info in archive.getmembers():
                extracted = archive.extractfile(info)
                if extracted is not None:
                    self.files[f"{path.rstrip('/')}/{info.name}"] = extracted.read()
        return True

    def _check_exists(self) -> None:
        if self.name not in self.engine.containers:
            raise api_error(404, f"No such container: {self.name}")

    def start(self) -> None:
        self._check_exists()
        image = self.engine.local_images[self.image]
        if self.command[0] not in image.executables:
            self.error = (
                "failed to create shim task: OCI runtime create failed: exec:"
                f' "{self.command[0]}": executable file not found in $PATH'
            )
            self.exit_code = 127
            raise api_error(400, self.error)
        self.status = "running"

    def stop(self, timeout: Optional[int] = None) -> None:
        self._check_exists()
        self.engine.calls.append(f"stop {self.name} timeout={timeout}")
        if self.status in ("running", "restarting"):
            self._exit(143)

    def remove(self, force: bool = False) -> None:
        self._check_exists()
        if self.status == "running" and not force:
            raise api_error(409, f"cannot remove a running container {self.name}")
        self.engine.calls.append(f"remove {self.name}")
        del self.engine.containers[self.name]

    def logs(
        self,
        stdout: bool = True,
        stderr: bool = True,
        stream: bool = False,
        follow: bool = False,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        tail: Union[str, int] = "all",
        timestamps: bool = False,
    ) -> Union[bytes, Iterator[bytes]]:
        self.engine.log_calls.append({"since": since, "until": until, "follow": follow})
        wanted = {"stdout"} if stdout else set()
        wanted |= {"stderr"} if stderr else set()
        text = b"".join(data for stream_name, data in self.output if stream_name in wanted)
        if timestamps:  # as the engine writes them; here every line is as old as the read
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f123Z ").encode()
            text = b"".join(stamp + line for line in text.splitlines(keepends=True))
        if tail != "all":
            text = b"".join(text.splitlines(keepends=True)[-int(tail) :])
        if not stream:
            return text
        # the real stream cuts wherever the writes were: here every 7 bytes
        return iter([text[i : i + 7] for i in range(0, len(text), 7)])

    # -- what the test does to the "processes" --------------------------------------------

    def write(self, text: str, stream: str = "stdout") -> None:
        self.output.append((stream, text.encode()))

    def _exit(self, exit_code: int, oom_killed: bool = False) -> None:
        self.status = "exited"
        self.exit_code = exit_code
        self.oom_killed = oom_killed
        self.finished_at = self.engine.next_time()

    def finish(self, exit_code: int, oom_killed: bool = False) -> None:
        """The agent exits; the restart policy is not applied (see ``crash``)."""
        self._exit(exit_code, oom_killed)

    def crash(self, exit_code: int = 137) -> None:
        """The agent dies; like the engine, restart it if its policy allows."""
        self._exit(exit_code)
        policy = self.kwargs.get("restart_policy") or {}
        if policy.get("Name") == "on-failure" and self.restart_count < policy.get(
            "MaximumRetryCount", 0
        ):
            self.restart_count += 1
            self.status = "running"


class FakeContainers:
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    def create(self, image: str, command: List[str], name: str, **kwargs: Any) -> FakeContainer:
        unknown = set(kwargs) - {*RUN_CREATE_KWARGS, *RUN_HOST_CONFIG_KWARGS, "network"}
        if unknown:  # as docker-py itself refuses them
            raise TypeError(f"run() got unexpected keyword arguments {sorted(unknown)}")
        if name in self._engine.containers:
            raise api_error(409, f'Conflict. The container name "/{name}" is already in use')
        if image not in self._engine.local_images:
            raise ImageNotFound(f"No such image: {image}")
        network = kwargs.get("network")
        if network not in self._engine.networks:
            raise api_error(404, f"network {network} not found")
        for mount in kwargs.get("mounts") or []:
            if mount["Type"] == "bind" and mount["Source"] not in self._engine.host_paths:
                raise api_error(
                    400,
                    f'invalid mount config for type "bind": bind source path does not exist:'
                    f" {mount['Source']}",
                )
        container = FakeContainer(self._engine, name, image, list(command), dict(kwargs))
        self._engine.containers[name] = container
        return container

    def get(self, name: str) -> FakeContainer:
        if name not in self._engine.containers:
            raise api_error(404, f"No such container: {name}")
        return self._engine.containers[name]

    def list(
        self, all: bool = False, filters: Optional[Dict[str, Any]] = None
    ) -> List[FakeContainer]:
        return [
            c
            for c in self._engine.containers.values()
            if (all or c.status == "running") and _labels_match(c.labels, filters)
        ]


class FakeEngine:
    """The engine's state; ``FakeClient(engine)`` is what the scheduler talks to."""

    def __init__(self) -> None:
        self.local_images: Dict[str, FakeImage] = {}
        self.registry_images: set[str] = set()
        self.host_paths: set[str] = set()
        self.networks: Dict[str, FakeNetwork] = {}
        self.volumes: Dict[str, FakeVolume] = {}
        self.containers: Dict[str, FakeContainer] = {}
        self.calls: List[str] = []
        self.log_calls: List[Dict[str, Any]] = []
        self._clock = itertools.count()
        self.images = FakeImages(self)
        self.networks_api = FakeNetworks(self)
        self.containers_api = FakeContainers(self)
        self.volumes_api = FakeVolumes(self)

    def next_time(self) -> str:
        start = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
        moment = datetime.fromtimestamp(start + next(self._clock), tz=timezone.utc)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.123456789Z")


class FakeClient:
    """docker-py's ``DockerClient`` surface over a ``FakeEngine``."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.images = engine.images
        self.networks = engine.networks_api
        self.containers = engine.containers_api
        self.volumes = engine.volumes_api

    def ping(self) -> bool:
        return True
