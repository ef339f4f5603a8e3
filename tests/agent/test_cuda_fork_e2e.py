"""No process that forks workers touches the CUDA driver or NVML before it forks (real runs).

A stub ``libcuda.so.1`` and ``libnvidia-ml.so.1`` (``cuda_stub.py``) log each call with its
pid. On a CUDA build of torch (the venvs of ``make test-torch-versions``): the agent with
``--nproc-per-node gpu``, ``auto`` and a number, and ``launch(fn)`` with each fork start
method; the agent's pid and the fork server's (each worker's parent) make no call at all,
the devices are counted by a pid of their own, and no worker is a bad fork. Where something
else asked CUDA before the fork, workers start by spawn, with one line saying why.

On the CPU build (``.venv``) torch never loads a driver: the same runs, and the log stays
empty; ``gpu`` is refused as torchrun refuses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.agent import cuda_stub
from tests.conftest import _env, one_node_port
from torchx_elastic.agent.config.devices import cpu_count
from torchx_elastic.agent.workers.cuda_fork import POISONED
from torchx_elastic.contract.agent_args import FORK, FORK_SERVER, FORKSERVER

pytestmark = pytest.mark.slow

CUDA_BUILD = torch.version.cuda is not None
TIMEOUT_S = 240

WORKER = """
import json, os
import torch
seen = {"pid": os.getpid(), "ppid": os.getppid(), "bad_fork": torch.cuda._is_in_bad_fork(),
        "devices": torch.cuda.device_count()}
with open(os.path.join(os.environ["OUT_DIR"], "seen." + os.environ["RANK"]), "w") as f:
    json.dump(seen, f)
"""

# imported by every interpreter on PYTHONPATH; asks CUDA in the process that has POISON_CUDA
# (taken out of the environment first, so that the agent's workers do not inherit it)
POISON = """
import os
if os.environ.pop("POISON_CUDA", None):
    import torch
    torch.cuda.is_available()
"""

CALLER = """
import json, os, sys
import torch
import torchx_elastic

def seen():
    return {"pid": os.getpid(), "ppid": os.getppid(), "bad_fork": torch.cuda._is_in_bad_fork(),
            "devices": torch.cuda.device_count()}

if __name__ == "__main__":
    method, poison = sys.argv[1], sys.argv[2] == "poison"
    if poison:
        torch.cuda.is_available()
    results = torchx_elastic.launch(seen, nproc_per_node=2, start_method=method, console="plain")
    print("RESULT " + json.dumps({"caller": os.getpid(), "workers": list(results.values())}))
