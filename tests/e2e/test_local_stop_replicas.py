"""local_cwd's stop of a job's replicas (``local_stop.py``) with real process groups: what
exits in time is not killed, what is left after the bound is, a second signal kills at once
(the grace, the bound and the followers in this process: tests/unit/test_local_stop_units.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Iterator

import pytest
from torchx.schedulers.local_scheduler import SignalException

from torchx_elastic.schedulers.local_stop import STOPPED_AT_ONCE, stop_replicas, stopping_line

pytestmark = pytest.mark.slow

# a replica that takes SIGTERM as a worker saving a checkpoint would: it goes on a while
DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None);"
    " print(flush=True); time.sleep(600)"
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
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    stop_replicas([proc], grace_s=60.0, margin_s=60.0)  # a bound it never comes near
    assert proc.wait() == -signal.SIGTERM
    assert capsys.readouterr().err == stopping_line(60.0, 120.0) + "\n"


def test_what_is_left_after_the_bound_is_killed(
    deaf_replica: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    stop_replicas([deaf_replica], grace_s=0.5, margin_s=0.5)
    assert deaf_replica.wait(60) == -signal.SIGKILL
    assert capsys.readouterr().err.splitlines() == [
        stopping_line(0.5, 1.0),
        "torchx-elastic: the job's processes were still running 1s after the stop: killed",
    ]


def test_a_second_signal_kills_at_once(
    deaf_replica: subprocess.Popen[bytes],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchx's handler raises ``SignalException`` for the second SIGINT/SIGTERM as well.
    It comes while the stop waits for the replica (the signal is sent from that wait)."""

    def second_signal(signum: int, frame: object) -> None:
        raise SignalException("again", signal.SIGINT)

    wait = deaf_replica.wait

    def wait_then_signalled(timeout: float | None = None) -> int:
        if timeout is not None:  # the stop's wait, before its bound
            signal.setitimer(signal.ITIMER_REAL, 0.2)
        return wait(timeout)

    previous = signal.signal(signal.SIGALRM, second_signal)
    try:
        monkeypatch.setattr(deaf_replica, "wait", wait_then_signalled)
        stop_replicas([deaf_replica], grace_s=120.0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        monkeypatch.setattr(deaf_replica, "wait", wait)
        assert deaf_replica.wait(60) == -signal.SIGKILL  # killed, not after the bound (150 s)
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
