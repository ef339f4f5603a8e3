"""``torchx run``'s wait for a local_cwd job returns at the job's end, not after its poll's
sleep; other status calls still answer while the job runs, after ``STATUS_WAIT_S``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from torchx.runner import Runner
from torchx.specs import AppDef, AppState, Role

from torchx_elastic.schedulers.local_cwd import STATUS_WAIT_S, create_scheduler

pytestmark = pytest.mark.slow

POLL_S = 30.0  # the wait's sleep between status calls: a wait that sleeps asks twice
FOREVER_S = 3600.0  # a job that only its cancel ends


def sleeper(seconds: float) -> AppDef:
    role = Role(
        "sleeper",
        image=".",
        entrypoint=sys.executable,
        args=["-c", f"import time; time.sleep({seconds})"],
    )
    return AppDef("sleeper", roles=[role])


def counting_scheduler(asked: list[str]) -> Any:
    """local_cwd's factory whose schedulers note each status asked of them."""

    def create(session_name: str, **kwargs: Any) -> Any:
        scheduler = create_scheduler(session_name, **kwargs)
        describe = scheduler.describe

        def counted(app_id: str) -> Any:
            asked.append(app_id)
            return describe(app_id)

        scheduler.describe = counted
        return scheduler

    return create


def test_runner_wait_returns_when_the_job_ends(tmp_path: Path) -> None:
    asked: list[str] = []
    with Runner("test", {"local_cwd": counting_scheduler(asked)}) as runner:
        handle = runner.run(sleeper(2.0), "local_cwd", cfg={"log_dir": str(tmp_path)})
        asked.clear()
        status = runner.wait(handle, wait_interval=POLL_S)
    assert status is not None and status.state == AppState.SUCCEEDED
    assert len(asked) == 1  # its first status waited for the end: no sleep, no second ask


def test_a_status_call_answers_while_the_job_runs(tmp_path: Path) -> None:
    with Runner("test", {"local_cwd": create_scheduler}) as runner:
        handle = runner.run(sleeper(FOREVER_S), "local_cwd", cfg={"log_dir": str(tmp_path)})
        try:
            started = time.monotonic()
            status = runner.status(handle)  # not at the job's end: it never ends by itself
            elapsed = time.monotonic() - started
        finally:
            runner.cancel(handle)
    assert status is not None and status.state == AppState.RUNNING
    assert elapsed >= STATUS_WAIT_S  # it waited for the job's end that long first
