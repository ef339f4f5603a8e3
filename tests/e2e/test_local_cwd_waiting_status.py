"""``torchx status`` of a local_cwd job whose node waits for another (issue 31)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from torchx.runner import get_runner
from torchx.specs import AppState

from tests.e2e.agents import free_port
from tests.waiting import wait_until
from torchx_elastic.components.dist import ddp
from torchx_elastic.contract import WAITING_FOR_NODES

pytestmark = pytest.mark.slow


def test_status_says_how_many_nodes_joined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("print('trained')\n")
    # the node waits (join_timeout) longer than the test ever waits for its waiting line
    app = ddp(script="ok.py", j="2x1", cpu=1, rdzv_port=free_port(), rdzv_conf="join_timeout=600")
    # one replica of a 2-node job: it waits for a node that never comes
    app.roles[0] = dataclasses.replace(app.roles[0], num_replicas=1)
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        try:

            def waiting_message() -> str | None:
                status = runner.status(handle)
                assert status is not None and status.state in (AppState.RUNNING, AppState.PENDING)
                return status.msg if WAITING_FOR_NODES in status.msg else None

            msg = wait_until(waiting_message, what="the waiting state in torchx status")
            assert msg.startswith("waiting for nodes: 1 of 2 joined; here: "), msg
            assert "; missing: 1 node; hosting the rendezvous at 127.0.0.1:" in msg
        finally:
            runner.cancel(handle)
