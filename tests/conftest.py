"""Shared helpers: run the real torchx CLI and the real agent as subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


# TORCHX_ELASTIC_TEST_SRC=/path/to/a/checkout: the subprocesses (agent, torchx) import
# torchx_elastic from that checkout instead of this one, to run these tests against another
# branch's code; otherwise PYTHONPATH is dropped so that the installed package is used.
TEST_SRC_ENV = "TORCHX_ELASTIC_TEST_SRC"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if env.get(TEST_SRC_ENV):
        env["PYTHONPATH"] = env[TEST_SRC_ENV]
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


# what says where an agent meets: without any, it takes torchrun's one-node default
_RENDEZVOUS_FLAGS = ("standalone", "rdzv-endpoint", "rdzv_endpoint", "master-port", "master_port")


def one_node_port(args: Sequence[str], env: dict[str, str]) -> dict[str, str]:
    """``env`` for an agent started with ``args``: where they say nowhere to meet and this
    torch's torchrun then takes the fixed port 29500 for one node (torch 2.4; later ones
    take a free port), a free port in ``PET_MASTER_PORT`` (torchrun's variable for
    ``--master-port``): the test lanes run side by side, and another lane's job may hold
    29500 (EADDRINUSE)."""
    from torchx_elastic.agent import compat

    said = any(flag in arg for arg in args for flag in _RENDEZVOUS_FLAGS)
    if said or "PET_MASTER_PORT" in env or compat.torchrun_defaults()["master_port"] is None:
        return env
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return {**env, "PET_MASTER_PORT": str(sock.getsockname()[1])}


def run_torchx(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 240
) -> subprocess.CompletedProcess[str]:
    """``torchx ARGS`` in ``cwd``, output captured as text."""
    return subprocess.run(
        [str(BIN / "torchx"), *args],
        cwd=cwd,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def run_agent(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m torchx_elastic.agent ARGS`` in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "torchx_elastic.agent", *args],
        cwd=cwd,
        env=one_node_port(args, _env(env)),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty working directory with the example scripts copied in."""
    for script in (REPO / "examples").glob("*.py"):
        (tmp_path / script.name).write_text(script.read_text())
    return tmp_path


@pytest.fixture(autouse=True)
def _process_environment_restored() -> Iterator[None]:
    """What a test sets in this process's environment (the agent's in-process setup does:
    ``OMP_NUM_THREADS``, ``TORCHELASTIC_*``) is gone before the next test, whose agents and
    torchx subprocesses would otherwise inherit it."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


THREADS_END_S = 15.0  # the store calls of these tests time out within a few seconds


@pytest.fixture
def threads_ended() -> Iterator[None]:
    """The threads the test started have ended by its end (waited for up to
    :data:`THREADS_END_S`). For tests whose threads call torch's store in this process: one
    inside such a call as the interpreter exits aborts it (``terminate called without an
    active exception``: Python 3.11 ends a daemon thread that takes the GIL back during
    finalization by unwinding it through torch's C++ frames), pytest's exit code with it."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREADS_END_S
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive())
    assert not left, f"threads this test left running: {', '.join(left)}"


# The suites (the Makefile's test targets select them by marker; pyproject.toml lists them).
# A test that brings up a real backend is marked by the fixture that brings it up, wherever
# the test lives, so `make test`'s two lanes (the local one and the real backends') never run
# one test twice or miss one (the browser runs in the local lane).
BACKEND_FIXTURES = {
    "docker_client": "docker",  # tests/docker/conftest.py: the real engine
    "cluster": "kubernetes",  # tests/kubernetes/test_real_node.py: the real node
    "slurm": "slurm",  # tests/slurm: the real two-node cluster
    "hosts": "netns",  # tests/e2e/test_rendezvous_security.py: the simulated hosts
    "browser": "browser",  # tests/e2e/test_timeline_browser.py: chromium
}
# the folders whose every test is in a suite: one that other lines run again, or `cli_jobs`
# (jobs through the torchx CLI, multi-node local ones on the default rendezvous port: `make
# test` runs them in a lane of their own, one at a time)
FOLDER_SUITES = {
    "agent": ("torch_lines",),  # the agent on every torch release CI runs
    "fidelity": ("torch_lines",),
    "compat": ("torchx_dev", "cli_jobs"),  # torchx's CLI on torchx's development line
    "e2e": ("cli_jobs",),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in set(BACKEND_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(BACKEND_FIXTURES[fixture])
        folder = Path(str(item.path)).relative_to(REPO / "tests").parts[0]
        for suite in FOLDER_SUITES.get(folder, ()):
            item.add_marker(suite)
