"""The torchx CLI of the installed torchx line (0.7 or the development line) with our package.

``torchx builtins`` and ``torchx runopts`` show ours and torchx's own; every scheduler
listed exists in that line; a local run goes through our local_cwd. CI runs this file in
both virtual environments (``make test-torchx-lines``).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from tests.conftest import run_torchx

DEV_LINE = any(d.metadata["Name"] == "torchx-nightly" for d in importlib.metadata.distributions())
OURS = {"local_cwd", "docker", "kubernetes", "slurm"}
if DEV_LINE:
    TORCHX_OWN = {"local_docker"}
else:
    TORCHX_OWN = {
        "local_docker",
        "kubernetes_mcad",
        "aws_batch",
        "aws_sagemaker",
        "gcp_batch",
        "ray",
        "lsf",
    }
# torchx 0.7's own ray and aws_sagemaker cannot list their options without ray / boto3
NEEDS_EXTRAS = {"ray", "aws_sagemaker"}


def test_builtins_lists_ours_and_torchx_own(tmp_path: Path) -> None:
    result = run_torchx("builtins", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    names = {line.split(". ", 1)[1] for line in result.stdout.splitlines() if ". " in line}
    assert {"dist.ddp", "dist.spmd", "dist.torchrun"} <= names
    assert {"torchx.dist.ddp", "torchx.dist.spmd", "torchx.utils.echo"} <= names
    if DEV_LINE:
        assert "torchx.dist.torchrun" in names


def test_every_scheduler_of_the_line_and_only_those(tmp_path: Path) -> None:
    result = run_torchx("runopts", "local_cwd", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    from torchx.schedulers import get_scheduler_factories

    assert set(get_scheduler_factories()) == OURS | TORCHX_OWN


@pytest.mark.parametrize("name", sorted((OURS | TORCHX_OWN) - NEEDS_EXTRAS))
def test_runopts_of_each_scheduler(tmp_path: Path, name: str) -> None:
    result = run_torchx("runopts", name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{name}:")
    assert "No module named" not in result.stdout
    assert "optional arguments:" in result.stdout or "required arguments:" in result.stdout


def test_runopts_kubernetes_is_ours(tmp_path: Path) -> None:
    out = run_torchx("runopts", "kubernetes", cwd=tmp_path).stdout
    assert "backend=BACKEND (str, job)" in out
    assert "reserved_memmb=RESERVED_MEMMB (int, 1024)" in out


def test_plugin_registry_has_ours_without_errors() -> None:
    """The development line's registry; torchx 0.7 has none: our entry points instead."""
    if DEV_LINE:
        from torchx import plugins

        registry = plugins.registry()
        assert set(registry.get(plugins.PluginType.SCHEDULER)) == OURS
        assert registry.load_errors() == []
    else:
        eps = importlib.metadata.entry_points(group="torchx.schedulers")
        assert {ep.name for ep in eps} == OURS | TORCHX_OWN


@pytest.mark.slow
def test_local_run_of_torchrun(workdir: Path) -> None:
    """``-j 0:1x2``: torchx's form of a job that may wait for its node (MIN 0)."""
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.torchrun", "-j", "0:1x2", "--script", "main.py", cwd=workdir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(re.findall(r"rank \d+ of world size \d+", result.stderr)) == [
        "rank 0 of world size 2",
        "rank 1 of world size 2",
    ]
    assert "torchx-elastic: logs of" in result.stderr  # our local_cwd, not torchx's
