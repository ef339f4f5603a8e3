"""``--nproc-per-node cpu|auto`` in a real agent under ``taskset``: one worker per CPU the
agent may run on (the counts themselves: tests/agent/test_device_count_units.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _env, one_node_port

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nproc", ["cpu", "auto"])
def test_the_agent_under_taskset_starts_one_worker_per_allowed_cpu(
    tmp_path: Path, nproc: str
) -> None:
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.fail("this test needs taskset (util-linux)")
    (tmp_path / "worker.py").write_text("import os\nprint('WORLD', os.environ['WORLD_SIZE'])\n")
    args = ["--nproc-per-node", nproc, "worker.py"]
    done = subprocess.run(
        [taskset, "-c", "0", sys.executable, "-m", "torchx_elastic.agent", *args],
        cwd=tmp_path,
        env=one_node_port(args, _env({"CUDA_VISIBLE_DEVICES": ""})),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("WORLD 1") == 1, done.stdout
