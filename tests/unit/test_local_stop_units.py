"""local_cwd's stop of a job (``local_stop.py``): the workers' grace as the agent reads it,
the bound, and each of its lines, with real process groups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest
from torchx.schedulers.local_scheduler import SignalException

from torchx_elastic.schedulers.local_stop import (
    AGENTS_MARGIN_S,
    DEFAULT_GRACE_S,
    STOPPED_AT_ONCE,
    Followers,
    stop_bound_s,
    stop_replicas,
    stopping_line,
    workers_grace_s,
)

# a replica that takes SIGTERM as a worker saving a checkpoint would: it goes on a while
DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None);"
    " print(flush=True); time.sleep(60)"
)


@pytest.mark.parametrize(
    ("args", "env", "grace_s"),
    [
        ([], {}, DEFAULT_GRACE_S),
        (["--term-timeout-s", "45", "main.py"], {}, 45.0),
        (["--term-timeout-s=5"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 5.0),
        (["main.py"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 90.0),
        (["--term-timeout-s", "soon"], {}, DEFAULT_GRACE_S),
    ],
)
def test_the_workers_grace_is_the_agents(
    args: list[str], env: dict[str, str], grace_s: float
) -> None:
    assert workers_grace_s(args, env) == grace_s


def test_the_bound_is_the_grace_and_the_agents_margin() -> None:
    assert AGENTS_MARGIN_S == 30.0
    assert stop_bound_s(30.0) == 60.0
    assert stopping_line(30.0, 60.0) == (
        "torchx-elastic: stopping the job: its workers get SIGTERM and 30s to finish, its"
        " agents up to 60s in all; Ctrl-C again stops it at once"
    )


@pytest.fixture
def deaf_replica() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAF], start_new_session=True, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # its SIGTERM handler is in place
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_replica_that_exits_in_time_is_not_killed(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stop_replicas([proc], grace_s=5.0, margin_s=5.0)
    assert proc.wait() == -signal.SIGTERM
    assert capsys.readouterr().err == stopping_line(5.0, 10.0) + "\n"


def test_what_is_left_after_the_bound_is_killed(
    deaf_replica: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    stop_replicas([deaf_replica], grace_s=0.5, margin_s=0.5)
    assert deaf_replica.wait(10) == -signal.SIGKILL
    assert capsys.readouterr().err.splitlines() == [
        stopping_line(0.5, 1.0),
        "torchx-elastic: the job's processes were still running 1s after the stop: killed",
    ]


def test_a_second_signal_kills_at_once(
    deaf_replica: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """torchx's handler raises ``SignalException`` for the second SIGINT/SIGTERM as well."""

    def second_signal(signum: int, frame: object) -> None:
        raise SignalException("again", signal.SIGINT)

    previous = signal.signal(signal.SIGALRM, second_signal)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        started = time.monotonic()
        stop_replicas([deaf_replica], grace_s=120.0)
        assert deaf_replica.wait(10) == -signal.SIGKILL
        assert time.monotonic() - started < 30
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert capsys.readouterr().err.splitlines() == [
        stopping_line(120.0, 150.0),
        "torchx-elastic: stopped again: the job's processes are killed now",
    ]
    assert STOPPED_AT_ONCE == "torchx-elastic: stopped again: the job's processes are killed now"


def test_nothing_running_nothing_said(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    stop_replicas([proc], grace_s=30.0)
    assert capsys.readouterr().err == ""


def test_followers_are_waited_for_until_they_end() -> None:
    followers = Followers()
    lines = followers.follow(iter(["a\n", "b\n"]))
    assert next(lines) == "a\n"
    started = time.monotonic()
    followers.wait_done(timeout_s=0.2)  # one still reads
    assert time.monotonic() - started >= 0.2
    assert list(lines) == ["b\n"]
    started = time.monotonic()
    followers.wait_done(timeout_s=10)
    assert time.monotonic() - started < 5
