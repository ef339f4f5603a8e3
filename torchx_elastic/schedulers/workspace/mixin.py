"""torchx's workspace hooks for the docker and kubernetes schedulers.

``torchx run`` (``--workspace``, default: the current directory) calls
``build_workspace_and_update_role`` on the first role before the dry run; a remote
scheduler's dry run calls ``dryrun_push_images`` and its ``schedule`` ``push_images``,
the hooks of torchx's ``WorkspaceMixin``. Here the first hook only *plans*: it reads the
workspace into a build context, names the image by its content digest and points the role
at it. The build itself happens in ``schedule`` (``build_workspace_images``), so a dry run
shows the image that will be built (and pushed) without building it, and an unchanged
workspace, whose image is on the engine already, builds nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Iterable, Mapping, Optional, Tuple

from torchx.specs import AppDef, CfgVal, Role, runopts
from torchx.workspace.api import WorkspaceMixin

from torchx_elastic.schedulers.workspace.errors import (
    EngineUnreachableForWorkspaceError,
    ImageRepoMissingError,
    WorkspaceError,
)
from torchx_elastic.schedulers.workspace.image import LOCAL_REPO, WorkspaceBuild, split_image

if TYPE_CHECKING:
    from docker import DockerClient
    from torchx_elastic.schedulers.workspace.context import WorkspaceContext

logger = logging.getLogger(__name__)

IMAGES_TO_PUSH = Dict[str, Tuple[str, str]]  # local image -> (repository, tag), as torchx's
_IMAGE_ID_PREFIX = "sha256:"


class WorkspaceImages(WorkspaceMixin[IMAGES_TO_PUSH]):
    """Builds the workspace as a layer on the role's image (``Dockerfile.torchx`` when the
    workspace has one, else ``COPY . .``), named ``<image_repo or torchx-workspace>:<digest>``.

    ``push_workspace_images``: a remote scheduler pushes the image to ``image_repo`` and
    refuses a workspace without one. ``docker_client`` is the engine (tests pass their own).
    """

    push_workspace_images: bool = False

    def __init__(self, *args: Any, docker_client: Optional[DockerClient] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._workspace_docker = docker_client
        self._workspace_plans: Dict[str, WorkspaceBuild] = {}
        self._workspace_contexts: Dict[str, WorkspaceContext] = {}
        self._workspace_quiet = False

    def workspace_opts(self) -> runopts:
        """Empty: ``image_repo`` and ``quiet`` are declared with the scheduler's options."""
        return runopts()

    def workspace_docker_client(self) -> DockerClient:
        if self._workspace_docker is None:
            import docker

            try:
                client = docker.from_env()
                client.ping()
            except docker.errors.DockerException as e:
                raise EngineUnreachableForWorkspaceError(str(e)) from e
            self._workspace_docker = client
        return self._workspace_docker

    def workspace_base_image_id(
        self, client: DockerClient, image: str, cfg: Mapping[str, CfgVal]
    ) -> str:
        """The id of the role's image on the engine (pulled when missing)."""
        from torchx_elastic.schedulers.workspace.image import ensure_base_image

        return ensure_base_image(client, image)

    # -- torchx's hooks ---------------------------------------------------------------------

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Point ``role.image`` at the workspace's image, ``<repo>:<content digest>``."""
        from torchx_elastic.schedulers.workspace.context import build_context
        from torchx_elastic.schedulers.workspace.image import plan

        image_repo = cfg.get("image_repo")
        self._workspace_quiet = bool(cfg.get("quiet"))
        if self.push_workspace_images and not image_repo:
            raise ImageRepoMissingError(self.backend_name(), f"the workspace {workspace}")
        client = self.workspace_docker_client()
        base_id = self.workspace_base_image_id(client, role.image, cfg)
        context = build_context(workspace)
        build = plan(
            client,
            base_image=role.image,
            base_image_id=base_id,
            workspace=workspace,
            repo=str(image_repo or LOCAL_REPO),
            context=context,
            push=self.push_workspace_images,
        )
        if build.built:
            context.close()
            logger.info("workspace %s unchanged: reusing image %s", workspace, build.image)
        else:
            old = self._workspace_contexts.pop(build.image, None)
            if old is not None:
                old.close()
            self._workspace_contexts[build.image] = context
        self._workspace_plans[build.image] = build
        role.image = build.image

    def dryrun_push_images(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> IMAGES_TO_PUSH:
        """The images to push: workspace images, and (as torchx does) roles given as local
        image ids (``sha256:...``), which are renamed ``<image_repo>:<id>``."""
        image_repo = cfg.get("image_repo")
        to_push: IMAGES_TO_PUSH = {}
        for role in app.roles:
            planned = self._workspace_plans.get(role.image)
            if planned is not None and planned.push:
                to_push[role.image] = split_image(role.image)
            elif role.image.startswith(_IMAGE_ID_PREFIX):
                if not image_repo:
                    raise ImageRepoMissingError(
                        self.backend_name(), f"the local image {role.image}"
                    )
                tag = role.image[len(_IMAGE_ID_PREFIX) :]
                to_push[role.image] = (str(image_repo), tag)
                role.image = f"{image_repo}:{tag}"
        return to_push

    def push_images(self, images_to_push: IMAGES_TO_PUSH) -> None:
        from torchx_elastic.schedulers.workspace.image import push

        if not images_to_push:
            return
        client = self.workspace_docker_client()
        for local, (repo, tag) in images_to_push.items():
            remote = f"{repo}:{tag}"
            if local != remote:
                client.images.get(local).tag(repo, tag=tag)
            push(client, remote, self._workspace_quiet)

    # -- what schedule() calls ---------------------------------------------------------------

    def workspace_builds(self, app: AppDef) -> Tuple[WorkspaceBuild, ...]:
        """The planned workspace images of ``app``'s roles (for the dry-run request)."""
        images = dict.fromkeys(role.image for role in app.roles)
        return tuple(self._workspace_plans[i] for i in images if i in self._workspace_plans)

    def build_workspace_images(self, builds: Iterable[WorkspaceBuild]) -> None:
        """Build what is not on the engine yet (a plan made by another scheduler object, or
        an image removed since the dry run, is rebuilt from its workspace)."""
        from torchx_elastic.schedulers.workspace.context import build_context
        from torchx_elastic.schedulers.workspace.image import build, local_image_id, plan

        builds = tuple(builds)
        if not builds:
            return
        client = self.workspace_docker_client()
        for planned in builds:
            if local_image_id(client, planned.image) is not None:
                continue
            context = self._workspace_contexts.pop(planned.image, None)
            if context is None:
                context = build_context(planned.workspace)
                repo = split_image(planned.image)[0]
                again = plan(
                    client,
                    planned.base_image,
                    planned.base_image_id,
                    planned.workspace,
                    repo,
                    context,
                    planned.push,
                )
                if again.image != planned.image:
                    context.close()
                    raise WorkspaceError(
                        f"the workspace {planned.workspace} changed after the dry run that"
                        f" named its image {planned.image}; submit the job again"
                    )
            try:
                build(client, planned, context, self._workspace_quiet)
            finally:
                context.close()

    def backend_name(self) -> str:
        backend = getattr(self, "backend", None)
        return str(backend or type(self).__name__)
