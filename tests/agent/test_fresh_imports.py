"""What importing the light parts pulls into a fresh interpreter (each test starts one): the
contract needs only the standard library, the workers' API costs nothing, and a plain
console does not import ``rich``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchx_elastic
from torchx_elastic import contract

CONTRACT_DIR = Path(torchx_elastic.__file__).parent / "contract"


def _imports(code: str, env: dict[str, str] | None = None) -> str:
    """What ``python -c CODE`` printed (it must succeed)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_contract_needs_only_the_standard_library() -> None:
    stems = sorted(p.stem for p in CONTRACT_DIR.glob("*.py") if p.stem != "__init__")
    modules = [f"torchx_elastic.contract.{stem}" for stem in stems]
    assert len(modules) >= 6  # events, error_file, job_progress, waiting_file, env_file, ...
    code = (
        f"import sys; import {', '.join(modules)};"
        " print(sorted(m for m in ('torch', 'torchx', 'rich') if m in sys.modules))"
    )
    assert _imports(code) == "[]"


def test_importing_the_worker_api_is_cheap() -> None:
    code = (
        "import sys; from torchx_elastic import progress, heartbeat; progress(1, 2); heartbeat();"
        " print(sorted(m for m in ('torch', 'socket', 'typing', 'rich') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != contract.CHANNEL_ENV}
    assert _imports(code, env) == "[]"


@pytest.mark.slow
def test_a_plain_console_does_not_import_rich(tmp_path: Path) -> None:
    code = (
        "import sys; from torchx_elastic.agent.console.session import ConsoleSession;"
        f" s = ConsoleSession({str(tmp_path)!r}, mode='auto'); s.close();"
        " print(type(s.console).__name__, 'rich' in sys.modules)"
    )
    assert _imports(code) == "PlainConsole False"
