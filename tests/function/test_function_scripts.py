"""A function launch from a script of its own (``python script.py``): a function defined in
``__main__`` under spawn, and no orphans when that caller is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _env
from tests.e2e.agents import alive, descendants, free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MAIN_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig
from torchx_elastic.launcher import elastic_launch

print("module code runs as", __name__, flush=True)

def total(offset):
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return value.item() + offset

if __name__ == "__main__":
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", start_method=sys.argv[1])
    print("RESULTS", json.dumps(elastic_launch(config, total)(100)), flush=True)
"""

SLEEPER_SCRIPT = """
import os, signal, sys, time
import torchx_elastic

def sleep_forever(directory):
    open(os.path.join(directory, "worker.%s.pid" % os.environ["RANK"]), "w").write(
        str(os.getpid()))
    time.sleep(300)

if __name__ == "__main__":
    try:
        torchx_elastic.launch(sleep_forever, sys.argv[1], nproc_per_node=2,
                              start_method=sys.argv[2])
    except KeyboardInterrupt:
        handler = signal.getsignal(signal.SIGINT)
        print("KeyboardInterrupt; SIGINT handler back:", handler is signal.default_int_handler)
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_function_in_main_of_a_script(tmp_path: Path, method: str) -> None:
    (tmp_path / "job.py").write_text(MAIN_SCRIPT)
    result = subprocess.run(
        [sys.executable, "job.py", method],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULTS "))
    assert json.loads(results[len("RESULTS ") :]) == {"0": 101.0, "1": 101.0}
    assert result.stdout.count("module code runs as __main__") == 1  # the caller
    # spawn: each worker re-runs the script's module code as __mp_main__ (multiprocessing's
    # spawn does the same); fork: workers are copies of the caller and run none of it
    reruns = result.stdout.count("module code runs as __mp_main__")
    assert reruns == (2 if method == "spawn" else 0)
    if method == "spawn":
        assert "[n0 r1] module code runs as __mp_main__" in result.stdout


TWO_NODE_SCRIPT = """
import json, sys
import torch, torch.distributed as dist
import torchx_elastic

def world_sum():
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return [dist_rank_env(), value.item()]

def dist_rank_env():
    import os
    return int(os.environ["RANK"])

if __name__ == "__main__":
    results = torchx_elastic.launch(world_sum, nproc_per_node=2, nnodes="2",
                                    rdzv_endpoint=sys.argv[1], run_id="two-nodes")
    print("RESULTS", json.dumps(results), flush=True)
"""


def test_two_nodes_each_get_their_own_ranks_values(tmp_path: Path) -> None:
    (tmp_path / "node.py").write_text(TWO_NODE_SCRIPT)
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            [sys.executable, "node.py", endpoint],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=240) for node in nodes]
    results = []
    for node, (out, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out[-2000:] + err[-2000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULTS "))
        results.append(json.loads(line[len("RESULTS ") :]))
    # 0+1+2+3 = 6 on every rank; each caller gets the values of its own node's two ranks
    assert sorted(results, key=lambda r: min(r)) == [
        {"0": [0, 6.0], "1": [1, 6.0]},
        {"2": [2, 6.0], "3": [3, 6.0]},
    ]


INTERACTIVE_CODE = """
import sys
import torchx_elastic
from torchx_elastic.launcher import FunctionFailedError

def triple(x):  # defined in an interactive __main__ (python -c), as in a notebook
    return 3 * x

try:
    print("RESULTS", torchx_elastic.launch(triple, 5, nproc_per_node=2,
                                           start_method=sys.argv[1]), flush=True)
except FunctionFailedError as error:
    print("FAILED", error.rank, error.exception, flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_function_of_an_interactive_session(tmp_path: Path, method: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", INTERACTIVE_CODE, method],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if method == "fork":  # the workers are copies of the caller: its functions are there
        assert "RESULTS {0: 15, 1: 15}" in result.stdout
    else:  # a fresh interpreter cannot import what `python -c` or a notebook defined
        failed = next(ln for ln in result.stdout.splitlines() if ln.startswith("FAILED "))
        assert failed.startswith(
            "FAILED 0 CallPicklingError: rank 0 cannot unpickle the function or its arguments:"
            " AttributeError: "
        ) or failed.startswith(
            "FAILED 1 CallPicklingError: rank 1 cannot unpickle the function or its arguments:"
            " AttributeError: "
        ), failed
        assert "what a notebook or the REPL defines cannot be imported" in failed


UNGUARDED_SCRIPT = """
import torchx_elastic

def one():
    return 1

print(torchx_elastic.launch(one, nproc_per_node=1))
"""


def test_unguarded_launch_in_a_script_fails_clearly_under_spawn(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(UNGUARDED_SCRIPT)
    result = subprocess.run(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 1
    assert (
        "one failed on rank 0 (node 0, local rank 0, pid " in result.stderr
        and "): RuntimeError: a function launch was started while a worker was importing the"
        ' caller\'s main script; start the launch under `if __name__ == "__main__":` in that'
        " script (as with multiprocessing's spawn)"
        in result.stderr
    ), result.stderr[-3000:]


def start_sleepers(tmp_path: Path, method: str) -> tuple[subprocess.Popen[bytes], set[int]]:
    """A caller whose two workers sleep; its pid and its whole process tree."""
    (tmp_path / "sleeper.py").write_text(SLEEPER_SCRIPT)
    with open(tmp_path / "caller.log", "wb") as log:
        caller = subprocess.Popen(
            [sys.executable, "sleeper.py", str(tmp_path), method],
            cwd=tmp_path,
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        pid_files = [tmp_path / f"worker.{rank}.pid" for rank in (0, 1)]

        def both_pids() -> bool:
            assert caller.poll() is None, (tmp_path / "caller.log").read_text()
            return all(path.exists() and path.read_text() for path in pid_files)

        wait_until(
            both_pids,
            what="both workers' pid files",
            timeout_s=180,
            every_s=0.2,
            detail=(tmp_path / "caller.log").read_text,
        )
        workers = {int(path.read_text()) for path in pid_files}
        tree = descendants(caller.pid)
        assert workers <= tree
        return caller, tree
    except BaseException:
        caller.kill()
        raise


def wait_gone(tree: set[int], log: Path) -> None:
    wait_until(
        lambda: alive(tree) == set(),
        what="the end of the caller's process tree",
        every_s=0.2,
        detail=log.read_text,
    )


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_sigkilled_caller_leaves_no_orphans(tmp_path: Path, method: str) -> None:
    caller, tree = start_sleepers(tmp_path, method)
    try:
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait(timeout=30)
        wait_gone(tree, tmp_path / "caller.log")
    finally:
        if caller.poll() is None:
            caller.kill()


def test_ctrl_c_stops_the_workers_and_raises_keyboard_interrupt(tmp_path: Path) -> None:
    caller, tree = start_sleepers(tmp_path, "spawn")
    try:
        os.kill(caller.pid, signal.SIGINT)
        assert caller.wait(timeout=120) == 0
        wait_gone(tree, tmp_path / "caller.log")
        log = (tmp_path / "caller.log").read_text()
        assert "KeyboardInterrupt; SIGINT handler back: True" in log, log
    finally:
        if caller.poll() is None:
            caller.kill()
