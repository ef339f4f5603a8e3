"""A real ``torchx run --dryrun`` on the docker and kubernetes schedulers prints no
credential (``--env`` names that look like one: tests/unit/test_credentials.py), on torchx
0.7 and on its development line (which calls the schedulers' ``_validate`` with the run's
config too: this test found that ours took one argument less).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_torchx


@pytest.mark.parametrize("scheduler", ["kubernetes", "docker"])
def test_torchx_run_dryrun_prints_no_credential(scheduler: str, tmp_path: Path) -> None:
    """A real ``torchx run --dryrun``: neither the app torchx prints (``=== APPLICATION
    ===``) nor the request holds the value; the app keeps the variable's name."""
    done = run_torchx(
        "run", "--dryrun", "--workspace", "", "-s", scheduler, "dist.ddp", "-j", "2x1",
        "--env", "WANDB_API_KEY=k-123,WANDB_MODE=off", "--script", "main.py",
        cwd=tmp_path, env={"TORCHX_CONTEXT_NAME": "test"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    application, request = done.stdout.split("=== SCHEDULER REQUEST ===")
    assert "=== APPLICATION ===" in application
    assert "k-123" not in done.stdout + done.stderr
    assert "'WANDB_API_KEY': '<masked>'" in application, application
    assert "'WANDB_MODE': 'off'" in application
    assert "a credential in plain text" in done.stderr
