"""Workspaces end to end: a real Docker engine, a real registry, the real torchx CLI.

The user's directory holds a ``train.py`` the image never had; ``torchx run`` from there
runs it in every container (docker) or pushes it to ``image_repo`` (kubernetes).
Needs the engine and ``torchx-elastic:latest`` (see conftest.py), and Debian's
docker-registry for the push tests (started by the ``registry`` fixture).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from torchx import specs

from tests.kubernetes.fake_api import FakeCluster
from torchx_elastic.contract import RANK0_ENV
from torchx_elastic.schedulers.docker import create_scheduler as create_docker_scheduler
from torchx_elastic.schedulers.kubernetes import create_scheduler as create_k8s_scheduler
from torchx_elastic.schedulers.workspace.errors import (
    BaseImageMissingError,
    PushRefusedError,
    WorkspaceBuildError,
    WorkspaceError,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

BIN = Path(sys.executable).parent
TRAIN_PY = """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
# the image's non-root user can write where the workspace was copied
with open(f"written-by-rank-{dist.get_rank()}", "w") as f:
    f.write(str(os.getuid()))
total = torch.ones(1)
dist.all_reduce(total)
print(f"MARKER {VERSION} rank {dist.get_rank()}/{dist.get_world_size()} sum {int(total.item())}")
dist.barrier()
dist.destroy_process_group()
"""
WORKSPACE_IMAGE = re.compile(r"(torchx-workspace:[0-9a-f]{64})")


def write_train_py(workspace: Path, marker: str, version: str) -> None:
    text = TRAIN_PY.replace("MARKER", marker).replace("{VERSION}", version)
    (workspace / "train.py").write_text(text)


def torchx(
    *args: str, cwd: Path, env: Optional[Dict[str, str]] = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [str(BIN / "torchx"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=check,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def wait_succeeded(handle: str, cwd: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = torchx("status", handle, cwd=cwd).stdout
        if re.search(r"State: (SUCCEEDED|FAILED|CANCELLED)\b", text):
            break
        time.sleep(1)
    logs = torchx("log", handle, cwd=cwd, check=False).stdout
    assert "State: SUCCEEDED" in text, f"{handle}:\n{text}\n{logs}"


def job_lines(handle: str, cwd: Path, marker: str) -> List[str]:
    out = torchx("log", handle, cwd=cwd).stdout
    return sorted(re.findall(rf"{marker} \S+ rank \d/\d sum \d", out))


@pytest.fixture(autouse=True)
def _no_workspace_image_left(docker_client: Any) -> Iterator[None]:
    """The workspace images a test built go afterwards (each holds the base image's GB)."""
    before = {image.id for image in docker_client.images.list(name="torchx-workspace")}
    yield
    for image in docker_client.images.list(name="torchx-workspace"):
        if image.id not in before:
            docker_client.images.remove(image.id, force=True)


@pytest.fixture
def handles(docker_client: Any) -> Iterator[List[str]]:
    """Handles of the jobs a test ran; their containers and networks go afterwards."""
    started: List[str] = []
    yield started
    scheduler = create_docker_scheduler("cleanup", client=docker_client)
    for handle in started:
        scheduler.delete(handle.rsplit("/", 1)[-1])


def run_docker(workspace: Path, handles: List[str]) -> Tuple[str, str, float]:
    """``torchx run -s docker dist.ddp -j 2x2 --script train.py`` in ``workspace``:
    (handle, stderr, seconds)."""
    start = time.monotonic()
    result = torchx(
        "run", "-s", "docker", "dist.ddp", "-j", "2x2", "--script", "train.py", cwd=workspace
    )
    seconds = time.monotonic() - start
    match = re.search(r"^(docker://\S+/\S+)$", result.stdout, re.MULTILINE)
    assert match, f"no app handle:\n{result.stdout}\n{result.stderr}"
    handles.append(match.group(1))
    return match.group(1), result.stderr, seconds


def test_torchx_run_from_a_directory_runs_its_script_in_every_container(
    docker_image: str,
    docker_client: Any,
    handles: List[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    marker = f"ws{uuid.uuid4().hex[:8]}"  # a script no image ever had
    write_train_py(workspace, marker, "v1")

    handle, stderr, first_s = run_docker(workspace, handles)
    built = WORKSPACE_IMAGE.search(stderr)
    assert built and "building workspace image" in stderr, stderr
    first_image = built.group(1)
    wait_succeeded(handle, workspace)
    assert job_lines(handle, workspace, marker) == [
        f"{marker} v1 rank {r}/4 sum 4" for r in range(4)
    ]

    write_train_py(workspace, marker, "v2")  # an edit: a new image, the new script runs
    handle, stderr, edited_s = run_docker(workspace, handles)
    built = WORKSPACE_IMAGE.search(stderr)
    assert built and "building workspace image" in stderr, stderr
    second_image = built.group(1)
    assert second_image != first_image
    wait_succeeded(handle, workspace)
    assert job_lines(handle, workspace, marker) == [
        f"{marker} v2 rank {r}/4 sum 4" for r in range(4)
    ]
    created = docker_client.images.get(second_image).attrs["Created"]

    handle, stderr, unchanged_s = run_docker(workspace, handles)  # unchanged: builds nothing
    assert "building workspace image" not in stderr, stderr
    assert f"unchanged: reusing image {second_image}" in stderr, stderr
    assert docker_client.images.get(second_image).attrs["Created"] == created
    wait_succeeded(handle, workspace)
    assert job_lines(handle, workspace, marker) == [
        f"{marker} v2 rank {r}/4 sum 4" for r in range(4)
    ]
    with capsys.disabled():
        print(
            f"\n[workspace timings] torchx run -s docker dist.ddp -j 2x2 --script train.py:"
            f" first build {first_s:.1f}s, after an edit {edited_s:.1f}s,"
            f" unchanged {unchanged_s:.1f}s"
        )


def _plan_and_build(
    scheduler: Any, workspace: Path, cfg: Dict[str, Any], image: str = "torchx-elastic:latest"
) -> Any:
    role = specs.Role(name="main", image=image, entrypoint="sh", args=["-c", "true"])
    app = specs.AppDef(name="ws", roles=[role])
    resolved = scheduler.run_opts().resolve(cfg)
    scheduler.build_workspace_and_update_role(role, str(workspace), resolved)
    info = scheduler.submit_dryrun(app, resolved)
    scheduler.build_workspace_images(info.request.workspace_builds)
    return info


def test_dockerfile_torchx_layers_come_from_the_cache_and_dockerignore_is_honoured(
    docker_image: str, docker_client: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "Dockerfile.torchx").write_text(
        "ARG IMAGE\nFROM $IMAGE\nCOPY requirements.txt .\n"
        # as the image's non-root user: its workdir and its Python environment are writable
        "RUN echo installing requirements > requirements-installed && touch"
        " $(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')/checked"
        "\nCOPY . .\n"
    )
    (workspace / "requirements.txt").write_text("numpy\n")
    (workspace / ".dockerignore").write_text("secrets/\n*.ckpt\n")
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "token").write_text("hunter2")
    (workspace / "model.ckpt").write_text("weights")
    (workspace / "train.py").write_text("print('one')\n")
    scheduler = create_docker_scheduler("ws", client=docker_client)

    caplog.set_level(logging.INFO)
    first = _plan_and_build(scheduler, workspace, {})
    image = first.request.workspace_builds[0].image
    listing = docker_client.containers.run(
        image, ["sh", "-c", "ls -A; cat requirements-installed"], remove=True
    ).decode()
    assert "train.py" in listing and "installing requirements" in listing
    assert "secrets" not in listing and "model.ckpt" not in listing

    (workspace / "train.py").write_text("print('two')\n")
    caplog.clear()
    second = _plan_and_build(scheduler, workspace, {})
    output = caplog.text
    # the RUN step before the changed COPY comes from the layer cache
    run_step = output.index("RUN echo installing requirements")
    assert "Using cache" in output[run_step : output.index("COPY . .", run_step)], output
    assert second.request.workspace_builds[0].image != image


def test_dryrun_shows_the_image_to_build_and_push_and_builds_nothing(
    docker_image: str, docker_client: Any, tmp_path: Path
) -> None:
    import docker

    workspace = tmp_path / "project"
    workspace.mkdir()
    write_train_py(workspace, f"ws{uuid.uuid4().hex[:8]}", "v1")
    repo = "localhost:5000/torchx-elastic-tests/dryrun"
    out = torchx(
        "run",
        "--dryrun",
        "-s",
        "kubernetes",
        "-cfg",
        f"image_repo={repo},image_pull_secrets=regcred",
        "dist.ddp",
        "-j",
        "1x2",
        "--script",
        "train.py",
        cwd=workspace,
        env={"TORCHX_CONTEXT_NAME": "test"},
    ).stdout
    match = re.search(
        rf"^# workspace image ({re.escape(repo)}:[0-9a-f]{{64}}) \(to build\):"
        rf" file://{re.escape(str(workspace))} \(1 files, torchx default"
        r" \(COPY \. \.\)\) on torchx-elastic:latest$",
        out,
        re.MULTILINE,
    )
    assert match, out
    image = match.group(1)
    assert f"# push {image} before creating the job" in out
    assert f"image: {image}" in out and "- name: regcred" in out
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(image)

    out = torchx(
        "run", "--dryrun", "-s", "docker", "dist.ddp", "--script", "train.py", cwd=workspace
    ).stdout
    local = WORKSPACE_IMAGE.search(out)
    assert local and "workspace_builds:" in out and "built: false" in out, out
    assert f"image: {local.group(1)}" in out
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(local.group(1))


def test_kubernetes_pushes_the_workspace_image_that_pulls_back_and_runs(
    docker_image: str, docker_client: Any, registry: str, tmp_path: Path
) -> None:
    """Through the real CLI against the fake cluster: the image reaches the real registry;
    removed locally, it pulls back from there and runs the job's command."""
    import docker

    workspace = tmp_path / "project"
    workspace.mkdir()
    marker = f"ws{uuid.uuid4().hex[:8]}"
    write_train_py(workspace, marker, "v1")
    repo = f"{registry}/torchx-elastic-tests/{marker}"
    cluster = FakeCluster()
    cluster.start()
    try:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        result = torchx(
            "run",
            "-s",
            "kubernetes",
            "-cfg",
            f"image_repo={repo},image_pull_secrets=regcred",
            "dist.ddp",
            "-j",
            "1x2",
            "--script",
            "train.py",
            cwd=workspace,
            env={"KUBECONFIG": str(kubeconfig)},
        )
        [(key, job)] = cluster.objects["jobs"].items()
    finally:
        cluster.stop()
    assert f"pushing workspace image {repo}:" in result.stderr, result.stderr
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    image = container["image"]
    assert re.fullmatch(rf"{re.escape(repo)}:[0-9a-f]{{64}}", image), image
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]

    docker_client.images.remove(image)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(image)
    docker_client.images.pull(*image.rsplit(":", 1))  # back from the registry
    # one node here: the rendezvous falls back to localhost without the pod's DNS name
    env = {
        e["name"]: e["value"]
        for e in container.get("env", [])
        if "value" in e and e["name"] != RANK0_ENV
    }
    output = docker_client.containers.run(
        image,
        [*container["command"], *container.get("args", [])],
        environment=env,
        remove=True,
        stdout=True,
        stderr=True,
    ).decode()
    assert sorted(re.findall(rf"{marker} v1 rank \d/2 sum 2", output)) == [
        f"{marker} v1 rank 0/2 sum 2",
        f"{marker} v1 rank 1/2 sum 2",
    ], output
    docker_client.images.remove(image)


def test_a_refused_push_names_the_image_and_what_to_check(
    docker_image: str, docker_client: Any, tmp_path: Path
) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "train.py").write_text("print('x')\n")
    scheduler = create_k8s_scheduler("ws", docker_client=docker_client)
    repo = "localhost:5999/nobody/listens"  # no registry there
    info = _plan_and_build(scheduler, workspace, {"image_repo": repo})
    [image] = info.request.images_to_push
    with pytest.raises(PushRefusedError) as error:
        scheduler.push_images(info.request.images_to_push)
    message = str(error.value)
    assert message.startswith(f"pushing the workspace image {image} was refused: ")
    assert message.endswith(
        ". Check that image_repo names a repository you may push to, that the registry"
        " localhost:5999 answers, and that you are logged in (docker login localhost:5999);"
        " the cluster pulls it with the Secrets named by image_pull_secrets"
    )
    assert "connection refused" in message
    docker_client.images.remove(image)


