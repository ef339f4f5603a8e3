"""torchx's workspace hooks on our schedulers, without an engine: what is refused, and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torchx import specs
from torchx.workspace.api import WorkspaceMixin

from torchx_elastic.schedulers.docker import create_scheduler as create_docker_scheduler
from torchx_elastic.schedulers.kubernetes import create_scheduler as create_k8s_scheduler
from torchx_elastic.schedulers.workspace.errors import (
    EngineUnreachableForWorkspaceError,
    ImageRepoMissingError,
)

REPO_MISSING = (
    "kubernetes: the workspace {} must be pushed to a registry the cluster pulls from;"
    " set -cfg image_repo=REGISTRY/REPO (e.g. image_repo=localhost:5000/me/train),"
    " or pass --workspace '' to run the role's image as it is"
)


def _role(image: str = "torchx-elastic:latest") -> specs.Role:
    return specs.Role(name="main", image=image, entrypoint="true")


def test_both_schedulers_are_torchx_workspace_schedulers() -> None:
    for scheduler in (create_docker_scheduler("s"), create_k8s_scheduler("s")):
        assert isinstance(scheduler, WorkspaceMixin)
        opts = scheduler.run_opts()
        image_repo, quiet = opts.get("image_repo"), opts.get("quiet")
        assert image_repo is not None and image_repo.default is None
        assert quiet is not None and quiet.default is False


def test_kubernetes_refuses_a_workspace_without_image_repo(tmp_path: Path) -> None:
    scheduler = create_k8s_scheduler("s")
    cfg = scheduler.run_opts().resolve({})
    with pytest.raises(ImageRepoMissingError) as error:
        scheduler.build_workspace_and_update_role(_role(), str(tmp_path), cfg)
    assert str(error.value) == REPO_MISSING.format(tmp_path)


def test_the_cli_tells_a_kubernetes_user_to_set_image_repo(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "torchx"),
            "run",
            "--dryrun",
            "-s",
            "kubernetes",
            "dist.ddp",
            "--script",
            "train.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert REPO_MISSING.format(f"file://{tmp_path}") in result.stderr


def test_local_image_ids_are_renamed_into_image_repo_as_torchx_does() -> None:
    scheduler = create_k8s_scheduler("s")
    app = specs.AppDef(name="a", roles=[_role("sha256:abc123")])
    to_push = scheduler.dryrun_push_images(app, {"image_repo": "registry.example/me/train"})
    assert to_push == {"sha256:abc123": ("registry.example/me/train", "abc123")}
    assert app.roles[0].image == "registry.example/me/train:abc123"
    # an image from a registry is left alone
    app = specs.AppDef(name="a", roles=[_role("registry.example/base:1")])
    assert scheduler.dryrun_push_images(app, {"image_repo": "r.example/x"}) == {}


def test_a_local_image_id_without_image_repo() -> None:
    scheduler = create_k8s_scheduler("s")
    app = specs.AppDef(name="a", roles=[_role("sha256:abc123")])
    with pytest.raises(ImageRepoMissingError) as error:
        scheduler.dryrun_push_images(app, {})
    assert str(error.value).startswith(
        "kubernetes: the local image sha256:abc123 must be pushed to a registry"
    )


def test_no_engine_says_how_to_run_without_a_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    scheduler = create_k8s_scheduler("s")
    cfg = scheduler.run_opts().resolve({"image_repo": "localhost:5000/x"})
    with pytest.raises(EngineUnreachableForWorkspaceError) as error:
        scheduler.build_workspace_and_update_role(_role(), str(tmp_path), cfg)
    message = str(error.value)
    assert message.startswith("building the workspace needs a Docker engine, and none answers (")
    assert message.endswith(
        "); start one (see docs/docker.md), or pass --workspace '' to run the role's image as it is"
    )


def test_the_dry_run_names_the_image_to_build_and_push() -> None:
    from torchx_elastic.schedulers.kubernetes.names import JobNames
    from torchx_elastic.schedulers.kubernetes.request import KubernetesRequest
    from torchx_elastic.schedulers.workspace import WorkspaceBuild

    image = "localhost:5000/me/train:" + "ab" * 32
    build = WorkspaceBuild(
        image=image,
        base_image="torchx-elastic:latest",
        base_image_id="sha256:" + "cd" * 32,
        workspace="file:///home/me/project",
        dockerfile="Dockerfile.torchx",
        context_files=3,
        context_bytes=10240,
        built=False,
        push=True,
    )
    request = KubernetesRequest(
        "job",
        JobNames("train-x", "default"),
        [],
        workspace_builds=(build,),
        images_to_push={image: ("localhost:5000/me/train", "ab" * 32)},
    )
    assert request.header() == (
        f"# workspace image {image} (to build): file:///home/me/project (3 files,"
        " Dockerfile.torchx) on torchx-elastic:latest\n"
        f"# push {image} before creating the job\n"
    )
    assert str(request).startswith(request.header())
