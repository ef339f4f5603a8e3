"""``torchx run`` without ``-s``: local_cwd unless a ``.torchxconfig`` names another scheduler.

torchx 0.7 takes the first scheduler entry point as its default, and the entry points are
written sorted by name (``aws_batch``); its development line lists our ``local_cwd`` first.
Our ``run`` command makes the default ``local_cwd`` on both lines, so an installed wheel runs
``torchx run dist.ddp ...`` as the repository does with its ``.torchxconfig``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from torchx.cli.argparse_util import torchxconfig

from tests.conftest import run_torchx
from torchx_elastic.schedulers.cli_commands import DEFAULT_SCHEDULER, Run


@pytest.fixture
def fresh_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory and home without any .torchxconfig; torchx's per-process cache of
    the ``[cli:run]`` section emptied before and after."""
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path / "work")
    # torchx 0.7 takes the directories to search when it is imported
    monkeypatch.setattr(
        "torchx.runner.config.DEFAULT_CONFIG_DIRS",
        [str(tmp_path / "home"), str(tmp_path / "work")],
        raising=False,
    )
    cache = getattr(torchxconfig, "_subcmd_configs", {})
    cache.clear()
    yield tmp_path / "work"
    cache.clear()


def _scheduler_default() -> str:
    parser = argparse.ArgumentParser()
    Run().add_arguments(parser)
    return str(parser.parse_args(["dist.ddp"]).scheduler)


def test_no_torchxconfig_means_local_cwd(fresh_cwd: Path) -> None:
    assert DEFAULT_SCHEDULER == "local_cwd"
    assert _scheduler_default() == "local_cwd"


def test_a_torchxconfig_that_names_a_scheduler_keeps_it(fresh_cwd: Path) -> None:
    (fresh_cwd / ".torchxconfig").write_text("[cli:run]\nscheduler = docker\n")
    assert _scheduler_default() == "docker"


def test_a_torchxconfig_without_a_scheduler_still_means_local_cwd(fresh_cwd: Path) -> None:
    (fresh_cwd / ".torchxconfig").write_text("[local_cwd]\nlog_dir = logs\n")
    assert _scheduler_default() == "local_cwd"


def test_dryrun_without_s_or_torchxconfig_goes_to_local_cwd(tmp_path: Path) -> None:
    """The real CLI in a directory with no .torchxconfig and a home without one."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "main.py").write_text("print('hi')\n")
    result = run_torchx(
        "run", "--dryrun", "dist.ddp", "-j", "1x2", "--script", "main.py",
        cwd=work, env={"HOME": str(home)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "queue" not in result.stderr
    assert "torchx_elastic.agent" in result.stdout + result.stderr
    assert "'TORCHX_JOB_ID': 'local_cwd://" in result.stdout + result.stderr
