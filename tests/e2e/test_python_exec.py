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

SCRIPT = """
import json, os, sys
json.dump({"executable": sys.executable, "path": sys.path, "argv": sys.argv},
          open("seen_%s.json" % os.environ["RANK"], "w"))
if os.environ["RANK"] == "1":
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
