"""The paths of a node's log directory and of a local job's (contract/log_layout.py): each
file where its writer puts it and its reader looks."""

from __future__ import annotations

import os
from pathlib import Path

from torchx_elastic.contract import events
from torchx_elastic.contract.job_progress import JobSummary, write_file
from torchx_elastic.contract.log_layout import (
    AGENTS_LOG_SUBDIR,
    CONSOLE_COPY_FILE,
    EVENTS_FILE,
    JOB_PROGRESS_FILE,
    LIVE_ROWS_FILE,
    RANK_ERROR_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    LocalAppLogs,
    NodeLogs,
)
from torchx_elastic.contract.timeline_command import COMMAND, command_for


def test_a_nodes_files_are_where_the_layout_says(tmp_path: Path) -> None:
    logs = NodeLogs(str(tmp_path))
    assert logs.events == str(tmp_path / EVENTS_FILE)
    assert logs.job_progress == str(tmp_path / JOB_PROGRESS_FILE)
    rank = Path(logs.rank_dir(2, 5))
    assert rank.parent.parent == tmp_path
    assert logs.rank_dir(2, 5) == os.path.join(logs.attempt_dir(2), rank.name)
    assert (logs.rank_stdout(2, 5), logs.rank_stderr(2, 5), logs.rank_error_file(2, 5)) == (
        str(rank / STDOUT_FILE),
        str(rank / STDERR_FILE),
        str(rank / RANK_ERROR_FILE),
    )
    assert Path(logs.filtered(2, "stderr")).parent == Path(logs.attempt_dir(2))
    assert "stderr" in Path(logs.filtered(2, "stderr")).name


def test_the_writers_write_where_the_layout_says(tmp_path: Path) -> None:
    logs = NodeLogs(str(tmp_path))
    events.EventLog.in_dir(str(tmp_path)).emit(events.START, attempt=0)
    assert os.path.exists(logs.events)
    events.write_summary(logs.summary(3), {"state": "SUCCEEDED"})
    assert events.summary_path(str(tmp_path), 3) == logs.summary(3)
    assert events.read_summary(str(tmp_path)) == {"state": "SUCCEEDED"}
    summary = JobSummary(
        step=1, total=2, slowest_rank=0, slowest_node=0, fastest_rank=0, fastest_node=0,
        fastest_step=1, rate_per_s=None, eta_s=None, ranks_reporting=1, ranks=1,
        nodes_reporting=1, nodes=1, time_s=0.0,
    )  # fmt: skip
    assert write_file(str(tmp_path), summary) == logs.job_progress


def test_the_ranks_of_an_attempt_are_its_rank_directories(tmp_path: Path) -> None:
    logs = NodeLogs(str(tmp_path))
    assert logs.ranks_of_attempt(0) == []
    for rank in (10, 2):
        os.makedirs(logs.rank_dir(0, rank))
    os.makedirs(os.path.join(logs.attempt_dir(0), "not_a_rank"))
    assert logs.ranks_of_attempt(0) == [2, 10]


def test_a_local_jobs_files_are_where_the_layout_says(tmp_path: Path) -> None:
    app = LocalAppLogs(str(tmp_path))
    assert app.agents("train") == NodeLogs(str(tmp_path / AGENTS_LOG_SUBDIR / "train"))
    replica = tmp_path / "train" / "1"
    assert app.replica_dir("train", 1) == str(replica)
    assert (app.replica_stdout("train", 1), app.replica_stderr("train", 1)) == (
        str(replica / STDOUT_FILE),
        str(replica / STDERR_FILE),
    )
    assert app.console_copy("train", 1) == str(replica / CONSOLE_COPY_FILE)
    assert app.live_rows("train", 1) == str(replica / LIVE_ROWS_FILE)


def test_a_layout_is_a_value() -> None:
    assert NodeLogs("/a") == NodeLogs("/a") and NodeLogs("/a") != NodeLogs("/b")
    assert NodeLogs("/a") != LocalAppLogs("/a")
    assert len({NodeLogs("/a"), NodeLogs("/a")}) == 1
    assert repr(NodeLogs("/a")) == "NodeLogs('/a')"


def test_the_timeline_command_is_the_timeline_programs() -> None:
    from torchx_elastic.timeline import cli

    assert command_for("/logs") == f"{COMMAND} /logs"
    args = cli.parser().parse_args(command_for("/logs").split()[1:])
    assert (cli.parser().prog, args.command, args.target) == (
        COMMAND.split()[0],
        "timeline",
        "/logs",
    )
