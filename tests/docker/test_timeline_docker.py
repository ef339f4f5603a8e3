"""A docker job's timeline: the agents' files copied out of its containers (fake engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from docker_fake_engine import FakeClient, FakeEngine

from tests.timeline_jobs import TRACEBACK, generated_job
from torchx_elastic.components.dist import ddp
from torchx_elastic.contract import EVENTS_FILE, RANK_ERROR_FILE, STDERR_FILE, STDOUT_FILE
from torchx_elastic.contract.error_file import error_data
from torchx_elastic.schedulers.docker import DockerScheduler
from torchx_elastic.timeline import cli
from torchx_elastic.timeline.docker_source import timeline_of_docker_job
from torchx_elastic.timeline.log_dir import SourceError


def _agent_files(node: int) -> dict[str, bytes]:
    """What node ``node``'s agent left in its container (its own records only)."""
    records = [r for r in generated_job(2, 2, progress_samples=3) if r["node"] == node]
    base = f"/tmp/torchx_elastic_{node}abc"
    files = {
        f"{base}/{EVENTS_FILE}": "".join(json.dumps(r) + "\n" for r in records).encode(),
        f"{base}/attempt_0/rank_{2 * node}/{STDOUT_FILE}": b"not copied\n",
        f"/tmp/unrelated/{EVENTS_FILE}": b"not an agent's\n",
    }
    if node == 0:
        error = error_data("ValueError: bad batch on rank 1", TRACEBACK, 1_800_000_009)
        files[f"{base}/attempt_0/rank_1/{RANK_ERROR_FILE}"] = json.dumps(error).encode()
        files[f"{base}/attempt_0/rank_1/{STDERR_FILE}"] = b"x" * 100_000 + TRACEBACK.encode()
    return files


def test_the_timeline_of_a_docker_job_comes_out_of_its_stopped_containers(
    scheduler: DockerScheduler, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ddp(script="examples/main.py", j="2x2")
    app_id = scheduler.submit(app, {})  # type: ignore[arg-type]
    for node in (0, 1):
        container = engine.containers[f"{app_id}-main-{node}"]
        container.files = _agent_files(node)
        container.finish(0)
    timeline = timeline_of_docker_job(app_id, client=FakeClient(engine))
    assert [(lane.node, lane.local_ranks) for lane in timeline.nodes] == [(0, 2), (1, 2)]
    (restart,) = timeline.job_marks
    assert restart.label.startswith("restart 1 after rank 1 (node 0) failed first: exit code 1")
    assert timeline.source.startswith(f"the 2 containers of {app_id} (files copied to ")
    copied = timeline.source.split("files copied to ")[1].rstrip(")")
    stderr = Path(copied, "attempt_0", "rank_1", STDERR_FILE).read_bytes()
    assert len(stderr) == 64 * 1024 and stderr.endswith(TRACEBACK.encode())

    monkeypatch.setattr(
        "torchx_elastic.schedulers.docker.scheduler.connect", lambda: FakeClient(engine)
    )
    monkeypatch.chdir(copied)
    assert cli.main(["timeline", f"docker://test/{app_id}"]) == 0
    assert Path(copied, f"{app_id}.timeline.html").is_file()


def test_removed_containers_leave_nothing_to_draw(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = scheduler.submit(ddp(script="main.py", j="1x1"), {})  # type: ignore[arg-type]
    with pytest.raises(SourceError) as raised:
        timeline_of_docker_job(app_id, client=FakeClient(engine))
    assert str(raised.value) == (
        f"the containers of {app_id} hold no agent event log under /tmp/torchx_elastic_*"
        " (was the job started by an older agent, or with another --log-dir?)"
    )
    with pytest.raises(SourceError) as raised:
        timeline_of_docker_job("gone-123", client=FakeClient(engine))
    assert str(raised.value) == (
        "no containers of gone-123 on this Docker engine: the agents' files lived in them,"
        " and nothing of the job is left to draw once they are removed"
    )
