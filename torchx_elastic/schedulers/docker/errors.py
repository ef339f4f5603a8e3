"""The docker scheduler's errors: each says what went wrong and what to do."""

from __future__ import annotations

from typing import Sequence

from torchx_elastic.schedulers.errors import UserError

ENGINE_HELP = (
    "start one: as root, ci/docker-engine.sh installs Debian's docker.io and starts dockerd;"
    " or point DOCKER_HOST at a running engine"
)
IMAGE_HELP = (
    "build it with docker/build-image.sh (torchx-elastic:latest, no registry needed),"
    " or docker load / docker pull it"
)


class DockerSchedulerError(UserError, RuntimeError):
    """Base of the docker scheduler's errors."""


class EngineUnreachableError(DockerSchedulerError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"no Docker engine reachable ({detail}); {ENGINE_HELP}")


class ImageMissingError(DockerSchedulerError):
    def __init__(self, image: str, detail: str) -> None:
        super().__init__(
            f"image {image!r} is not in the local Docker engine and {detail}; {IMAGE_HELP}"
        )


class NameClashError(DockerSchedulerError):
    def __init__(self, what: str, names: Sequence[str]) -> None:
        listed = ", ".join(names)
        remove = "docker rm -f" if what == "container" else "docker network rm"
        super().__init__(
            f"{what} name(s) already in use: {listed} (a job with the same id or its"
            f" leftovers); remove them with `{remove} {' '.join(names)}` or run again"
            " (a new run gets a new app id)"
        )


class ContainerStartError(DockerSchedulerError):
    def __init__(self, name: str, replica: str, image: str, command: str, detail: str) -> None:
        super().__init__(
            f"container {name} ({replica}) failed to start: {detail}; check that the image"
            f" {image!r} has the entrypoint {command!r} and that mount sources exist."
            " The job's containers and network were removed"
        )
