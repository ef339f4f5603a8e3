"""Errors of workspace builds and pushes, each saying what to check."""

from __future__ import annotations

from torchx_elastic.schedulers.errors import UserError


class WorkspaceError(UserError, RuntimeError):
    """A workspace could not be built into an image or pushed."""


class ImageRepoMissingError(UserError, ValueError):
    """A remote scheduler got a workspace but no ``image_repo`` to push it to."""

    def __init__(self, scheduler: str, what: str) -> None:
        super().__init__(
            f"{scheduler}: {what} must be pushed to a registry the cluster pulls from;"
            " set -cfg image_repo=REGISTRY/REPO (e.g. image_repo=localhost:5000/me/train),"
            " or pass --workspace '' to run the role's image as it is"
        )


class BaseImageMissingError(WorkspaceError):
    def __init__(self, image: str, detail: str) -> None:
        super().__init__(
            f"the workspace is built on the role's image {image}, which is not on the Docker"
            f" engine and could not be pulled: {detail}. Build or pull {image} first, or"
            " pass another base with --image"
        )


class WorkspaceBuildError(WorkspaceError):
    def __init__(self, image: str, workspace: str, dockerfile: str, detail: str) -> None:
        super().__init__(
            f"building the workspace image {image} from {workspace} ({dockerfile}) failed: {detail}"
        )


class PushRefusedError(WorkspaceError):
    def __init__(self, image: str, detail: str) -> None:
        registry = image.split("/", 1)[0] if "/" in image else "docker.io"
        super().__init__(
            f"pushing the workspace image {image} was refused: {detail}. Check that"
            f" image_repo names a repository you may push to, that the registry {registry}"
            f" answers, and that you are logged in (docker login {registry}); the cluster"
            " pulls it with the Secrets named by image_pull_secrets"
        )


class EngineUnreachableForWorkspaceError(WorkspaceError):
    def __init__(self, detail: str) -> None:
        super().__init__(
            f"building the workspace needs a Docker engine, and none answers ({detail});"
            " start one (see docs/docker.md), or pass --workspace '' to run the role's"
            " image as it is"
        )
