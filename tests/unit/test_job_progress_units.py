"""Progress across nodes, in this process: the summary's forms, aggregation, and what
``torchx status`` makes of the line (the exchange over a real torch TCPStore and the
rendezvous hook: tests/agent/test_progress_exchange.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.agent.console.progress.exchange import (
    NodeReport,
    RankReport,
    SeenReport,
    aggregate,
    node_report,
)
from torchx_elastic.contract.job_progress import (
    JobSummary,
    NodeCounts,
    QuietRank,
    parse_line,
    parse_nodes_line,
    read_file,
    read_nodes_file,
    write_file,
)
from torchx_elastic.schedulers.local_cwd import file_progress_text
from torchx_elastic.schedulers.progress_status import (
    join_message,
    log_timestamp,
    progress_message,
    replicas_progress,
)


def _summary(**changes: Any) -> JobSummary:
    fields: dict[str, Any] = dict(
        step=120, total=200, slowest_rank=3, slowest_node=1, fastest_rank=0, fastest_node=0,
        fastest_step=131, rate_per_s=4.1, eta_s=19.5, ranks_reporting=4, ranks=4,
        nodes_reporting=2, nodes=2, quiet=(), time_s=1.0,
    )  # fmt: skip
    fields.update(changes)
    return JobSummary(**fields)


def test_the_line_says_where_the_whole_job_is() -> None:
    assert _summary().line() == (
        "[job progress] 120/200 (60.0%) of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120,"
        " fastest r0 (n0) 131, 4.1 steps/s, ETA 20s"
    )
    quiet = tuple(QuietRank(r, 1, 45.0 + r) for r in range(6))
    line = _summary(total=None, rate_per_s=None, eta_s=None, quiet=quiet).line()
    assert line == (
        "[job progress] 120/? of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120,"
        " fastest r0 (n0) 131, quiet: r0 (n1) 45s r1 (n1) 46s r2 (n1) 47s r3 (n1) 48s +2 more"
    )


def test_the_line_reads_back_after_any_prefix() -> None:
    figures = parse_line("2026-11-22T10:00:00.1Z progress/0 " + _summary().line())
    assert figures is not None
    assert (figures.step, figures.total, figures.ranks_reporting, figures.ranks) == (
        120, 200, 4, 4,
    )  # fmt: skip
    assert (figures.rate_per_s, figures.eta, figures.quiet) == (4.1, "20s", None)
    quiet = _summary(rate_per_s=None, eta_s=None, quiet=(QuietRank(5, 1, 45.0),)).line()
    figures = parse_line(quiet)
    assert figures is not None and (figures.rate_per_s, figures.eta) == (None, None)
    assert figures.quiet == "r5 (n1) 45s"
    assert parse_line("[n0 r0] [job progress] is what I print") is None
    assert parse_line("step 10/200 of 4 ranks") is None


def test_the_file_round_trips(tmp_path: Path) -> None:
    summary = _summary(quiet=(QuietRank(2, 0, 31.0),))
    path = write_file(str(tmp_path), summary)
    assert read_file(path) == summary
    assert read_file(str(tmp_path / "missing.json")) is None
    (tmp_path / "bad.json").write_text('{"step": 1}')
    assert read_file(str(tmp_path / "bad.json")) is None


def _rank(rank: int, step: int | None, rate: float | None = 2.0, silent_s: float | None = 0.5,
          finished: bool = False) -> RankReport:  # fmt: skip
    return RankReport(rank, step, None if step is None else 100, rate, silent_s, finished)


def _seen(report: NodeReport, unchanged_s: float = 0.0, age_s: float | None = None) -> SeenReport:
    return SeenReport(report, unchanged_s, unchanged_s if age_s is None else age_s)


def test_aggregate_finds_the_slowest_and_fastest_rank_of_any_node() -> None:
    node0 = NodeReport(0, 7, False, (_rank(0, 50, 5.0), _rank(1, 48, 4.0)))
    node1 = NodeReport(1, 3, False, (_rank(2, 40, 2.5), _rank(3, 60, 6.0)))
    summary = aggregate([_seen(node0), _seen(node1)], num_nodes=2, time_s=5.0)
    assert summary is not None
    assert (summary.slowest_rank, summary.slowest_node, summary.step) == (2, 1, 40)
    assert (summary.fastest_rank, summary.fastest_node, summary.fastest_step) == (3, 1, 60)
    assert (summary.rate_per_s, summary.eta_s) == (2.5, 24.0)  # the slowest rank's pace
    assert (summary.ranks_reporting, summary.ranks, summary.nodes_reporting) == (4, 4, 2)
    assert summary.quiet == () and summary.time_s == 5.0


def test_aggregate_names_quiet_ranks_and_nodes_that_stopped_publishing() -> None:
    node0 = NodeReport(0, 9, False, (_rank(0, 50, silent_s=40.0), _rank(1, None, silent_s=None)))
    # node 1's report has not changed for 28 s: its ranks were last heard 28 s + 3 s ago, and
    # the node is not live any more: its ranks count in neither the figures nor the nodes
    node1 = NodeReport(1, 2, False, (_rank(2, 40, silent_s=3.0), _rank(3, 45, finished=True)))
    summary = aggregate([_seen(node0), _seen(node1, 28.0)], num_nodes=3, quiet_after_s=30.0)
    assert summary is not None
    assert summary.quiet == (QuietRank(0, 0, 40.0), QuietRank(2, 1, 31.0))
    assert (summary.ranks_reporting, summary.ranks, summary.nodes_reporting) == (1, 4, 1)
    assert (summary.step, summary.slowest_node, summary.nodes) == (50, 0, 3)
    # a rank that never spoke, a finished rank, a final report: not quiet (and a final
    # report stays live however long it has not changed: that node is done, not lost)
    final = NodeReport(1, 3, True, (_rank(2, 40, silent_s=300.0),))
    assert aggregate([_seen(final, 100.0)], num_nodes=1) is not None
    assert aggregate([_seen(final, 100.0)], num_nodes=1).quiet == ()  # type: ignore[union-attr]
    assert aggregate([_seen(NodeReport(0, 1, False, (_rank(0, None),)))], 1) is None


def test_aggregate_compares_the_ranks_at_one_moment() -> None:
    # lockstep at 10 steps/s: node 1's figures are 0.9 s older than node 0's (the exchange's lag)
    fresh = NodeReport(0, 5, False, (_rank(0, 109, 10.0, silent_s=0.0),))
    lagging = NodeReport(1, 5, False, (_rank(1, 100, 10.0, silent_s=0.0),))
    summary = aggregate([_seen(fresh), _seen(lagging, age_s=0.9)], num_nodes=2)
    assert summary is not None
    assert (summary.step, summary.fastest_step) == (100, 100)  # no spread: it is the lag
    assert (summary.slowest_rank, summary.fastest_rank) == (0, 1)
    # a rank that really lags stays behind; one silent for long does not move the moment and
    # keeps its step; a done rank keeps its last step; nothing is projected forward
    behind = NodeReport(2, 5, False, (_rank(2, 95, 10.0, silent_s=0.0),))
    stuck = NodeReport(3, 5, False, (_rank(3, 50, 10.0, silent_s=3.0),))
    done = NodeReport(4, 5, False, (_rank(4, 120, 10.0, silent_s=0.0, finished=True),))
    seen = [_seen(fresh), _seen(lagging, age_s=0.9), _seen(behind, age_s=0.5), _seen(stuck)]
    summary = aggregate([*seen, _seen(done)], num_nodes=5)
    assert summary is not None
    assert (summary.step, summary.slowest_rank, summary.fastest_step) == (50, 3, 120)
    summary = aggregate(seen[:3], num_nodes=3)
    assert summary is not None and (summary.step, summary.slowest_rank) == (91, 2)


def test_a_ranks_step_is_as_old_as_the_message_that_said_it() -> None:
    now = [0.0]
    activity = RankActivity(clock=lambda: now[0])
    activity.progress(0, 0, 10, 100)
    now[0] = 2.0
    activity.heartbeat(0, 0)  # alive, but the step is still the one said at 0 s
    now[0] = 2.5
    report = node_report(activity, {0: 3}, 1, 1, now[0], sent_s=7.0)
    assert report.ranks == (RankReport(3, 10, 100, None, 0.5, False, 2.5),)
    assert report.sent_s == 7.0 and NodeReport.from_json(report.to_json()) == report
    # an older agent's report (no step age, no time): read, its silence taken as the step's age
    older = NodeReport.from_json('{"node":1,"seq":1,"final":false,"ranks":[[3,10,100,2.0,0.5,0]]}')
    assert older == NodeReport(1, 1, False, (RankReport(3, 10, 100, 2.0, 0.5, False),))
    fresh = NodeReport(0, 1, False, (_rank(0, 12, 2.0, silent_s=0.0),))
    summary = aggregate([_seen(older), _seen(fresh)], num_nodes=2)
    assert summary is not None and (summary.step, summary.fastest_step) == (10, 11)


def test_node_reports_round_trip_and_bad_ones_are_refused() -> None:
    report = NodeReport(1, 4, True, (_rank(2, 40), _rank(3, None, None, None)))
    assert NodeReport.from_json(report.to_json().encode()) == report
    for bad in ("", "[]", '{"node": 1}', '{"node":1,"seq":1,"final":false,"ranks":[[1]]}'):
        with pytest.raises(ValueError, match="not a node progress report"):
            NodeReport.from_json(bad)


NOW = datetime(2026, 11, 22, 10, 0, 30, tzinfo=timezone.utc)


def test_status_shows_the_newest_progress_line_with_its_age() -> None:
    lines = [
        "2026-11-22T10:00:00.000000001Z [job progress] 10/200 (5.0%) of 4/4 ranks on 2/2"
        " nodes, slowest r3 (n1) 10, fastest r0 (n0) 12, 2 steps/s, ETA 1m35s",
        "2026-11-22T10:00:05.123456789Z [n0 r0] step 10",
        "2026-11-22T10:00:25.5Z [job progress] 50/200 (25.0%) of 3/4 ranks on 2/2 nodes,"
        " slowest r3 (n1) 50, fastest r0 (n0) 60, 2 steps/s, ETA 1m15s, quiet: r1 (n0) 40s",
        "2026-11-22T10:00:28Z [n0 r0] [job progress] printed by the script is no line of ours",
    ]
    assert progress_message(lines, now=NOW, where="log of c0") == (
        "progress 50/200 (25.0%) of 3/4 ranks, 2 steps/s, ETA 1m15s, quiet: r1 (n0) 40s"
        " (as of 4s ago, log of c0)"
    )
    assert progress_message(lines[1:2], now=NOW) is None
    assert log_timestamp("2026-11-22T10:00:05.123456789Z") == datetime(
        2026, 11, 22, 10, 0, 5, 123456, tzinfo=timezone.utc
    )
    assert log_timestamp("yesterday") is None
    assert NOW - timedelta(seconds=30) == log_timestamp("2026-11-22T10:00:00Z")


def test_with_spares_the_line_and_status_say_the_nodes_training_and_standing_by() -> None:
    line = _summary(standbys=1).line()
    assert line.startswith("[job progress] 120/200 (60.0%) of 4/4 ranks on 2/2 nodes, 1 standby,")
    figures = parse_line(line)
    assert figures is not None and (figures.nodes, figures.standbys, figures.rate_per_s) == (
        2, 1, 4.1,
    )  # fmt: skip
    stamped = [f"2026-11-22T10:00:25Z {_summary(standbys=0).line()}"]
    assert progress_message(stamped, now=NOW, where="") == (
        "progress 120/200 (60.0%) of 4/4 ranks, nodes: 2 training, 0 standby, 4.1 steps/s,"
        " ETA 20s (as of 5s ago)"
    )
    without = parse_line(_summary().line())
    assert without is not None and without.standbys is None  # a job that never had spares
    assert _summary(standbys=1).figures() == figures


def test_without_progress_the_line_says_the_nodes_and_reads_back() -> None:
    counts = NodeCounts(nodes=2, standbys=1, time_s=1.0)
    assert counts.line() == "[job progress] nodes: 2 training, 1 standby"
    assert parse_nodes_line("2026-11-22T10:00:25Z " + counts.line()) == NodeCounts(2, 1)
    assert parse_nodes_line("[job progress] nodes: 2 training, 0 standby\n") == NodeCounts(2, 0)
    assert parse_line(counts.line()) is None  # no progress figures in it
    assert parse_nodes_line(_summary(standbys=1).line()) is None
    assert parse_nodes_line("[n0 r0] nodes: 2 training, 1 standby, as the script says") is None
    assert parse_nodes_line(WAITING_LINE) is None


WAITING_LINE = "[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node"


def test_without_progress_status_says_the_nodes_of_the_newest_line() -> None:
    nodes = "2026-11-22T10:00:27Z [job progress] nodes: 2 training, 1 standby"
    progress = f"2026-11-22T10:00:20Z {_summary(standbys=1).line()}"
    assert progress_message([progress, nodes, "2026-11-22T10:00:28Z [n0 r0] step"], NOW) == (
        "nodes: 2 training, 1 standby (as of 3s ago, replica 0's log)"
    )
    assert progress_message([nodes, progress], NOW, where="") == (
        "progress 120/200 (60.0%) of 4/4 ranks, nodes: 2 training, 1 standby, 4.1 steps/s,"
        " ETA 20s (as of 10s ago)"
    )  # with progress, as before
    # replica 0 stands by as the spare: the line of the rank-0 agent of another replica
    standby_log = ["2026-11-22T10:00:01Z torchx-elastic: standing by: the job has its 2 nodes"]
    replicas = [("replica 0's log", lambda: standby_log), ("replica 1's log", lambda: [nodes])]
    assert replicas_progress(replicas, NOW) == (
        "nodes: 2 training, 1 standby (as of 3s ago, replica 1's log)"
    )


def test_local_cwd_status_reads_the_nodes_or_the_progress_from_the_file(tmp_path: Path) -> None:
    at = NOW.timestamp() - 2
    path = write_file(str(tmp_path), NodeCounts(2, 1, at))
    assert read_nodes_file(path) == NodeCounts(2, 1, at)
    assert read_file(path) is None  # no summary: local_cwd's live bar draws nothing
    assert file_progress_text(path, NOW) == (
        "nodes: 2 training, 1 standby (as of 2s ago, its rank-0 agent)"
    )
    write_file(str(tmp_path), _summary(standbys=1, time_s=at))
    assert read_nodes_file(path) is None
    assert file_progress_text(path, NOW) == (
        "progress 120/200 (60.0%) of 4/4 ranks, nodes: 2 training, 1 standby, 4.1 steps/s,"
        " ETA 20s (as of 2s ago, its rank-0 agent)"
    )
    assert file_progress_text(str(tmp_path / "missing.json"), NOW) is None


def test_status_message_keeps_what_was_there() -> None:
    assert join_message("<NONE>", "progress 1/2", "<NONE>") == "progress 1/2"
    assert join_message("", "progress 1/2") == "progress 1/2"
    assert join_message("r1 failed", "progress 1/2") == "r1 failed\nprogress 1/2"
    assert join_message("r1 failed", None) == "r1 failed"


def test_status_shows_the_waiting_line_while_it_is_the_newest() -> None:
    waiting = (
        "2026-11-22T10:00:20Z torchx-elastic: waiting for nodes: 2 of 3 joined; here: p0 (pid"
        " 7), p1 (pid 7); missing: 1 node; hosting the rendezvous at p0:29500, run id 'j';"
        " gives up at 10:10:00 (join timeout 600s)"
    )
    lines = ["2026-11-22T10:00:01Z [torchx-elastic WARNING] something", waiting]
    assert progress_message(lines, now=NOW, where="log of pod p0") == (
        "waiting for nodes: 2 of 3 joined; here: p0 (pid 7), p1 (pid 7); missing: 1 node;"
        " hosting the rendezvous at p0:29500, run id 'j'; gives up at 10:10:00 (join timeout"
        " 600s) (as of 10s ago, log of pod p0)"
    )
    # once the round is complete, the workers' lines come after it: no longer waiting
    assert progress_message([*lines, "2026-11-22T10:00:25Z [n0 r0] step 1"], now=NOW) is None


def test_status_shows_the_waiting_line_behind_the_job_progress_line_of_the_wait() -> None:
    waiting = (
        "2026-11-22T10:00:20Z torchx-elastic: waiting for nodes: 2 of 3 joined; here: p0 (pid"
        " 7), p1 (pid 7); missing: 1 node; hosting the rendezvous at p0:29500, run id 'j';"
        " gives up at 10:10:00 (join timeout 600s)"
    )
    job_line = (
        "2026-11-22T10:00:25Z [job progress] waiting for nodes: 2 of 3 joined; missing: 1 node"
    )
    message = progress_message([waiting, job_line], now=NOW, where="log of pod p0")
    assert message is not None and message.startswith("waiting for nodes: 2 of 3 joined; here: ")
    assert message.endswith("(join timeout 600s) (as of 5s ago, log of pod p0)")
