"""torchrun's ``PYTHON_EXEC``: workers run in another interpreter, which may not have this
package installed; the bootstrap still runs there and leaves that interpreter's ``sys.path``
as its own (the agent's site-packages would hand a foreign interpreter the wrong torch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_agent
from torchx_elastic.agent.workers.bootstrap import PACKAGE_FOLDER

pytestmark = pytest.mark.slow

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"

# rank 1 fails once rank 0 wrote what it saw (its failure stops rank 0, which a loaded machine
# may start later)
SCRIPT = """
import json, os, sys, time
rank = os.environ["RANK"]
with open("seen_%s.json.part" % rank, "w") as out:
    json.dump({"executable": sys.executable, "path": sys.path, "argv": sys.argv}, out)
os.replace("seen_%s.json.part" % rank, "seen_%s.json" % rank)
if rank == "1":
    deadline = time.monotonic() + 120
    while not os.path.exists("seen_0.json") and time.monotonic() < deadline:
        time.sleep(0.05)
    raise ValueError("rank one fails on purpose")
"""


def test_workers_run_in_the_python_exec_interpreter(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    result = run_agent(
        "--standalone",
        "--nproc-per-node",
        "2",
        "script.py",
        "--flag",
        cwd=tmp_path,
        env={"PYTHON_EXEC": SYSTEM_PYTHON},
    )
    assert result.returncode == 1, result.stderr
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"seen_{rank}.json").read_text())
        assert seen["executable"] == SYSTEM_PYTHON
        assert seen["argv"] == ["script.py", "--flag"]
        assert seen["path"][0] == str(tmp_path)
        assert PACKAGE_FOLDER not in seen["path"]
    # the root cause is the user's exception, with no frame of the bootstrap's
    assert "ValueError: rank one fails on purpose" in result.stderr
    assert "<string>" not in result.stderr
    assert "bootstrap" not in result.stderr.split("Root cause")[1].split("stdout:")[0]
