"""Workers behave as under ``python script.py`` with both start methods (real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_agent
from torchx_elastic.contract.agent_args import FORK_SERVER

pytestmark = [pytest.mark.slow, pytest.mark.torch_lines]

METHODS = [FORK_SERVER, "spawn"]

PYTHON_SEMANTICS = """
import json, multiprocessing, os, random, signal, sys

def square(x):
    return x * x

def open_fds():
    listing = os.listdir("/proc/self/fd")  # the listing's own descriptor is gone after it
    return sorted(int(fd) for fd in listing if os.path.exists(f"/proc/self/fd/{fd}"))

if __name__ == "__main__":
    signals = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGCHLD))
    # SIGINT has Python's handler in any new interpreter, no other signal a Python one
    handled = [
        getattr(s, "name", str(s)) for s in signal.valid_signals() if callable(signal.getsignal(s))
    ]
    fds = open_fds()
    import torch
    from torch.utils.data import DataLoader
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        squares = pool.map(square, [3])
    loaded = [int(batch.sum()) for batch in DataLoader(list(range(6)), batch_size=3, num_workers=2)]
    out = {
        "sigint": signals[0] is signal.default_int_handler,
        "sigchld": signals[1] == signal.SIG_DFL,
        "handled": handled,
        "fds": fds, "loaded": loaded,
        "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0],
        "squares": squares, "random": random.random(), "threads": torch.get_num_threads(),
        "cwd": os.getcwd(), "rank": os.environ["RANK"],
    }
    with open(os.path.join(os.environ["OUT_DIR"], "seen." + os.environ["RANK"]), "w") as f:
        json.dump(out, f)
"""


@pytest.mark.parametrize("method", METHODS)
def test_script_sees_a_plain_python_process(tmp_path: Path, method: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/check.py").write_text(PYTHON_SEMANTICS)
    result = run_agent(
        "--nproc-per-node",
        "2",
        "--start-method",
        method,
        "sub/check.py",
        "x y",
        "--z",
        cwd=tmp_path,
        env={"OUT_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    seen = [json.loads((tmp_path / f"seen.{rank}").read_text()) for rank in (0, 1)]
    for rank_seen in seen:
        assert rank_seen["argv"] == ["sub/check.py", "x y", "--z"]
        # as ``python sub/check.py`` (3.9 on) and torchrun: the absolute path, which tracebacks show
        assert rank_seen["file"] == str(tmp_path / "sub/check.py")
        assert rank_seen["name"] == "__main__"
        assert rank_seen["path0"] == str(tmp_path / "sub")
        assert rank_seen["squares"] == [9]
        assert rank_seen["threads"] == 1
        assert rank_seen["cwd"] == str(tmp_path)
        assert rank_seen["sigint"] and rank_seen["sigchld"]
        # none of the agent's: SIGTERM ends a rank even while it is blocked in C++ code
        assert rank_seen["handled"] == ["SIGINT"]
        assert rank_seen["fds"] == [0, 1, 2]
        assert rank_seen["loaded"] == [3, 12]
    assert seen[0]["random"] != seen[1]["random"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("body", "report"),
    [
        ("import sys; sys.exit(3)", "exit code 3"),
        ("import sys; sys.exit('bye now')", "exit code 1"),
        ("raise ValueError('boom 42')", "ValueError: boom 42"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
    ],
)
def test_exit_codes_and_errors(tmp_path: Path, method: str, body: str, report: str) -> None:
    (tmp_path / "die.py").write_text(
        f"import os, time\nif os.environ['RANK'] == '1':\n    {body}\ntime.sleep(300)\n"
    )
    result = run_agent("--nproc-per-node", "2", "--start-method", method, "die.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "Root cause" in result.stderr
    assert report in result.stderr
    if "bye now" in body:
        assert "[n0 r1] bye now" in result.stderr


@pytest.mark.parametrize("method", METHODS)
def test_module_form(tmp_path: Path, method: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/run.py").write_text(
        "import sys\nif __name__ == '__main__':\n    print('module args', sys.argv[1:])\n"
    )
    result = run_agent(
        "--nproc-per-node",
        "1",
        "--start-method",
        method,
        "-m",
        "pkg.run",
        "--a",
        "b",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "[n0 r0] module args ['--a', 'b']" in result.stdout


def test_no_python_runs_a_program(tmp_path: Path) -> None:
    result = run_agent(
        "--nproc-per-node",
        "2",
        "--no-python",
        "sh",
        "-c",
        'echo "rank $RANK of $WORLD_SIZE"',
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "rank 1 of 2" in result.stdout
