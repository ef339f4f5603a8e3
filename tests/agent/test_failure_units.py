"""What a worker leaves behind never kills the agent; one first failure per job; restarts."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from torch.distributed import HashStore

from torchx_elastic.agent.console.failure import report
from torchx_elastic.agent.console.failure.first_failure import (
    FirstFailure,
    RestartNotice,
    agree,
    innermost_frame,
    leave_together,
)
from torchx_elastic.agent.console.output.sinks import RankOutput
from torchx_elastic.agent.workers.processes import process_failure
from torchx_elastic.contract import FAILURE_KEY_PREFIX, RANK_ERROR_FILE, STDERR_FILE, STDOUT_FILE
from torchx_elastic.contract.error_file import read_error_file, write_error_file

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/train.py", line 30, in <module>\n'
    "    main()\n"
    '  File "/work/train.py", line 12, in main\n'
    '    raise ValueError("bad batch")\n'
    "ValueError: bad batch\n"
)
SIGTERM = -int(signal.SIGTERM)
BOOM = FirstFailure(2, 1, "exit code 1", "ValueError: bad batch", 'File "/work/train.py", line 12')


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b'{"message": {"message": "Value', "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b'["a", "list"]', "not in torch's error-file format"),
        (b'{"message": {"extraInfo": {"timestamp": "soon"}}}', "not in torch's error-file format"),
        (b'{"errors": 1}', "not in torch's error-file format"),
    ],
)
def test_an_unusable_error_file_says_why_and_never_raises(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / RANK_ERROR_FILE
    path.write_bytes(content)
    read = read_error_file(str(path))
    assert read is not None and read.problem.startswith(problem)
    failure = process_failure(3, 1234, SIGTERM, str(path))  # torch's own constructor raises here
    assert failure.exitcode == SIGTERM and failure.pid == 1234


def test_a_directory_fifo_or_dangling_link_in_place_of_the_error_file_is_unreadable(
    tmp_path: Path,
) -> None:
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)  # opening it would block the agent
    link.symlink_to(tmp_path / "gone")
    for path in (tmp_path, fifo, link):
        read = read_error_file(str(path))
        assert read is not None and read.problem == "not a regular file"


def test_both_of_torchs_formats_are_read(tmp_path: Path) -> None:
    path = tmp_path / RANK_ERROR_FILE
    assert read_error_file(str(path)) is None
    write_error_file(str(path), "ValueError: bad batch", TRACEBACK, 1700000000)
    read = read_error_file(str(path))
    assert read is not None and not read.problem
    assert (read.message, read.traceback, read.timestamp_s) == (
        "ValueError: bad batch",
        TRACEBACK,
        1700000000.0,
    )
    path.write_text(json.dumps({"message": "plain", "timestamp": "12"}))
    read = read_error_file(str(path))
    assert read is not None and (read.message, read.timestamp_s) == ("plain", 12.0)
    assert process_failure(0, 1, 1, str(path)).message == "plain"


def test_the_report_reads_a_file_written_after_the_process_died(tmp_path: Path) -> None:
    rank_dir = tmp_path / "attempt_0" / "rank_3"
    rank_dir.mkdir(parents=True)
    error_file = rank_dir / RANK_ERROR_FILE
    error_file.write_text("")  # what the agent saw when the rank exited
    failure = process_failure(3, 42, 1, str(error_file))
    output = RankOutput(3, 3, 0, str(rank_dir / STDOUT_FILE), str(rank_dir / STDERR_FILE))
    (fact,) = report.collect({3: failure}, [output], {}, {3: str(error_file)})
    assert fact.error_problem == "empty" and fact.message == ""
    text = report.render(report.classify([fact]), str(tmp_path))
    assert f"  error file unreadable (empty): {error_file}\n" in text
    write_error_file(str(error_file), "ValueError: bad batch", TRACEBACK)  # its child wrote it
    (fact,) = report.collect({3: failure}, [output], {}, {3: str(error_file)})
    assert fact.message == "ValueError: bad batch" and fact.traceback == TRACEBACK
    assert not fact.error_problem


def test_the_first_offer_wins_and_every_node_reads_it() -> None:
    store = HashStore()
    later = FirstFailure(0, 0, "exit code 3")
    assert agree(store, 0, BOOM) == BOOM
    assert agree(store, 0, later) == BOOM  # another node's own failure, offered later
    assert agree(store, 0, None, wait_s=0.1) == BOOM  # a node whose ranks only lost peers
    assert agree(store, 1, later) == later  # each attempt has its own


def test_a_node_with_only_victims_waits_for_the_offer_then_gives_up() -> None:
    store = HashStore()
    assert agree(store, 0, None, wait_s=0.2) is None


def test_a_foreign_value_is_ignored() -> None:
    store = HashStore()
    store.set(f"{FAILURE_KEY_PREFIX}0", "not json")
    assert agree(store, 0, BOOM) == BOOM
    assert agree(store, 0, None, wait_s=0.1) is None


def test_the_last_node_to_leave_does_not_wait() -> None:
    store = HashStore()
    leave_together(store, 0, 2, wait_s=0.1)  # the other node never comes: 0.1 s, no error
    leave_together(store, 0, 2, wait_s=30)  # it came: at once
    assert store.add(f"{FAILURE_KEY_PREFIX}0/left", 0) == 2


def test_the_innermost_frame_names_file_and_line() -> None:
    assert innermost_frame(TRACEBACK) == 'File "/work/train.py", line 12'
    assert innermost_frame("") == ""


def test_the_restart_line_names_rank_attempt_restarts_left_and_round() -> None:
    notice = RestartNotice(BOOM, attempt=1, max_restarts=3, next_round=2)
    assert notice.line() == (
        "torchx-elastic: rank 2 (node 1) failed: ValueError: bad batch"
        ' (File "/work/train.py", line 12); restarting every node: attempt 2 of 4'
        " (2 restarts left), rendezvous round 2 next"
    )
    assert notice.said_by(1) and not notice.said_by(0)
    assert notice.fields() == {
        "failed_rank": 2,
        "failed_node": 1,
        "failure": 'ValueError: bad batch (File "/work/train.py", line 12)',
        "max_restarts": 3,
        "restarts_left": 2,
        "next_round": 2,
    }
    unknown = RestartNotice(None, attempt=3, max_restarts=3, next_round=7)
    assert unknown.said_by(0) and not unknown.said_by(1)
    assert unknown.line() == (
        "torchx-elastic: a rank failed; restarting every node: attempt 4 of 4"
        " (0 restarts left), rendezvous round 7 next"
    )
    killed = RestartNotice(FirstFailure(5, 0, "signal SIGKILL"), 1, 2, 2)
    assert (
        "(node 0) failed: signal SIGKILL; restarting every node: attempt 2 of 3 (1 restart left)"
        in (killed.line())
    )


def _failure(rank: int, exitcode: int, **kw: object) -> report.RankFailure:
    return report.RankFailure(rank=rank, local_rank=rank, node=0, pid=1, exitcode=exitcode, **kw)  # type: ignore[arg-type]


def test_a_node_that_only_lost_peers_names_the_first_failure_and_its_victims() -> None:
    lost = report.RankFailure(
        rank=1,
        local_rank=1,
        node=0,
        pid=7,
        exitcode=1,
        message="RuntimeError: Connection closed by peer [10.0.0.2]:41234",
    )
    stopped = _failure(0, SIGTERM, error_problem="empty")
    verdict = report.classify([lost, stopped])
    assert verdict.root_is_victim
    text = report.render_peer_failure(verdict, BOOM, "/logs", "/logs/summary_node0.json")
    assert "Root cause" not in text
    assert text.startswith("\n" + "=" * 72 + "\nJob failed\n" + "=" * 72 + "\n")
    assert "  rank 2 (node 1) failed first: ValueError: bad batch\n" in text
    assert '  at File "/work/train.py", line 12\n' in text
    assert "  its traceback and logs are in node 1's report\n" in text
    assert "Victims (failed only because a peer failed):\n" in text
    assert "  rank 1 (node 0, local rank 1): exit code 1, lost a peer: RuntimeError:" in text
    assert (
        "  rank 0 (node 0, local rank 0): signal SIGTERM, stopped by SIGTERM after another rank"
        " failed; error file unreadable (empty)\n" in text
    )
    assert text.endswith("Logs of every rank: /logs\nSummary (JSON): /logs/summary_node0.json\n")


def test_a_later_failure_of_its_own_is_not_a_second_root_cause() -> None:
    own = _failure(0, 3, message="OSError: disk full")
    text = report.render_peer_failure(report.classify([own]), BOOM, "/logs")
    assert "Root cause" not in text
    assert "  also failed on its own: rank 0 (exit code 3) OSError: disk full\n" in text


def test_every_nodes_reply_file_names_the_first_failure() -> None:
    victim = report.classify([_failure(0, SIGTERM)])
    data = report.reply_file_data(victim, 5.0, BOOM)
    assert data is not None
    assert data["message"]["message"] == "rank 2 (node 1) failed first: ValueError: bad batch"
    raiser = report.RankFailure(
        rank=2,
        local_rank=0,
        node=1,
        pid=9,
        exitcode=1,
        message="ValueError: bad batch",
        traceback=TRACEBACK,
    )
    own = report.reply_file_data(report.classify([raiser]), 5.0, BOOM)
    assert own is not None and own["message"]["message"] == data["message"]["message"]
    assert own["message"]["extraInfo"]["py_callstack"] == TRACEBACK


def test_a_node_whose_ranks_still_ran_names_the_first_failure_only() -> None:
    nothing = report.Verdict(root=None)
    text = report.render_peer_failure(nothing, BOOM, "/logs")
    assert "  rank 2 (node 1) failed first: ValueError: bad batch\n" in text
    assert "  this node's ranks were still running: they were stopped\n" in text
    assert "Victims" not in text and "Root cause" not in text
    data = report.reply_file_data(nothing, 5.0, BOOM)
    assert data is not None
    assert data["message"]["message"] == "rank 2 (node 1) failed first: ValueError: bad batch"
    assert report.reply_file_data(nothing, 5.0) is None
