"""The torchx CLI finds our components and schedulers, without running jobs.

What each torchx line lists (builtins, schedulers) is in ``tests/compat/test_torchx_cli.py``.
"""

from pathlib import Path

import pytest

from tests.conftest import REPO, run_torchx
from torchx_elastic.contract import RANK0_ENV


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
    assert f"'{RANK0_ENV}': '127.0.0.1'" in result.stdout
    assert f"${{{RANK0_ENV}:-localhost}}:29500" in result.stdout


def test_repo_config_defaults_to_our_local_cwd(tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text((REPO / ".torchxconfig").read_text())
    result = run_torchx("run", "--dryrun", "dist.ddp", "--script", "main.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"'log_dir': '{tmp_path}/torchx_logs/torchx/main-" in result.stdout


def test_our_local_cwd_options(tmp_path: Path) -> None:
    local = run_torchx("runopts", "local_cwd", cwd=tmp_path).stdout
    assert "log_dir=LOG_DIR (str, torchx_logs)" in local


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["dist.ddp", "-j", "4:2x1"],
            "invalid -j '4:2x1': MIN nodes (4) is above MAX nodes (2); accepted forms: 'M' (1 node"
            " x M processes, e.g. '4'), 'NxM' (N nodes x M processes per node, e.g. '2x4'),"
            " 'MIN:MAXxM' (elastic, MIN to MAX nodes x M processes, e.g. '2:4x8')",
        ),
        (["dist.ddp", "-j", "2x1", "--cpu", "-1"], "--cpu -1.0: expected a number of CPUs >= 0"),
        (
            ["dist.ddp", "-j", "2x1", "--rdzv_port", "99999"],
            "invalid rdzv_port 99999; accepted: a TCP port, 1 to 65535 (0: any free port, for"
            " one node)",
        ),
        (
            ["dist.ddp", "-j", "2x1", "--console", "fancy"],
            "invalid console 'fancy'; accepted: ",
        ),
        (
            ["ft.ddp", "--replica_groups", "2", "-j", "1:2x1"],
            "-j 1:2x1: a replica group of ft.ddp has a fixed size, give -j NxM",
        ),
    ],
)
def test_a_bad_component_argument_is_one_line_that_says_what_is_accepted(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    """As torchx prints its own errors (an unknown component): one ERROR line, exit code 1,
    no traceback; ``--dryrun`` or not, nothing starts."""
    for dryrun in (["--dryrun"], []):
        result = run_torchx(
            "run", *dryrun, "-s", "local_cwd", *arguments, "--script", "main.py", cwd=tmp_path
        )
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
        assert len(errors) == 1, result.stderr
        assert message in errors[0]
    assert not (tmp_path / "torchx_logs").exists()


def test_list_of_local_cwd_says_where_the_jobs_records_are(tmp_path: Path) -> None:
    """torchx's local schedulers raise a bare Exception (a traceback) for ``list``."""
    result = run_torchx("list", "-s", "local_cwd", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.endswith(
        "ERROR    local_cwd keeps no record of its jobs beyond the torchx process that ran them"
        " (as torchx's local schedulers); each job's logs, summary and events stay in its"
        " log_dir (default ./torchx_logs/<session>/<app id>), and `torchx-elastic timeline"
        " <that directory>` shows how it went\n"
    ), result.stderr
