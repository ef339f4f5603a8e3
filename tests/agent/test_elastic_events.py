"""``--event-log-handler``: the agent's end reaches the named torch.distributed.elastic
handler, as torchrun's does; a name torch does not know is refused before the job starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_agent
from torchx_elastic.agent.config.launch import UsageError
from torchx_elastic.agent.supervision.elastic_events import check_handler


def test_an_unknown_handler_is_refused_with_what_torch_has() -> None:
    assert check_handler("console") == "console"
    with pytest.raises(UsageError) as caught:
        check_handler("kafka")
    assert str(caught.value) == (
        "--event-log-handler 'kafka' is not a handler registered in"
        " torch.distributed.elastic.events.handlers (e.g. null, console)"
    )


def test_the_console_handler_gets_the_agents_end_as_torchrun_sends_it(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('done')\n")
    result = run_agent(
        "--standalone", "--event-log-handler", "console", "--role", "trainer", "ok.py", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "torchelastic.worker.status" in line]
    assert len(lines) == 1, result.stderr[-3000:]
    event = json.loads(lines[0][lines[0].index("{") :])
    assert event["name"] == "torchelastic.worker.status.SUCCEEDED"
    assert event["source"] == "AGENT"
    metadata = event["metadata"]
    assert (metadata["state"], metadata["role"], metadata["group_rank"]) == (
        "SUCCEEDED",
        "trainer",
        0,
    )
    assert json.loads(metadata["metadata"])["group_world_size"] == 1
