"""local_cwd's status of an app of several roles (ft.ddp's shape): each role's state, what
each replica group does (the first role's last logged quorum) and the job's progress across
the groups (each group's rank-0 agent's progress file)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from torchx.runner import Runner
from torchx.specs import AppDef, AppState, Role

from tests.waiting import wait_until
from torchx_elastic.contract.job_progress import JobSummary, write_file
from torchx_elastic.contract.log_layout import LocalAppLogs
from torchx_elastic.ft.lighthouse import Quorum
from torchx_elastic.schedulers.local_cwd import create_scheduler

pytestmark = pytest.mark.slow

RUN = "import time; time.sleep(3600)"  # the roles run until the test cancels them


def _role(name: str, code: str) -> Role:
    return Role(name, image=".", entrypoint=sys.executable, args=["-c", code])


def test_status_of_an_app_of_several_roles_shows_its_groups(tmp_path: Path) -> None:
    quorum = Quorum(4, 9, ("ft_ddp_0",)).line(2)
    app = AppDef(
        "ft",
        roles=[
            _role(
                "lighthouse",
                f"import sys, time; print('[torchx-elastic ft] {quorum}', file=sys.stderr,"
                f" flush=True); {RUN}",
            ),
            _role("group0", RUN),
            _role("group1", RUN),
        ],
    )
    with Runner("test", {"local_cwd": create_scheduler}) as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path)})
        try:
            app_dir = next(p for p in tmp_path.glob("*/*") if p.is_dir())
            progress_dir = LocalAppLogs(str(app_dir)).agents("group0").root
            os.makedirs(progress_dir)
            summary = JobSummary(
                step=12, total=40, slowest_rank=1, slowest_node=0, fastest_rank=0,
                fastest_node=0, fastest_step=12, rate_per_s=2.5, eta_s=11.0,
                ranks_reporting=2, ranks=2, nodes_reporting=1, nodes=1, time_s=time.time(),
            )  # fmt: skip
            write_file(progress_dir, summary)

            def with_the_quorum() -> Any:
                status = runner.status(handle)
                assert status is not None
                return status if "last quorum" in status.msg else None

            status = wait_until(with_the_quorum, what="the Lighthouse role's quorum in status")
        finally:
            runner.cancel(handle)
    assert status.state == AppState.RUNNING
    ages = re.sub(r"as of \d+s ago", "as of Ns ago", status.msg)  # the status call waits
    assert ages.splitlines() == [
        "lighthouse: RUNNING",
        "group0: RUNNING; training (in quorum 4), progress 12/40 (30.0%) of 2/2 ranks,"
        " 2.5 steps/s, ETA 11s (as of Ns ago, its rank-0 agent)",
        "group1: RUNNING; recovering (not in quorum 4)",
        "last quorum 4 at step 9: 1 of 2 replica groups (ft_ddp_0)",
        "job progress 12/40 (30.0%), group0 the furthest of 2 groups: 2/2 ranks reporting,"
        " 2.5 steps/s, ETA 11s (as of Ns ago); 1 of 2 groups in quorum 4",
    ], status.msg
