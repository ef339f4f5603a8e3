"""A Kubernetes job's timeline from what the API server still serves (fake cluster)."""

from __future__ import annotations

import json

import pytest

from tests.kubernetes.conftest import SUFFIX
from tests.kubernetes.fake_api import FakeCluster
from torchx_elastic.components.dist import ddp
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler
from torchx_elastic.timeline import html
from torchx_elastic.timeline.kubernetes_source import MISSING, timeline_of_kubernetes_job
from torchx_elastic.timeline.log_dir import SourceError
from torchx_elastic.timeline.source import load

JOB = f"main-{SUFFIX}"
APP_ID = f"default:{JOB}"


def test_pods_exit_codes_root_cause_restarts_and_progress(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    scheduler.submit(ddp(script="main.py", j="2x1", max_retries=1), {})  # type: ignore[arg-type]
    first, other = fake.pod(JOB, 0), fake.pod(JOB, 1)
    for pod in (first, other):
        fake.set_phase(pod, "Running")
    fake.write_log(
        first,
        b"[job progress] 10/40 (25.0%) of 2/2 ranks on 2/2 nodes, slowest r1"
        b" (n1) 10, fastest r0 (n0) 12, 2 steps/s\n",
        age_s=3,
    )
    reply = {
        "message": {
            "message": "rank 0 (node 0) failed first: ValueError: bad batch",
            "extraInfo": {"py_callstack": "Traceback ...\nValueError: bad batch", "timestamp": "1"},
        }
    }
    fake.set_phase(first, "Failed", exit_code=1, message=json.dumps(reply))
    replaced = fake.pod(JOB, 0)
    assert replaced["metadata"]["name"] != first["metadata"]["name"]
    fake.set_phase(replaced, "Running")
    fake.write_log(
        replaced,
        b"[job progress] 40/40 (100.0%) of 2/2 ranks on 2/2 nodes,"
        b" slowest r1 (n1) 40, fastest r0 (n0) 40, 5 steps/s, ETA 0s\n",
    )

    timeline = load(f"kubernetes://test/{APP_ID}")
    assert timeline.notes == [MISSING]
    assert [(lane.node, lane.host) for lane in timeline.nodes] == [
        (0, replaced["metadata"]["name"]),
        (1, other["metadata"]["name"]),
    ]
    spans = timeline.nodes[0].spans
    assert [(s.attempt, s.end) for s in spans] == [(0, "failed"), (1, "running")]
    failure = next(m for m in timeline.nodes[0].marks if m.kind == "failure")
    assert failure.label == f"pod {first['metadata']['name']}: exit code 1"
    assert failure.detail == (
        "rank 0 (node 0) failed first: ValueError: bad batch\nTraceback ...\nValueError: bad batch"
    )
    (restart,) = timeline.job_marks
    assert restart.label == f"restart: pod {replaced['metadata']['name']} replaced replica 0"
    assert [(p.step, p.total) for p in timeline.progress] == [(40, 40)]
    assert timeline.state == "RUNNING"
    assert MISSING in html.render(timeline)


def test_deleted_pods_leave_nothing_to_draw(fake: FakeCluster) -> None:
    with pytest.raises(SourceError) as raised:
        timeline_of_kubernetes_job("default:gone-bcdfghjk")
    assert str(raised.value) == (
        "no pods of default:gone-bcdfghjk in the cluster any more: the agents' files lived in"
        " them, so nothing of the job is left to draw (keep finished pods longer, or give the"
        " agents a --log-dir on a persistent volume and draw that directory)"
    )