"""


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cuda_stub.build(tmp_path_factory.mktemp("cuda_stub"))


def stub_env(stub_dir: Path, tmp_path: Path, nvml_check: bool) -> dict[str, str]:
    env = _env(
        {
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (str(stub_dir), os.environ.get("LD_LIBRARY_PATH", "")) if p
            ),
            cuda_stub.LOG_ENV: str(tmp_path / "calls.log"),
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1" if nvml_check else "0",
            "OUT_DIR": str(tmp_path),
            "OMP_NUM_THREADS": "1",
        }
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, int]:
    """(exit code, stderr + stdout, pid) of ``python ARGS``."""
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = proc.communicate(timeout=TIMEOUT_S)
    return proc.returncode, out.decode(errors="replace"), proc.pid


def workers_seen(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("seen.*"))]


def assert_no_calls(calls: dict[int, list[str]], pids: set[int], what: str) -> None:
    touched = {pid: names for pid, names in calls.items() if pid in pids}
    assert not touched, f"{what} called the driver or NVML: {touched}"


def run_agent(
    stub_dir: Path, tmp_path: Path, nproc: str, nvml_check: bool, **extra: str
) -> tuple[int, str, int]:
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**stub_env(stub_dir, tmp_path, nvml_check), **extra}
    if "PYTHONPATH" in extra:  # after it, the source under test (tests/conftest.py)
        src = _env().get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra["PYTHONPATH"], src) if p)
    args = ["--nproc-per-node", nproc, "worker.py"]
    return run(["-m", "torchx_elastic.agent", *args], tmp_path, one_node_port(args, env))


@pytest.mark.parametrize(
    ("nproc", "nvml_check"), [("gpu", True), ("auto", True), ("auto", False), ("2", False)]
)
def test_the_agent_and_its_fork_server_never_touch_the_driver(
    stub_dir: Path, tmp_path: Path, nproc: str, nvml_check: bool
) -> None:
    code, out, agent_pid = run_agent(stub_dir, tmp_path, nproc, nvml_check)
    if nproc == "gpu" and not CUDA_BUILD:  # the CPU build has no CUDA, and loads no driver
        assert code == 1 and "--nproc-per-node gpu: Cuda is not available." in out, out
        assert not (tmp_path / "calls.log").exists()
        return
    assert code == 0, out
    seen = workers_seen(tmp_path)
    if nproc == "2":
        expected = 2
    elif CUDA_BUILD and nvml_check:
        expected = 2  # the stub's devices
    else:
        expected = cpu_count()  # no device: auto counts CPUs, as torchrun
    assert len(seen) == expected, out
    servers = {int(str(s["ppid"])) for s in seen}
    assert agent_pid not in servers, "workers were not forked from a fork server"
    calls = cuda_stub.calls_by_pid(tmp_path / "calls.log")
    assert_no_calls(calls, {agent_pid}, "the agent")
    assert_no_calls(calls, servers, "the fork server")
    assert not any(s["bad_fork"] for s in seen), seen
    workers = {int(str(s["pid"])) for s in seen}
    counters = set(calls) - workers
    if CUDA_BUILD and nproc != "2":
        assert counters, f"no process counted the devices: {calls}"  # a child of the agent
        assert all(s["devices"] == 2 for s in seen), seen  # what a worker's torch sees
    else:
        assert not counters, calls


def test_gpu_without_a_usable_driver_is_refused_as_torchrun_refuses_it(
    stub_dir: Path, tmp_path: Path
) -> None:
    # without NVML, torch asks the CUDA runtime, which the stub driver cannot satisfy
    code, out, agent_pid = run_agent(stub_dir, tmp_path, "gpu", nvml_check=False)
    assert code == 1, out
    assert "torchx-elastic: error: --nproc-per-node gpu: Cuda is not available." in out
    calls = cuda_stub.calls_by_pid(tmp_path / "calls.log")
    assert_no_calls(calls, {agent_pid}, "the agent")
    if CUDA_BUILD:
        assert any("cuInit" in names for names in calls.values()), calls  # the counting child's


def test_an_agent_that_asked_cuda_starts_its_workers_by_spawn_saying_why(
    stub_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "poison").mkdir()
    (tmp_path / "poison/sitecustomize.py").write_text(POISON)
    code, out, agent_pid = run_agent(
        stub_dir,
        tmp_path,
        "2",
        nvml_check=False,
        POISON_CUDA="1",
        PYTHONPATH=str(tmp_path / "poison"),
    )
    assert code == 0, out
    seen = workers_seen(tmp_path)
    assert len(seen) == 2
    assert not any(s["bad_fork"] for s in seen), seen
    line = f"torchx-elastic: starting workers by spawn: {POISONED}"
    if CUDA_BUILD:
        assert out.count(line) == 1, out
        assert {s["ppid"] for s in seen} == {agent_pid}  # spawned by the agent itself
    else:  # the CPU build never poisons a fork: the fork server is used
        assert line not in out, out
        assert agent_pid not in {s["ppid"] for s in seen}


def run_caller(
    stub_dir: Path, tmp_path: Path, method: str, poison: bool
) -> tuple[str, dict[str, Any]]:
    (tmp_path / "caller.py").write_text(CALLER)
    env = stub_env(stub_dir, tmp_path, nvml_check=False)
    code, out, _ = run(["caller.py", method, "poison" if poison else "clean"], tmp_path, env)
    assert code == 0, out
    result = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert result, out
    return out, json.loads(result[-1][len("RESULT ") :])


@pytest.mark.parametrize("method", [FORK_SERVER, FORKSERVER, FORK])
def test_a_function_launch_forks_from_a_caller_that_never_touched_the_driver(
    stub_dir: Path, tmp_path: Path, method: str
) -> None:
    out, result = run_caller(stub_dir, tmp_path, method, poison=False)
    caller, workers = result["caller"], result["workers"]
    assert len(workers) == 2
    assert "starting workers by spawn" not in out, out
    servers = {w["ppid"] for w in workers}
    assert caller not in servers  # forked from a fork server, not spawned
    calls = cuda_stub.calls_by_pid(tmp_path / "calls.log")
    assert_no_calls(calls, {caller}, "the caller (LaunchConfig, the launch)")
    assert_no_calls(calls, servers, "the fork server")
    assert not any(w["bad_fork"] for w in workers), workers


def test_a_function_launch_from_a_caller_that_asked_cuda_spawns_saying_why(
    stub_dir: Path, tmp_path: Path
) -> None:
    out, result = run_caller(stub_dir, tmp_path, FORK_SERVER, poison=True)
    workers = result["workers"]
    assert not any(w["bad_fork"] for w in workers), workers
    line = f"starting workers by spawn (start_method={FORK_SERVER!r}): {POISONED}"
    if CUDA_BUILD:
        assert out.count(line) == 1, out
        assert {w["ppid"] for w in workers} == {result["caller"]}
    else:
        assert line not in out, out
