"""``torchx run``'s wait for a local_cwd job returns at the job's end, not after its poll's
sleep; other status calls still answer within ``STATUS_WAIT_S``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from torchx.runner import Runner
from torchx.specs import AppDef, AppState, Role

from torchx_elastic.schedulers.local_cwd import STATUS_WAIT_S, create_scheduler

POLL_S = 30.0  # the wait's sleep between status calls: a wait that sleeps once is slow


def sleeper(seconds: float) -> AppDef:
    role = Role(
        "sleeper",
        image=".",
        entrypoint=sys.executable,
        args=["-c", f"import time; time.sleep({seconds})"],
    )
    return AppDef("sleeper", roles=[role])


def test_runner_wait_returns_when_the_job_ends(tmp_path: Path) -> None:
    with Runner("test", {"local_cwd": create_scheduler}) as runner:
        handle = runner.run(sleeper(2.0), "local_cwd", cfg={"log_dir": str(tmp_path)})
        started = time.monotonic()
        status = runner.wait(handle, wait_interval=POLL_S)
        elapsed = time.monotonic() - started
    assert status is not None and status.state == AppState.SUCCEEDED
    assert elapsed < POLL_S / 2  # not after the first status (STATUS_WAIT_S) and one sleep


def test_a_status_call_answers_while_the_job_runs(tmp_path: Path) -> None:
    with Runner("test", {"local_cwd": create_scheduler}) as runner:
        handle = runner.run(sleeper(POLL_S), "local_cwd", cfg={"log_dir": str(tmp_path)})
        try:
            started = time.monotonic()
            status = runner.status(handle)
            elapsed = time.monotonic() - started
        finally:
            runner.cancel(handle)
    assert status is not None and status.state == AppState.RUNNING
    assert STATUS_WAIT_S <= elapsed < POLL_S / 2
