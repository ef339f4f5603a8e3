"""A workspace as an image: planned (named by a content digest), built, pushed.

The name is ``<repo>:<digest>``, where the digest (sha256, hex) covers the build context,
the base image's id and the build arguments: an unchanged workspace on an unchanged base
keeps its name, so a second run finds the image and builds nothing. A change rebuilds
through the engine's layer cache (only the steps after the first changed one run).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Tuple

import torchx

from torchx_elastic.schedulers.workspace.errors import (
    BaseImageMissingError,
    PushRefusedError,
    WorkspaceBuildError,
)

if TYPE_CHECKING:
    from docker import DockerClient
    from torchx_elastic.schedulers.workspace.context import WorkspaceContext

logger = logging.getLogger(__name__)

LOCAL_REPO = "torchx-workspace"  # the repository of workspace images without image_repo
LABEL_TORCHX_VERSION = "torchx.pytorch.org/version"
LABEL_DIGEST = "torchx-elastic/workspace-digest"
LABEL_BASE = "torchx-elastic/workspace-base"


@dataclass(frozen=True)
class WorkspaceBuild:
    """What the dry run shows of a workspace: the image it becomes and how."""

    image: str  # <repo>:<digest>
    base_image: str
    base_image_id: str
    workspace: str
    dockerfile: str
    context_files: int
    context_bytes: int
    built: bool  # the image is on the engine already: nothing to build
    push: bool  # pushed to its repository before the job starts

    @property
    def build_args(self) -> Dict[str, str]:
        """torchx's build arguments of ``Dockerfile.torchx``."""
        return {"IMAGE": self.base_image, "WORKSPACE": self.workspace}


def split_image(image: str) -> Tuple[str, str]:
    """``repo:tag`` as (repo, tag); a registry port is part of the repo."""
    repo, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return repo, tag


def image_digest(context_digest: str, base_image_id: str, build_args: Dict[str, str]) -> str:
    text = json.dumps([context_digest, base_image_id, build_args], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def local_image_id(client: DockerClient, image: str) -> Optional[str]:
    from docker.errors import ImageNotFound

    try:
        found: str = client.images.get(image).id
        return found
    except ImageNotFound:
        return None


def ensure_base_image(client: DockerClient, image: str) -> str:
    """The id of ``image`` on the engine, pulled first when it is not there."""
    from docker.errors import DockerException

    found = local_image_id(client, image)
    if found is not None:
        return found
    logger.info("pulling the workspace's base image %s", image)
    try:
        client.images.pull(*split_image(image))
    except DockerException as e:
        raise BaseImageMissingError(image, str(getattr(e, "explanation", None) or e)) from e
    pulled = local_image_id(client, image)
    if pulled is None:
        raise BaseImageMissingError(image, "the pull reported no image")
    return pulled


def plan(
    client: DockerClient,
    base_image: str,
    base_image_id: str,
    workspace: str,
    repo: str,
    context: WorkspaceContext,
    push: bool,
) -> WorkspaceBuild:
    args = {"IMAGE": base_image, "WORKSPACE": workspace}
    image = f"{repo}:{image_digest(context.digest, base_image_id, args)}"
    return WorkspaceBuild(
        image=image,
        base_image=base_image,
        base_image_id=base_image_id,
        workspace=workspace,
        dockerfile=context.dockerfile,
        context_files=context.files,
        context_bytes=context.size_bytes,
        built=local_image_id(client, image) is not None,
        push=push,
    )


def _print(message: str, quiet: bool) -> None:
    message = message.rstrip("\r\n")
    if message and not quiet:
        logger.info("%s", message)


def build(
    client: DockerClient, plan: WorkspaceBuild, context: WorkspaceContext, quiet: bool
) -> str:
    """Build ``plan.image`` from ``context``; its id. Steps that did not change come from
    the engine's layer cache."""
    from docker.errors import DockerException
    from torchx.workspace.docker_workspace import TORCHX_DOCKERFILE

    logger.info(
        "building workspace image %s from %s on %s", plan.image, plan.workspace, plan.base_image
    )
    context.file.seek(0)
    image_id: Optional[str] = None
    try:
        events: Iterable[Dict[str, Any]] = client.api.build(
            fileobj=context.file,
            custom_context=True,
            dockerfile=TORCHX_DOCKERFILE,
            tag=plan.image,
            buildargs=plan.build_args,
            pull=False,
            rm=True,
            forcerm=True,
            decode=True,
            labels={
                LABEL_TORCHX_VERSION: torchx.__version__,
                LABEL_DIGEST: split_image(plan.image)[1],
                LABEL_BASE: f"{plan.base_image}@{plan.base_image_id}",
            },
        )
        for event in events:
            if "error" in event:
                detail = event.get("errorDetail", {}).get("message") or event["error"]
                raise WorkspaceBuildError(plan.image, plan.workspace, plan.dockerfile, detail)
            if "stream" in event:
                _print(event["stream"], quiet)
            if "aux" in event and "ID" in event["aux"]:
                image_id = event["aux"]["ID"]
    except DockerException as e:
        detail = str(getattr(e, "explanation", None) or e)
        raise WorkspaceBuildError(plan.image, plan.workspace, plan.dockerfile, detail) from e
    if image_id is None:
        image_id = local_image_id(client, plan.image)
    if image_id is None:
        raise WorkspaceBuildError(
            plan.image, plan.workspace, plan.dockerfile, "the engine reported no image"
        )
    return image_id


def push(client: DockerClient, image: str, quiet: bool) -> None:
    """``docker push image``; a refusal raises :class:`PushRefusedError` saying what to check."""
    from docker.errors import DockerException

    repo, tag = split_image(image)
    logger.info("pushing workspace image %s", image)
    try:
        events: Iterable[Dict[str, Any]] = client.api.push(repo, tag=tag, stream=True, decode=True)
        for event in events:
            if "error" in event:
                detail = event.get("errorDetail", {}).get("message") or event["error"]
                raise PushRefusedError(image, detail)
            status = event.get("status")
            if status and not quiet and "progress" not in event:
                _print(f"{event['id']}: {status}" if "id" in event else status, quiet)
    except DockerException as e:
        raise PushRefusedError(image, str(getattr(e, "explanation", None) or e)) from e
