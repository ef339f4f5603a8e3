"""The torchx CLI finds our components and schedulers (entry points), without running jobs."""

from pathlib import Path

from tests.conftest import REPO, run_torchx


def test_builtins_lists_ours_and_torchx_own_under_a_prefix(tmp_path: Path) -> None:
    out = run_torchx("builtins", cwd=tmp_path).stdout
    names = {line.split(". ", 1)[1] for line in out.splitlines() if ". " in line}
    assert {"dist.ddp", "dist.spmd"} <= names
    assert {"torchx.dist.ddp", "torchx.dist.spmd", "torchx.utils.echo"} <= names


def test_dryrun_shows_the_agent_as_entrypoint(tmp_path: Path) -> None:
    result = run_torchx(
        "run",
        "--dryrun",
        "-s",
        "local_cwd",
        "dist.ddp",
        "-j",
        "2x2",
        "--script",
        "main.py",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "'entrypoint': 'python3'" in result.stdout
    assert "'torchx_elastic.agent'" in result.stdout
    assert "'TORCHX_RANK0_HOST': '127.0.0.1'" in result.stdout
    assert "${TORCHX_RANK0_HOST:-localhost}:29500" in result.stdout


def test_repo_config_defaults_to_our_local_cwd(tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text((REPO / ".torchxconfig").read_text())
    result = run_torchx("run", "--dryrun", "dist.ddp", "--script", "main.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"'log_dir': '{tmp_path}/torchx_logs/torchx/main-" in result.stdout


def test_torchx_builtin_schedulers_remain(tmp_path: Path) -> None:
    # torchx's own ray scheduler cannot list its options without ray installed, so ask each
    for name in ("local_docker", "slurm", "aws_batch", "lsf", "gcp_batch", "kubernetes_mcad"):
        result = run_torchx("runopts", name, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"{name}:")
    local = run_torchx("runopts", "local_cwd", cwd=tmp_path).stdout
    assert "log_dir=LOG_DIR (str, torchx_logs)" in local


def test_bad_j_on_the_command_line_says_what_is_accepted(tmp_path: Path) -> None:
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "4:2x1", "--script", "main.py", cwd=tmp_path
    )
    assert result.returncode != 0
    assert "invalid -j '4:2x1': MIN nodes (4) is above MAX nodes (2)" in result.stderr
    assert "'MIN:MAXxM' (elastic, MIN to MAX nodes x M processes, e.g. '2:4x8')" in result.stderr
