"""Root cause vs victims (the pure policy), the report text, the JSON summary, events."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from torchx_elastic.agent.console.failure import report
from torchx_elastic.agent.console.failure.report import RankFailure, classify, victim_reason
from torchx_elastic.agent.console.output.sinks import RankOutput
from torchx_elastic.contract import (
    ERROR_FILE_ENV,
    EVENTS_FILE,
    RANK_ERROR_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    SUMMARY_PREFIX,
)
from torchx_elastic.contract.events import EventLog

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 12, in <module>\n'
    '    raise ValueError("bad batch")\n'
    "ValueError: bad batch\n"
)
GLOO_CLOSED = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
    " Connection closed by peer [10.0.0.2]:41234"
)
SIGTERM, SIGKILL = -int(signal.SIGTERM), -int(signal.SIGKILL)


def failure(rank: int, exitcode: int = 1, **kw: object) -> RankFailure:
    return RankFailure(rank=rank, local_rank=rank, node=0, pid=100 + rank, exitcode=exitcode, **kw)  # type: ignore[arg-type]


def test_raiser_is_the_cause_and_the_terminated_rank_a_victim() -> None:
    raiser = failure(1, 1, error_time_s=100.0, exit_time_s=100.5, traceback=TRACEBACK)
    stopped = failure(0, SIGTERM, exit_time_s=100.6)
    verdict = classify([stopped, raiser])
    assert verdict.root == raiser and not verdict.root_is_victim
    assert [(v.failure.rank, v.reason) for v in verdict.victims] == [
        (0, "stopped by SIGTERM after another rank failed")
    ]


@pytest.mark.parametrize(
    "text",
    [
        GLOO_CLOSED,
        "RuntimeError: Connection reset by peer",
        "DistBackendError: NCCL error: remote process exited or there was a network error",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process",
        "BrokenPipeError: [Errno 32] Broken pipe",
    ],
)
def test_a_lost_peer_makes_a_victim_even_if_it_failed_first(text: str) -> None:
    victim = failure(0, 1, error_time_s=99.0, exit_time_s=99.1, message=text)
    cause = failure(3, 1, error_time_s=100.0, exit_time_s=100.2, traceback=TRACEBACK)
    verdict = classify([victim, cause])
    assert verdict.root == cause
    assert verdict.victims[0].failure == victim
    assert verdict.victims[0].reason == f"lost a peer: {text}"


def test_lost_peer_seen_only_in_the_stderr_tail() -> None:
    victim = failure(2, 1, stderr_tail=("some log line", GLOO_CLOSED, "exiting"))
    assert victim_reason(victim) == f"lost a peer: {GLOO_CLOSED}"


def test_first_failure_by_error_file_time_then_exit_time() -> None:
    # error-file timestamps have whole seconds: within one second, the exit time decides
    late = failure(0, 1, error_time_s=100.0, exit_time_s=100.9)
    early = failure(1, 1, error_time_s=100.0, exit_time_s=100.2)
    earlier_second = failure(2, 1, error_time_s=99.0, exit_time_s=101.0)
    verdict = classify([late, early, earlier_second])
    assert verdict.root == earlier_second
    assert verdict.causes == (early, late)
    assert verdict.victims == ()


def test_a_lone_killed_rank_is_the_cause() -> None:
    oom = failure(5, SIGKILL, exit_time_s=50.0)
    verdict = classify([oom])
    assert verdict.root == oom and not verdict.root_is_victim


def test_only_victims_here_points_elsewhere() -> None:
    lost = failure(0, 1, error_time_s=10.0, exit_time_s=10.1, message=GLOO_CLOSED)
    stopped = failure(1, SIGTERM, exit_time_s=10.3)
    verdict = classify([stopped, lost])
    assert verdict.root == lost and verdict.root_is_victim
    assert [v.failure for v in verdict.victims] == [stopped]
    text = report.render(verdict, "/logs")
    assert "failed first, but only lost a peer: exit code 1" in text
    assert "no rank on this node failed on its own: look for the root cause in the other" in text


def test_no_failures() -> None:
    assert classify([]).root is None
    assert "the job failed, but no worker did" in report.render(classify([]), "/logs")


def test_report_text_names_rank_exception_traceback_tail_and_paths() -> None:
    raiser = failure(
        1,
        1,
        error_time_s=100.0,
        traceback=TRACEBACK,
        message="ValueError: bad batch",
        stderr_tail=("loading shard 7",),
        stdout_path="/logs/attempt_0/rank_1/stdout.log",
        stderr_path="/logs/attempt_0/rank_1/stderr.log",
    )
    stopped = failure(0, SIGTERM)
    text = report.render(classify([raiser, stopped]), "/logs", "/logs/summary_node0.json")
    assert text.splitlines()[1:4] == ["=" * 72, "Root cause", "=" * 72]
    assert "  rank 1 (node 0, local rank 1, pid 101) failed first: exit code 1\n" in text
    assert '        raise ValueError("bad batch")\n    ValueError: bad batch\n' in text
    assert "  last lines of stderr before the traceback:\n    loading shard 7\n" in text
    assert "  stdout: /logs/attempt_0/rank_1/stdout.log\n" in text
    assert "  stderr: /logs/attempt_0/rank_1/stderr.log\n" in text
    assert "Victims (failed only because a peer failed):\n  rank 0 (node 0, local rank 0):" in text
    assert "signal SIGTERM, stopped by SIGTERM after another rank failed\n" in text
    assert text.endswith("Logs of every rank: /logs\nSummary (JSON): /logs/summary_node0.json\n")


def test_collect_reads_the_error_file_and_the_stderr_before_the_traceback(tmp_path: Path) -> None:
    rank_dir = tmp_path / "attempt_0" / "rank_7"
    rank_dir.mkdir(parents=True)
    (rank_dir / STDERR_FILE).write_text("warming up\nstep 3 failed\n" + TRACEBACK)
    error_file = rank_dir / RANK_ERROR_FILE
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: bad batch",
                    "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "1700000000"},
                }
            }
        )
    )
    output = RankOutput(3, 7, 1, str(rank_dir / STDOUT_FILE), str(rank_dir / STDERR_FILE))
    process_failure = ProcessFailure(local_rank=3, pid=42, exitcode=1, error_file=str(error_file))
    (fact,) = report.collect(
        {7: process_failure}, [output], {3: 1700000000.25}, {3: str(error_file)}
    )
    assert fact.rank == 7 and fact.node == 1 and fact.local_rank == 3
    assert fact.message == "ValueError: bad batch"
    assert fact.traceback == TRACEBACK
    assert fact.error_time_s == 1700000000.0 and fact.exit_time_s == 1700000000.25
    assert fact.stderr_tail == ("warming up", "step 3 failed")


def test_collect_without_an_error_file_drops_torchs_placeholder(tmp_path: Path) -> None:
    output = RankOutput(0, 0, 0, str(tmp_path / "out"), str(tmp_path / "err"))
    process_failure = ProcessFailure(
        local_rank=0, pid=1, exitcode=3, error_file=str(tmp_path / "none")
    )
    (fact,) = report.collect({0: process_failure}, [output], {}, {})
    assert fact.message == "" and fact.traceback == "" and fact.error_time_s is None
    assert fact.exit_time_s == float(process_failure.timestamp)


def test_summary_json_has_the_same_facts(tmp_path: Path) -> None:
    raiser = failure(1, 1, traceback=TRACEBACK, message="ValueError: bad batch")
    verdict = classify([raiser, failure(0, SIGTERM)])
    path = report.summary_path(str(tmp_path), node=0)
    report.write_summary(path, report.summary(verdict, "FAILED", 0, 2, str(tmp_path), 1))
    data = json.loads(Path(path).read_text())
    assert path.endswith(f"{SUMMARY_PREFIX}0.json")
    assert data["state"] == "FAILED" and data["exit_code"] == 1 and data["attempt"] == 2
    assert data["root_cause"]["rank"] == 1
    assert data["root_cause"]["how"] == "exit code 1"
    assert data["root_cause"]["traceback"] == TRACEBACK
    assert [(v["rank"], v["how"]) for v in data["victims"]] == [(0, "signal SIGTERM")]


def test_event_log_appends_timestamped_json_lines(tmp_path: Path) -> None:
    events = EventLog.in_dir(str(tmp_path / "logs"))
    events.emit("rendezvous", attempt=0)
    events.node = 3
    events.emit("exit", exit_code=0)
    lines = [
        json.loads(line) for line in (tmp_path / "logs" / EVENTS_FILE).read_text().splitlines()
    ]
    assert [(e["event"], e["node"]) for e in lines] == [("rendezvous", None), ("exit", 3)]
    assert lines[1]["exit_code"] == 0
    assert lines[0]["time_s"] <= lines[1]["time_s"] and lines[0]["time"].endswith("+00:00")


def test_event_log_that_cannot_be_written_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    events = EventLog(str(blocker / EVENTS_FILE))
    events.emit("start")
    events.emit("exit")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"cannot write the event log {blocker / EVENTS_FILE}"
    ]


def test_killed_first_then_stopped_by_the_agent() -> None:
    oom = failure(2, SIGKILL, exit_time_s=50.0)
    stopped = failure(0, SIGTERM, exit_time_s=50.4)
    verdict = classify([stopped, oom])
    assert verdict.root == oom and not verdict.root_is_victim
    assert [v.failure for v in verdict.victims] == [stopped]


def test_a_long_peer_error_line_is_shortened_in_the_reason() -> None:
    reason = victim_reason(failure(0, 1, message=GLOO_CLOSED + " " + "x" * 300))
    assert reason is not None and len(reason) == len("lost a peer: ") + 160
    assert reason.startswith(f"lost a peer: {GLOO_CLOSED}") and reason.endswith("x...")


def test_reply_file_names_the_root_cause_for_the_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchx_elastic.agent.console.session import ConsoleSession

    raiser = failure(1, 1, error_time_s=7.0, traceback=TRACEBACK, message="ValueError: bad batch")
    verdict = classify([raiser, failure(0, SIGTERM)])
    reply = tmp_path / "agent_error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(reply))
    ConsoleSession._write_reply_file(verdict)
    data = json.loads(reply.read_text())
    assert data == {
        "message": {
            "message": "rank 1 (node 0) failed first: ValueError: bad batch",
            "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "7"},
        }
    }
    # torch's reader takes it as a worker's error file
    parsed = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(reply))
    assert parsed.timestamp == 7 and parsed.message == data["message"]
    reply.write_text("{}")
    ConsoleSession._write_reply_file(verdict)  # an existing file is left alone
    assert reply.read_text() == "{}"
    assert report.reply_file_data(classify([]), 0.0) is None


def test_reply_file_fills_an_empty_file_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kubernetes mounts an empty /dev/termination-log: written in place, not replaced."""
    from torchx_elastic.agent.console.session import ConsoleSession

    verdict = classify([failure(1, 1, message="ValueError: bad batch")])
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")
    monkeypatch.setenv(ERROR_FILE_ENV, str(termination_log))
    ConsoleSession._write_reply_file(verdict)
    data = json.loads(termination_log.read_text())
    assert data["message"]["message"] == "rank 1 (node 0) failed first: ValueError: bad batch"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["termination-log"]


def test_an_unwritable_log_dir_is_warned_about_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from torchx_elastic.agent.console.session import ConsoleSession

    blocker = tmp_path / "file"
    blocker.write_text("")
    session = ConsoleSession(str(blocker), mode="plain", status_interval_s=0)
    assert session.finish(None, 0, attempt=0) is None
    messages = [r.getMessage().split(":")[0] for r in caplog.records]
    assert f"cannot write the run summary {blocker / f'{SUMMARY_PREFIX}0.json'}" in messages
    assert f"cannot write the event log {blocker / EVENTS_FILE}" in messages


def test_an_unwritable_reply_file_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torchx_elastic.agent.console.session import ConsoleSession

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(ERROR_FILE_ENV, str(blocker / RANK_ERROR_FILE))
    ConsoleSession._write_reply_file(classify([failure(1, 1)]))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"cannot write the error file {blocker / RANK_ERROR_FILE}"
    ]
