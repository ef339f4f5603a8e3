"""The worker API, the channel and the progress summary, in one process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.waiting import wait_until
from torchx_elastic import contract, worker
from torchx_elastic.agent.console.progress import channel as channel_module
from torchx_elastic.agent.console.progress.channel import (
    ActivityChannel,
    RankActivity,
    RankProgress,
)
from torchx_elastic.agent.console.progress.node_summary import status_line, summarize
from torchx_elastic.contract import RESTART_COUNT_ENV
from torchx_elastic.contract.job_progress import format_duration


@pytest.fixture
def fresh_sender(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(worker, "_sender", None)
    yield
    monkeypatch.setattr(worker, "_sender", None)


def test_progress_is_a_no_op_outside_the_agent(
    fresh_sender: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(contract.CHANNEL_ENV, raising=False)
    worker.progress(1, 10)
    worker.heartbeat()
    assert worker._sender is not None and not worker._sender.active


def test_progress_reaches_the_agent_and_is_rate_limited(
    fresh_sender: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    activity = RankActivity()
    channel = ActivityChannel(activity)
    try:
        for name, value in {
            **channel.env(),
            "LOCAL_RANK": "3",
            RESTART_COUNT_ENV: "0",
        }.items():
            monkeypatch.setenv(name, value)
        received: list[bytes] = []
        handle = activity.handle
        monkeypatch.setattr(activity, "handle", lambda d: (received.append(d), handle(d)))
        started_s = time.monotonic()
        for step in range(1, 100_001):
            worker.progress(step, 100_000)
        elapsed_s = time.monotonic() - started_s
        wait_until(
            lambda: (
                activity.snapshot().get(3, None) is not None
                and activity.snapshot()[3].step == 100_000
            ),
            what="rank 3's last step (100000) at the agent",
            detail=lambda: activity.snapshot(),
        )
        assert activity.snapshot()[3].total == 100_000
        # a tight loop sends few datagrams: one per interval (the last one always), however
        # long the loop took (what a call costs is measured in bench/)
        assert len(received) <= 2 + elapsed_s / worker.PROGRESS_INTERVAL_S
        assert activity.last_seen_s(3) is not None
        assert activity.last_seen_s(2) is None
    finally:
        channel.close()


@pytest.mark.parametrize("abstract", [True, False], ids=["abstract-namespace", "file"])
def test_heartbeat_counts_as_seen(
    fresh_sender: None, monkeypatch: pytest.MonkeyPatch, abstract: bool
) -> None:
    activity = RankActivity()
    channel = ActivityChannel(activity, abstract=abstract)
    assert channel.path.startswith("@torchx-elastic-") == abstract
    try:
        monkeypatch.setenv(contract.CHANNEL_ENV, channel.path)
        monkeypatch.setenv("LOCAL_RANK", "1")
        monkeypatch.setenv(RESTART_COUNT_ENV, "0")
        worker.heartbeat()
        wait_until(lambda: activity.last_seen_s(1) is not None, what="rank 1's heartbeat")
        assert activity.snapshot()[1].step is None
    finally:
        channel.close()
    assert abstract or not os.path.exists(os.path.dirname(channel.path))  # nothing left behind


SHORT_SCRIPT = """
import sys
from torchx_elastic.worker import progress
sys.stdin.read()  # the test's go
progress(1, 1)
"""


@pytest.mark.parametrize("expected", [True, False], ids=["a-worker", "another-process"])
def test_a_worker_read_after_it_ended_is_heard_and_another_process_is_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, expected: bool
) -> None:
    """A short script sends its last step and exits; the agent reads it only once the process
    is gone (a busy machine): its ancestry can no longer be read, so what counts is that the
    agent started it."""
    reaped = threading.Event()
    descends_from = channel_module._descends_from
    monkeypatch.setattr(  # the channel's check of a sender runs once the sender is reaped
        channel_module,
        "_descends_from",
        lambda pid, agent: reaped.wait(30) and descends_from(pid, agent),
    )
    activity = RankActivity()
    channel = ActivityChannel(activity, abstract=True)
    try:
        env = {**os.environ, **channel.env(), "LOCAL_RANK": "0", RESTART_COUNT_ENV: "0"}
        script = subprocess.Popen(
            [sys.executable, "-c", SHORT_SCRIPT], env=env, stdin=subprocess.PIPE
        )
        if expected:
            channel.expect([script.pid])
        script.communicate(b"", timeout=60)
        reaped.set()
        if expected:
            wait_until(
                lambda: 0 in activity.snapshot() and activity.snapshot()[0].step == 1,
                what="the ended worker's last step at the agent",
            )
            assert "refused" not in caplog.text
        else:
            wait_until(lambda: "refused" in caplog.text, what="the refusal")
            assert activity.snapshot() == {}
            assert channel_module.REFUSED_SENDER % (script.pid, os.getuid()) in caplog.text
    finally:
        channel.close()


def test_activity_ignores_old_attempts_and_malformed_datagrams() -> None:
    now = [0.0]
    activity = RankActivity(clock=lambda: now[0])
    activity.new_attempt(1)
    activity.handle(b"p 5 10 0 0")  # from attempt 0
    activity.handle(b"garbage")
    activity.handle(b"p x 10 0 1")
    activity.handle(b"h 0")
    assert activity.snapshot() == {}
    now[0] = 2.0
    activity.handle(b"p 5 -1 0 1")
    now[0] = 4.0
    activity.handle(b"p 9 -1 0 1")
    assert activity.snapshot() == {0: RankProgress(0, 9, None, 4.0, 2.0, 4.0)}
    activity.handle(b"p 1 -1 0 1")  # went back (new epoch): the rate starts again
    assert activity.snapshot()[0].rate_per_s is None


def test_a_later_attempts_first_message_starts_that_attempt() -> None:
    activity = RankActivity()
    activity.handle(b"p 50 100 0 0")
    activity.handle(b"p 60 100 1 0")
    activity.handle(b"h 1 1")  # attempt 1 (after a restart) begins: attempt 0 is forgotten
    assert set(activity.snapshot()) == {1} and activity.snapshot()[1].step is None
    activity.handle(b"p 70 100 0 0")  # a late datagram of attempt 0
    assert activity.last_seen_s(0) is None


def test_summary_names_slowest_and_fastest_global_ranks() -> None:
    snapshot = {
        0: RankProgress(0, 40, 100, 1.0, 10.0),
        1: RankProgress(1, 20, 100, 1.0, 4.0),
        2: RankProgress(2, None, None, 1.0, None),
        3: RankProgress(3, 60, 100, 1.0, 12.0),
    }
    progress = summarize(snapshot, {0: 8, 1: 9, 2: 10, 3: 11})
    assert progress is not None
    assert (progress.slowest_rank, progress.slowest_step) == (9, 20)
    assert (progress.fastest_rank, progress.fastest_step) == (11, 60)
    assert progress.ranks_reporting == 3
    assert progress.eta_s == 20.0
    assert status_line(progress, node=2) == (
        "[n2 progress] 20/100 (20.0%) of 3 ranks, slowest r9 20, fastest r11 60, 4 steps/s, ETA 20s"
    )
    assert summarize({2: snapshot[2]}, {}) is None


def test_status_line_without_a_total() -> None:
    progress = summarize({0: RankProgress(0, 7, None, 1.0, None)}, {0: 0})
    assert progress is not None
    assert status_line(progress, node=0) == (
        "[n0 progress] 7/? of 1 ranks, slowest r0 7, fastest r0 7"
    )


@pytest.mark.parametrize(("seconds", "text"), [(4.4, "4s"), (185, "3m05s"), (7620, "2h07m")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
