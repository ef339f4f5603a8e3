"""Fixtures of the docker scheduler's tests: a fake engine, and the real one when there is one.

Tests marked ``docker`` need a real engine and the image ``torchx-elastic:latest``. Without
them they skip locally, with the command that gets them; in CI (tests/ci.py) they fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from docker_fake_engine import FakeClient, FakeEngine, FakeImage

from tests.ci import unavailable
from tests.waiting import wait_until
from torchx_elastic.schedulers.docker import DockerScheduler, create_scheduler

REPO = Path(__file__).resolve().parents[2]
IMAGE = "torchx-elastic:latest"
GET_ENGINE = "as root: ci/docker-engine.sh (installs Debian's docker.io, starts dockerd)"
GET_IMAGE = "docker/build-image.sh (builds torchx-elastic:latest with no registry)"


@pytest.fixture
def engine() -> FakeEngine:
    fake = FakeEngine()
    fake.local_images[IMAGE] = FakeImage(IMAGE)
    return fake


@pytest.fixture
def scheduler(engine: FakeEngine) -> DockerScheduler:
    return create_scheduler("test", client=FakeClient(engine))


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A client of the real engine; skips (fails in CI) when none answers."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        unavailable(f"no Docker engine reachable ({e}); to get one, {GET_ENGINE}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def docker_image(docker_client: Any) -> str:
    """The project image, built or brought up to date by docker/build-image.sh.

    The script is cached (a hash of its inputs in a label): when the sources did not
    change it returns in a second or two. TORCHX_ELASTIC_SKIP_IMAGE_BUILD=1 uses the
    image as it is.
    """
    import docker

    if os.environ.get("TORCHX_ELASTIC_SKIP_IMAGE_BUILD") != "1":
        build = subprocess.run(
            [str(REPO / "docker" / "build-image.sh")],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
        )
        if build.returncode != 0:
            unavailable(f"{GET_IMAGE} failed:\n{build.stderr[-3000:]}")
    try:
        docker_client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        unavailable(f"image {IMAGE} is missing; build it with {GET_IMAGE}")
    return IMAGE


# -- a real image registry on the loopback address ----------------------------------------

REGISTRY = "localhost:5000"
REGISTRY_URL = "http://127.0.0.1:5000/v2/"
GET_REGISTRY = "as root: ci/docker-registry.sh (installs Debian's docker-registry)"
REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:5000
"""


def registry_answers() -> bool:
    """A distribution registry answers on REGISTRY_URL (its /v2/ endpoint and header)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(REGISTRY_URL, timeout=2) as response:
            return bool(response.headers.get("Docker-Distribution-Api-Version"))
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``localhost:5000``: Debian's docker-registry, started here unless one answers already
    (then used as it is); what this fixture started, it stops."""
    import shutil

    if registry_answers():
        yield REGISTRY
        return
    executable = shutil.which("docker-registry")
    if executable is None:
        unavailable(f"no docker-registry command; to get one, {GET_REGISTRY}")
    root = tmp_path_factory.mktemp("registry")
    config = root / "config.yml"
    config.write_text(REGISTRY_CONFIG.format(root=root / "data"))
    log_path = root / "registry.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(executable), "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:  # it answers, or it ended (another one may have won the port meanwhile: used)
        wait_until(
            lambda: registry_answers() or process.poll() is not None,
            what="docker-registry's answer",
            every_s=0.2,
        )
    except AssertionError:
        pass
    if not registry_answers():
        process.kill()
        pytest.fail(f"docker-registry did not start:\n{log_path.read_text()[-3000:]}")
    try:
        yield REGISTRY
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