def test_build_errors_name_the_workspace_and_the_step(
    docker_image: str, docker_client: Any, tmp_path: Path
) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "Dockerfile.torchx").write_text("ARG IMAGE\nFROM $IMAGE\nRUN exit 3\n")
    scheduler = create_docker_scheduler("ws", client=docker_client)
    with pytest.raises(WorkspaceBuildError) as error:
        _plan_and_build(scheduler, workspace, {"quiet": True})
    assert re.fullmatch(
        r"building the workspace image torchx-workspace:[0-9a-f]{64} from "
        rf"{re.escape(str(workspace))} \(Dockerfile.torchx\) failed: The command '/bin/sh -c"
        r" exit 3' returned a non-zero code: 3",
        str(error.value),
    ), str(error.value)


def test_a_base_image_that_cannot_be_pulled(docker_client: Any, tmp_path: Path) -> None:
    scheduler = create_k8s_scheduler("ws", docker_client=docker_client)
    with pytest.raises(BaseImageMissingError) as error:
        _plan_and_build(
            scheduler,
            tmp_path,
            {"image_repo": "localhost:5000/x"},
            image="localhost:5999/no/such-image:1",
        )
    message = str(error.value)
    assert message.startswith(
        "the workspace is built on the role's image localhost:5999/no/such-image:1, which is"
        " not on the Docker engine and could not be pulled: "
    )
    assert message.endswith(
        ". Build or pull localhost:5999/no/such-image:1 first, or pass another base with --image"
    )


def test_a_workspace_edited_between_dry_run_and_submit_is_not_built_under_the_old_name(
    docker_image: str, docker_client: Any, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(f"print('{uuid.uuid4().hex}')\n")
    planner = create_docker_scheduler("ws", client=docker_client)
    role = specs.Role(name="main", image=docker_image, entrypoint="true")
    app = specs.AppDef(name="ws", roles=[role])
    cfg = planner.run_opts().resolve({})
    planner.build_workspace_and_update_role(role, str(tmp_path), cfg)
    info = planner.submit_dryrun(app, cfg)
    (tmp_path / "train.py").write_text("print('edited')\n")
    other = create_docker_scheduler("ws", client=docker_client)  # has not the dry run's context
    with pytest.raises(WorkspaceError) as error:
        other.build_workspace_images(info.request.workspace_builds)
    assert str(error.value) == (
        f"the workspace {tmp_path} changed after the dry run that named its image"
        f" {role.image}; submit the job again"
    )
