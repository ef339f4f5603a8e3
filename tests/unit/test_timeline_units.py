"""torchx-elastic timeline: records to lanes, marks and causes; HTML and trace; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.timeline_jobs import T0, generated_job, record, write_crash_files, write_events
from torchx_elastic.contract import RANK_ERROR_FILE
from torchx_elastic.contract import events as ev
from torchx_elastic.contract.events import restarted_or_failed
from torchx_elastic.contract.log_layout import LocalAppLogs
from torchx_elastic.timeline import cli, html, trace
from torchx_elastic.timeline.log_dir import SourceError, find_log_dir, timeline_of_dir
from torchx_elastic.timeline.model import Timeline


@pytest.fixture
def crashed_2x2(tmp_path: Path) -> Path:
    log_dir = Path(LocalAppLogs(str(tmp_path / "torchx" / "train-abc")).agents("train").root)
    write_events(
        log_dir,
        generated_job(2, 2, progress_samples=5),
        extra_lines='{"half a line\n["not", "an object"]\n',
    )
    write_crash_files(log_dir)
    return log_dir


def test_lanes_restart_cause_root_and_victims(crashed_2x2: Path) -> None:
    timeline = timeline_of_dir(str(crashed_2x2))
    assert timeline.title == "train-abc (train)"
    assert [(lane.node, lane.host, lane.local_ranks) for lane in timeline.nodes] == [
        (0, "host0", 2),
        (1, "host1", 2),
    ]
    assert [(s.attempt, s.end, s.ranks) for s in timeline.nodes[1].spans] == [
        (0, "failed", (2, 3)),
        (1, "succeeded", (2, 3)),
    ]
    (restart,) = timeline.job_marks
    assert restart.label == (
        "restart 1 after rank 1 (node 0) failed first: exit code 1, ValueError: bad batch on rank 1"
    )
    assert "raise ValueError" in restart.detail
    roles = {f.rank: (f.role, f.how) for f in timeline.failures}
    assert roles == {
        1: ("root", "exit code 1"),
        0: ("victim", "signal SIGTERM"),
        2: ("victim", "signal SIGTERM"),
        3: ("victim", "signal SIGTERM"),
    }
    rank_marks = [
        (m.kind, m.label, m.local_rank) for m in timeline.nodes[0].marks if m.local_rank is not None
    ]
    assert ("failure", "rank 1: exit code 1", 1) in rank_marks
    assert ("victim", "rank 0: signal SIGTERM", 0) in rank_marks
    assert timeline.state == "SUCCEEDED"
    assert [p.step for p in timeline.progress] == [0, 1, 2, 3, 4]


def test_an_empty_error_file_is_read_as_the_agent_reads_it(crashed_2x2: Path) -> None:
    # a worker killed while @record writes its error file leaves it empty: the root cause
    # still comes from the rank's exit code and its stderr, as in the agent's report
    (crashed_2x2 / "attempt_0" / "rank_1" / RANK_ERROR_FILE).write_text("")
    timeline = timeline_of_dir(str(crashed_2x2))
    root = next(f for f in timeline.failures if f.role == "root")
    assert (root.rank, root.how) == (1, "exit code 1")
    assert "ValueError: bad batch on rank 1" in root.traceback_head


def test_joins_leaves_hangs_and_unknown_records(tmp_path: Path) -> None:
    records = [
        record(ev.RENDEZVOUS, T0, 0, 1, attempt=0, group_world_size=2, ranks=[0]),
        record(ev.RENDEZVOUS, T0, 1, 2, attempt=0, group_world_size=2, ranks=[1]),
        record(ev.START, T0 + 1, 0, 1, attempt=0, pids={"0": 10}),
        record(ev.START, T0 + 1, 1, 2, attempt=0, pids={"1": 11}),
        # node 1's agent is killed: it writes nothing more
        record("restart_facts", T0 + 5, 0, 1, whatever={"a": 1}),  # a newer agent's record
        {"time_s": T0 + 5, "event": "job_root_cause", "rank": 3},  # one of no agent
        record(ev.RESTART, T0 + 6, 0, 1, attempt=0, reason="membership change", new=1),
        record(ev.RENDEZVOUS, T0 + 7, 0, 1, attempt=0, group_world_size=2, ranks=[0]),
        # a new node takes the node rank of the one that left
        {
            **record(ev.RENDEZVOUS, T0 + 7, 1, 3, attempt=0, group_world_size=2, ranks=[1]),
            "host": "host2",
        },
        record(ev.START, T0 + 8, 0, 1, attempt=0, pids={"0": 12}),
        {
            **record(
                ev.FAILURE,
                T0 + 9,
                1,
                3,
                attempt=0,
                failures={"1": {"local_rank": 0, "pid": 13, "exitcode": -9}},
            ),
            "host": "host2",
        },
        record(ev.HANG, T0 + 20, 0, 1, attempt=0, ranks=[0], message="rank 0 sent nothing"),
        {"event": ev.EXIT, "note": "no time: dropped"},
    ]
    write_events(tmp_path, records)
    timeline = timeline_of_dir(str(tmp_path))
    marks = {(lane.host, m.kind, m.label) for lane in timeline.nodes for m in lane.marks}
    assert ("host1", "leave", "node 1 left") in marks
    assert ("host2", "join", "node 1 joined") in marks
    assert ("host2", "failure", "rank 1: signal SIGKILL") in marks
    assert ("host0", "restart", "restart: membership change") in marks
    assert ("host0", "hang", "rank 0 hung") in marks
    assert timeline.state == "RUNNING"
    assert [lane.host for lane in timeline.nodes] == ["host0", "host1", "host2"]
    assert restarted_or_failed(str(tmp_path))


def test_generated_64x8_job_renders_small(tmp_path: Path) -> None:
    """(How long it takes is a speed: bench/.)"""
    write_events(tmp_path, generated_job(64, 8, progress_samples=1000))
    write_crash_files(tmp_path)
    timeline = timeline_of_dir(str(tmp_path))
    page = html.render(timeline)
    trace_text = json.dumps(trace.trace_events(timeline))
    assert timeline.ranks == 512 and len(timeline.nodes) == 64
    assert len(page.encode()) < 1_000_000, len(page)
    assert len(trace_text.encode()) < 2_000_000, len(trace_text)
    (tmp_path / "timeline.html").write_text(page)


def test_page_is_self_contained_and_escapes_the_data(crashed_2x2: Path) -> None:
    timeline = timeline_of_dir(str(crashed_2x2))
    timeline.title = "</script><script>alert(1)</script> __DATA__"
    timeline.source = "__TITLE__"
    page = html.render(timeline)
    assert page.count("</script>") == 2  # the data's and the code's, none from the title
    assert (
        "<title>timeline: &lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; __DATA__</title>"
        in page
    )
    assert '"source":"__TITLE__"' in page
    for fetched in ("src=", "href=", "@import", "url(", "fetch(", "XMLHttpRequest"):
        assert fetched not in page
    assert "default-src 'none'" in page


def test_trace_has_a_process_per_node_a_thread_per_rank_and_the_failure(
    crashed_2x2: Path,
) -> None:
    data = trace.trace_events(timeline_of_dir(str(crashed_2x2)))
    events = data["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert (0, "node 0 (host0)") in names and (1, "node 1 (host1)") in names
    threads = {
        (e["pid"], e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"
    }
    assert (0, 2, "rank 1") in threads
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 2]
    assert [e["name"] for e in spans] == ["attempt 0", "attempt 1"]
    assert spans[0]["dur"] == 9_000_000 and spans[0]["ts"] == int((T0 + 1) * 1e6)
    starting = [e for e in events if e["name"] == "starting the workers" and e["pid"] == 1]
    assert [(e["tid"], e["dur"]) for e in starting] == [(0, 950_000), (0, 1_000_000)]
    failure = next(e for e in events if e["ph"] == "i" and e["cat"] == "failure")
    assert (failure["pid"], failure["tid"], failure["name"]) == (0, 2, "rank 1: exit code 1")
    assert any(e["ph"] == "C" and e["args"]["slowest"] == 4 for e in events)


def test_cli_writes_both_formats_into_the_log_dir(
    crashed_2x2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    top = crashed_2x2.parents[3]
    assert cli.main(["timeline", str(top)]) == 0
    assert capsys.readouterr().out == (
        f"timeline of train-abc (train): {crashed_2x2 / 'timeline.html'}\n"
    )
    assert (
        cli.main(["timeline", str(crashed_2x2), "--format", "trace", "-o", str(top / "t.json")])
        == 0
    )
    assert json.loads((top / "t.json").read_text())["otherData"]["state"] == "SUCCEEDED"
    assert cli.main(["timeline", "local_cwd://torchx/train-abc", "--log-dir", str(top)]) == 0


def test_cli_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["timeline", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"torchx-elastic timeline: no events.jsonl in {tmp_path}: give the agents' log"
        " directory (their --log-dir; local_cwd: <log_dir>/<session>/<app_id>/torchelastic/"
        "<role>)\n"
    )
    assert cli.main(["timeline", "slurm://x/y"]) == 1
    assert "not a log directory nor an app handle" in capsys.readouterr().err
    write_events(tmp_path / "a", [])
    write_events(tmp_path / "b", [])
    with pytest.raises(SourceError, match="2 jobs' event logs under"):
        find_log_dir(str(tmp_path))
    with pytest.raises(SourceError, match="^/no/such: no such directory$"):
        find_log_dir("/no/such")


def test_a_run_without_restarts_needs_no_timeline(tmp_path: Path) -> None:
    write_events(tmp_path, [record(ev.EXIT, T0, 0, 1, exit_code=0, state="SUCCEEDED")])
    assert not restarted_or_failed(str(tmp_path))
    write_events(tmp_path, [record(ev.EXIT, T0, 0, 1, exit_code=1, state="FAILED")])
    assert restarted_or_failed(str(tmp_path))


def test_empty_log_dir_draws_an_empty_timeline(tmp_path: Path) -> None:
    write_events(tmp_path, [])
    timeline = timeline_of_dir(str(tmp_path))
    assert isinstance(timeline, Timeline) and timeline.nodes == []
    assert '"nodes":[]' in html.render(timeline)
