"""The scheduler against the fake cluster: submit, status transitions, logs, cancel, list,
and each error a user can meet, read as the user reads it."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from torchx.schedulers.api import Stream
from torchx.specs import AppState, ReplicaState

from tests.kubernetes.conftest import SUFFIX
from tests.kubernetes.fake_api import FakeCluster
from torchx_elastic.components.dist import ddp
from torchx_elastic.contract import ERROR_FILE_ENV, SECRET_ENV
from torchx_elastic.schedulers.kubernetes import create_scheduler, job_access
from torchx_elastic.schedulers.kubernetes.client import KubernetesError
from torchx_elastic.schedulers.kubernetes.logs import since_seconds
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler
from torchx_elastic.schedulers.kubernetes.status import (
    attempts_restarted,
    pod_problems,
    termination_summary,
)
from torchx_elastic.schedulers.log_lines import whole_lines

JOB = f"main-{SUFFIX}"
APP_ID = f"default:{JOB}"


def _submit(scheduler: KubernetesScheduler, j: str = "2:4x8", **cfg: Any) -> str:
    app = ddp(script="main.py", j=j, h="gpu.small", **cfg.pop("app", {}))
    return str(scheduler.submit(app, cfg))


def _states(scheduler: KubernetesScheduler, app_id: str = APP_ID) -> List[ReplicaState]:
    desc = scheduler.describe(app_id)
    assert desc is not None
    return [r.state for r in desc.roles_statuses[0].replicas]


def test_submit_creates_an_indexed_job_and_its_service(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    assert _submit(scheduler) == APP_ID
    job = fake.objects["jobs"][("default", JOB)]
    service = fake.objects["services"][("default", JOB)]
    # the Service is owned by the Job: it goes when the Job goes, however it is deleted
    assert service["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": job["metadata"]["uid"]}
    ]
    pods = fake.pods(JOB)
    assert [p["spec"]["hostname"] for p in pods] == [f"{JOB}-{i}" for i in range(4)]
    assert {p["spec"]["subdomain"] for p in pods} == {JOB}


def test_each_job_gets_a_fresh_secret_and_a_network_policy_owned_by_the_job(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler)
    job = fake.objects["jobs"][("default", JOB)]
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": job["metadata"]["uid"]}]
    secret = fake.objects["secrets"][("default", JOB)]
    policy = fake.objects["networkpolicies"][("default", JOB)]
    assert secret["metadata"]["ownerReferences"] == policy["metadata"]["ownerReferences"] == owner
    value = secret["stringData"]["rdzv-secret"]
    assert len(value) == 64 and value != job_access.SECRET_PLACEHOLDER
    # every pod reads it from the Secret: the value is not in the Job's manifest
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[SECRET_ENV]["valueFrom"]["secretKeyRef"] == {
        "name": JOB,
        "key": "rdzv-secret",
    }
    assert value not in json.dumps(job)
    # ingress to the job's pods from the job's pods only
    pods = {"matchLabels": {"app.kubernetes.io/instance": JOB}}
    assert pods["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"] == {
        "podSelector": pods,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": pods}]}],
    }
    scheduler.cancel(APP_ID)
    fake.objects["jobs"].clear()
    _submit(scheduler, network_policy=False)
    assert ("default", JOB) not in fake.objects["networkpolicies"]
    assert fake.objects["secrets"][("default", JOB)]["stringData"]["rdzv-secret"] != value


def test_status_follows_the_pods(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    _submit(scheduler, j="2x1")
    desc = scheduler.describe(APP_ID)
    assert desc is not None
    assert (desc.state, desc.msg) == (AppState.PENDING, "")
    assert [r.name for r in desc.roles] == ["main"] and desc.roles[0].num_replicas == 2

    fake.set_phase(fake.pod(JOB, 0), "Running")
    assert _states(scheduler) == [ReplicaState.RUNNING, ReplicaState.PENDING]
    assert scheduler.describe(APP_ID).state == AppState.RUNNING  # type: ignore[union-attr]

    fake.set_phase(fake.pod(JOB, 1), "Running")
    for index in (0, 1):
        fake.set_phase(fake.pod(JOB, index), "Succeeded")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert _states(scheduler) == [ReplicaState.SUCCEEDED] * 2


def test_an_elastic_job_succeeds_with_fewer_nodes_and_its_late_pods_go(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """1:3 nodes, two took part (pod 1 found no room): index 0's success ends the Job."""
    _submit(scheduler, j="1:3x1")
    for index in (0, 2):
        fake.set_phase(fake.pod(JOB, index), "Running")
    fake.set_phase(fake.pod(JOB, 2), "Succeeded")
    assert scheduler.describe(APP_ID).state == AppState.RUNNING  # type: ignore[union-attr]
    fake.set_phase(fake.pod(JOB, 0), "Succeeded")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert sorted(fake.index_of(p) for p in fake.pods(JOB)) == [0, 2]  # pod 1 never ran
    assert _states(scheduler) == [ReplicaState.SUCCEEDED, ReplicaState.UNKNOWN] + [
        ReplicaState.SUCCEEDED
    ]
    assert "main[1]: no pod: it was deleted" in desc.msg


def test_a_failed_elastic_job_still_fails(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="1:2x1")
    for index in (0, 1):
        fake.set_phase(fake.pod(JOB, index), "Running")
    for index in (1, 0):
        fake.set_phase(fake.pod(JOB, index), "Failed", exit_code=1)
    assert scheduler.describe(APP_ID).state == AppState.FAILED  # type: ignore[union-attr]


def test_image_pull_failure_shows_on_the_first_status_call(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler)
    pod = fake.pod(JOB, 0)
    fake.wait_image(pod)
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.PENDING
    assert desc.msg == (
        f"main[0] pod {pod['metadata']['name']}: ImagePullBackOff:"
        ' Back-off pulling image "torchx-elastic:latest"'
    )


def test_unschedulable_and_oom_killed_pods_say_so(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="2x1", app={"max_retries": 1})
    fake.unschedulable(fake.pod(JOB, 1), "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    first = fake.pod(JOB, 0)
    fake.set_phase(first, "Running")
    fake.set_phase(first, "Failed", exit_code=137, reason="OOMKilled")
    desc = scheduler.describe(APP_ID)
    assert desc is not None
    # one retry left: the Job replaced pod 0 (same index), so the replica is pending again
    assert desc.state == AppState.PENDING and desc.num_restarts == 1
    assert fake.pod(JOB, 0)["metadata"]["name"] != first["metadata"]["name"]
    assert desc.msg == (
        f"main[1] pod {fake.pod(JOB, 1)['metadata']['name']}: Unschedulable:"
        " 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    fake.set_phase(fake.pod(JOB, 0), "Failed", exit_code=137, reason="OOMKilled")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.PENDING
    # replica 0 is out of retries; the Job ends when replica 1 is done too
    for _ in range(2):
        fake.set_phase(fake.pod(JOB, 1), "Failed", exit_code=1)
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.FAILED and desc.num_restarts == 1
    lines = desc.msg.splitlines()
    assert lines[0] == "FailedIndexes: Job has failed indexes"
    assert (
        f"main[0] pod {fake.pod(JOB, 0)['metadata']['name']}: OOMKilled (container main,"
        in (lines[1])
    )
    assert lines[1].endswith("exit code 137)")


def test_one_failure_of_every_node_is_one_retry(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """A rank that fails for good fails every node: that is one attempt, not one per pod."""
    _submit(scheduler, j="3x1", app={"max_retries": 1})
    for attempt in range(2):
        for index in range(3):
            fake.set_phase(fake.pod(JOB, index), "Running")
        for index in range(3):
            fake.set_phase(fake.pod(JOB, index), "Failed", exit_code=1)
        desc = scheduler.describe(APP_ID)
        assert desc is not None and desc.num_restarts == 1
        assert desc.state == (AppState.PENDING if attempt == 0 else AppState.FAILED)
    assert len(fake.pods(JOB)) == 6  # every failed pod is kept, with its log


def test_a_lost_pod_is_replaced_and_a_disruption_costs_no_retry(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="2x1", app={"max_retries": 1})
    for index in range(2):
        fake.set_phase(fake.pod(JOB, index), "Running")
    evicted = fake.pod(JOB, 1)
    fake.delete_pod(evicted, disruption=True)  # an eviction, preemption or drain
    replacement = fake.pod(JOB, 1)
    assert replacement["metadata"]["name"] != evicted["metadata"]["name"]
    assert replacement["spec"]["hostname"] == evicted["spec"]["hostname"]
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.num_restarts == 0 and desc.state == AppState.RUNNING
    fake.set_phase(replacement, "Running")
    fake.delete_pod(replacement)  # kubectl delete pod: its agent stopped (143), no retry used
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.num_restarts == 0 and desc.state == AppState.RUNNING
    assert len(fake.pods(JOB)) == 2  # replaced again
    fake.set_phase(fake.pod(JOB, 1), "Running")
    fake.set_phase(fake.pod(JOB, 1), "Failed", exit_code=1)  # the script's failure: counted
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.num_restarts == 1 and desc.state == AppState.RUNNING
    for index in range(2):
        fake.set_phase(fake.pod(JOB, index), "Running")
        fake.set_phase(fake.pod(JOB, index), "Succeeded")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.SUCCEEDED and desc.num_restarts == 1


def test_a_deleted_pod_uses_no_retry_at_the_default_max_retries(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """torchx's default --max_retries 0: a pod deleted by hand (no DisruptionTarget; its
    agent exits 143) is replaced, and the job goes on to succeed (a spare or the replacement
    takes its place)."""
    _submit(scheduler, j="2x1")
    for index in range(2):
        fake.set_phase(fake.pod(JOB, index), "Running")
    lost = fake.pod(JOB, 0)
    fake.delete_pod(lost)
    replacement = fake.pod(JOB, 0)
    assert replacement["metadata"]["name"] != lost["metadata"]["name"]
    for index in range(2):
        fake.set_phase(fake.pod(JOB, index), "Running")
        fake.set_phase(fake.pod(JOB, index), "Succeeded")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.SUCCEEDED


def test_the_root_cause_reaches_status_from_the_termination_message(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="2x1")
    root, victim = fake.pod(JOB, 0), fake.pod(JOB, 1)
    for pod in (root, victim):
        fake.set_phase(pod, "Running")
    reply = {
        "message": {
            "message": "rank 1 (node 0) failed first: CrashOnPurpose: rank 1 crashes on purpose",
            "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1"},
        }
    }
    fake.set_phase(root, "Failed", exit_code=1, message=json.dumps(reply))
    # a node stopped before it wrote a report: the tail of its log, from the report on
    report = ["=" * 72, "Root cause", "=" * 72, "  rank 2 failed first", "Logs of every rank: /x"]
    log_tail = "\n".join(["step 9", "", *report])
    fake.set_phase(victim, "Failed", exit_code=1, message=log_tail)
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.FAILED
    assert desc.msg.splitlines()[1:] == [
        f"main[0] pod {root['metadata']['name']}: Error (container main, exit code 1):"
        " rank 1 (node 0) failed first: CrashOnPurpose: rank 1 crashes on purpose",
        f"main[1] pod {victim['metadata']['name']}: Error (container main, exit code 1):"
        "   rank 2 failed first",
    ]


def test_every_pod_names_the_jobs_first_failure(
    scheduler: KubernetesScheduler,
    fake: FakeCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each node's agent writes its reply file (the pod's termination message) with the
    job's first failure agreed over the store, the node that only lost peers too."""
    from torchx_elastic.agent.console.failure.first_failure import FirstFailure
    from torchx_elastic.agent.console.failure.report import RankFailure, classify
    from torchx_elastic.agent.console.session import ConsoleSession

    first = FirstFailure(2, 1, "exit code 1", "ValueError: rank 2 gives up", 'File "/t.py", line 9')
    raiser = RankFailure(
        rank=2,
        local_rank=0,
        node=1,
        pid=9,
        exitcode=1,
        message="ValueError: rank 2 gives up",
        traceback="Traceback ...",
    )
    lost = RankFailure(
        rank=0,
        local_rank=0,
        node=0,
        pid=8,
        exitcode=1,
        message="RuntimeError: Connection closed by peer [10.0.0.2]:4000",
    )
    messages = {}
    for node, own in ((0, lost), (1, raiser)):
        reply = tmp_path / f"termination-log-{node}"
        monkeypatch.setenv(ERROR_FILE_ENV, str(reply))
        ConsoleSession._write_reply_file(classify([own]), first)
        messages[node] = reply.read_text()
    _submit(scheduler, j="2x1")
    pods = [fake.pod(JOB, 0), fake.pod(JOB, 1)]
    for pod in pods:
        fake.set_phase(pod, "Running")
    for node, pod in enumerate(pods):
        fake.set_phase(pod, "Failed", exit_code=1, message=messages[node])
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.FAILED
    assert desc.msg.splitlines()[1:] == [
        f"main[{node}] pod {pod['metadata']['name']}: Error (container main, exit code 1):"
        " rank 2 (node 1) failed first: ValueError: rank 2 gives up"
        for node, pod in enumerate(pods)
    ]


def test_restarts_are_the_most_replacements_of_one_replica_in_any_pod_order() -> None:
    def pod(index: int, failures: Optional[int]) -> Dict[str, Any]:
        annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
        if failures is not None:
            annotations["batch.kubernetes.io/job-index-failure-count"] = str(failures)
        labels = {"torchx.pytorch.org/role-name": "main"}
        return {"metadata": {"annotations": annotations, "labels": labels}}

    # newest first, as a list may come: one replacement of each node is one restart
    assert attempts_restarted([pod(0, 1), pod(0, 0), pod(1, 1), pod(1, 0)]) == 1
    # a server without the annotation: older pods of the replica still count
    assert attempts_restarted([pod(0, None), pod(0, None), pod(0, None), pod(1, None)]) == 2
    assert attempts_restarted([]) == 0


def test_termination_messages() -> None:
    cut = '{"message": {"message": "rank 0 (node 1) failed first: boom \\"x\\"", "extraInfo'
    assert termination_summary(cut) == 'rank 0 (node 1) failed first: boom "x"'
    assert termination_summary("a\nb\nc\nd\ne\nf\ng\n") == "b\nc\nd\ne\nf\ng"
    assert termination_summary("  ") == ""
    agent_error = "torchx-elastic: error: rendezvous at h:29500 failed: RendezvousClosedError"
    assert termination_summary(f"Traceback\n  gloo: closed\n{agent_error}\n") == agent_error


def test_a_replica_whose_pod_is_gone_says_so(
    scheduler: KubernetesScheduler, fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _submit(scheduler, j="2x1")
    for index in range(2):
        fake.set_phase(fake.pod(JOB, index), "Running")
    # the Job controller deletes the pods still running when a Job fails
    fake.set_phase(fake.pod(JOB, 0), "Failed", exit_code=1)
    fake.objects["jobs"][("default", JOB)]["status"]["conditions"] = [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    ]
    fake.delete_pod(fake.pod(JOB, 1))
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.FAILED
    assert _states(scheduler) == [ReplicaState.FAILED, ReplicaState.UNKNOWN]
    assert desc.msg.splitlines()[-1] == (
        "main[1]: no pod: it was deleted, with its log (the Job controller deletes the pods"
        " still running when a Job fails, and those that never joined when an elastic Job"
        " succeeds)"
    )
    assert list(scheduler.log_iter(APP_ID, "main", 1)) == [
        f"torchx-elastic: replica main/1 of {APP_ID} has no pod: it was deleted, with its log"
        " (the Job controller deletes the pods still running when a Job fails, and those that"
        " never joined when an elastic Job succeeds) (replicas with a pod: main/0)\n"
    ]


def test_a_suspended_job_waits_for_its_queue(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, queue="team-q")
    fake.objects["jobs"][("default", JOB)]["spec"]["suspend"] = True  # as Kueue's webhook does
    desc = scheduler.describe(APP_ID)
    assert desc is not None
    assert (desc.state, desc.msg) == (
        AppState.PENDING,
        "suspended, waiting for admission by Kueue queue team-q",
    )


QUOTA_REFUSAL = (
    f'pods "{JOB}-0-abcde" is forbidden: exceeded quota: team, requested: cpu=500m,'
    " used: cpu=0, limited: cpu=100m"
)


def test_pods_refused_by_admission_fail_the_job_with_the_reason_and_delete_it(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    fake.refuse_pods = QUOTA_REFUSAL
    _submit(scheduler, j="2x1")
    desc = scheduler.describe(APP_ID)
    assert desc is not None
    assert (desc.state, desc.msg) == (
        AppState.FAILED,
        f"the cluster refused to create the job's pods: {QUOTA_REFUSAL}\nThe Job was deleted"
        " (Kubernetes would retry in vain); change the request or the namespace's policy and"
        " run it again",
    )
    assert ("default", JOB) not in fake.objects["jobs"]
    assert not fake.objects["services"] and not fake.objects["secrets"]


def test_a_refused_job_that_status_may_not_delete_still_fails_with_the_reason(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    fake.refuse_pods = QUOTA_REFUSAL
    _submit(scheduler, j="2x1")
    fake.forbid("delete", "jobs")
    desc = scheduler.describe(APP_ID)
    assert desc is not None
    assert (desc.state, desc.msg) == (
        AppState.FAILED,
        f"the cluster refused to create the job's pods: {QUOTA_REFUSAL}\nThe Job could not be"
        " deleted (Kubernetes retries in vain): cancel it with torchx cancel or kubectl delete"
        " job; change the request or the namespace's policy and run it again",
    )
    assert ("default", JOB) in fake.objects["jobs"]


def test_a_transient_failed_create_or_one_of_another_job_is_no_refusal(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    fake.refuse_pods = 'Operation cannot be fulfilled on resourcequotas "team": conflict'
    _submit(scheduler, j="2x1")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and (desc.state, desc.msg) == (AppState.PENDING, "")
    event = next(iter(fake.objects["events"].values()))
    event["message"] = f"Error creating: {QUOTA_REFUSAL}"
    event["involvedObject"]["uid"] = "uid-of-an-earlier-job"
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.PENDING
    assert ("default", JOB) in fake.objects["jobs"]


def test_log_is_whole_lines_even_when_chunks_split_them(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="2x1")
    pod = fake.pod(JOB, 1)
    fake.set_phase(pod, "Running")
    for chunk in (b"[0]: step 1\n[0]: st", b"ep 2\n[1]: caf\xc3", b"\xa9\n", b"no newline"):
        fake.write_log(pod, chunk)
    lines = list(scheduler.log_iter(APP_ID, "main", 1))
    assert lines == ["[0]: step 1\n", "[0]: step 2\n", "[1]: café\n", "no newline\n"]
    assert list(scheduler.log_iter(APP_ID, "main", 1, regex="step")) == lines[:2]
    assert list(scheduler.log_iter(APP_ID, "Main", 1)) == lines  # the role as typed


def test_log_since(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    _submit(scheduler, j="2x1")
    pod = fake.pod(JOB, 0)
    fake.set_phase(pod, "Running")
    fake.write_log(pod, b"old\n", age_s=600)
    fake.write_log(pod, b"new\n")
    since = datetime.now() - timedelta(seconds=60)
    assert list(scheduler.log_iter(APP_ID, "main", 0, since=since)) == ["new\n"]
    assert list(scheduler.log_iter(APP_ID, "main", 0)) == ["old\n", "new\n"]


def test_log_follow_yields_lines_as_they_come_until_the_pod_ends(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="2x1")
    pod = fake.pod(JOB, 0)
    fake.set_phase(pod, "Running")
    fake.write_log(pod, b"first\n")
    lines = iter(scheduler.log_iter(APP_ID, "main", 0, should_tail=True))
    assert next(lines) == "first\n"

    def finish() -> None:
        fake.write_log(pod, b"sec")
        fake.write_log(pod, b"ond\n")
        fake.set_phase(pod, "Succeeded")

    threading.Thread(target=finish).start()
    assert list(lines) == ["second\n"]


def test_log_follow_waits_for_the_pod_to_start(fake: FakeCluster) -> None:
    naps: List[float] = []

    def start_pod(seconds: float) -> None:  # the scheduler's sleep between polls
        naps.append(seconds)
        pod = fake.pod(JOB, 1)
        fake.write_log(pod, b"up\n")
        fake.set_phase(pod, "Running")
        fake.set_phase(pod, "Succeeded")

    scheduler = KubernetesScheduler("test", suffix=lambda: SUFFIX, sleep=start_pod)
    _submit(scheduler, j="2x1")
    assert list(scheduler.log_iter(APP_ID, "main", 1, should_tail=True)) == ["up\n"]
    assert naps == [1.0]


def test_log_follow_stops_waiting_when_the_job_is_gone(fake: FakeCluster) -> None:
    def cancel(seconds: float) -> None:
        scheduler.cancel(APP_ID)

    scheduler = KubernetesScheduler("test", suffix=lambda: SUFFIX, sleep=cancel)
    _submit(scheduler, j="2x1")
    assert list(scheduler.log_iter(APP_ID, "main", 0, should_tail=True)) == [
        f"torchx-elastic: replica main/0 of {APP_ID} has no pod: the job does not exist"
        " (any more) (replicas with a pod: none)\n"
    ]


def test_log_of_a_pending_replica(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    _submit(scheduler, j="2x1")
    assert list(scheduler.log_iter(APP_ID, "main", 0)) == []
    fake.wait_image(fake.pod(JOB, 0))
    not_started = [
        f"torchx-elastic: replica main/0 of {APP_ID} has not started: ImagePullBackOff:"
        ' Back-off pulling image "torchx-elastic:latest"\n'
    ]
    assert list(scheduler.log_iter(APP_ID, "main", 0, should_tail=True)) == not_started
    assert list(scheduler.log_iter(APP_ID, "main", 0)) == not_started
    assert list(scheduler.log_iter(APP_ID, "main", 7)) == [
        f"torchx-elastic: replica main/7 of {APP_ID} has no pod: not created yet"
        " (replicas with a pod: main/0, main/1)\n"
    ]


def test_log_options_it_cannot_honour(scheduler: KubernetesScheduler) -> None:
    with pytest.raises(ValueError) as error:
        scheduler.log_iter(APP_ID, "main", until=datetime.now())
    assert str(error.value) == "the kubernetes scheduler cannot stop logs at a time (until)"
    with pytest.raises(ValueError) as error:
        scheduler.log_iter(APP_ID, "main", streams=Stream.STDERR)
    assert str(error.value) == (
        "the kubernetes scheduler has one combined log stream, not Stream.STDERR"
    )


def test_cancel_deletes_the_job_its_pods_and_the_service(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler)
    fake.set_phase(fake.pod(JOB, 0), "Running")
    scheduler.cancel(APP_ID)
    assert fake.objects["jobs"] == {} and fake.objects["services"] == {}
    assert fake.pods(JOB) == []  # not orphaned: the delete asked for propagation
    assert scheduler.describe(APP_ID) is None
    scheduler.cancel(APP_ID)  # idempotent


def test_list_by_label(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    _submit(scheduler)
    fake.objects["jobs"][("default", "not-ours")] = {"metadata": {"name": "x", "labels": {}}}
    fake.set_phase(fake.pod(JOB, 0), "Running")
    apps = scheduler.list()
    assert [(a.app_id, a.state) for a in apps] == [(APP_ID, AppState.RUNNING)]
    # torchx's development line passes the run options: their namespace is the one listed
    assert scheduler.list({"namespace": "default"}) == apps
    assert scheduler.list({"namespace": "elsewhere"}) == []


def test_volcano_backend(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    app_id = _submit(scheduler, backend="volcano")
    assert app_id == APP_ID and fake.objects["jobs"] == {}
    job = fake.objects["vcjobs"][("default", JOB)]
    assert [p["metadata"]["name"] for p in fake.pods(JOB)] == [
        f"{JOB}-main-{i}-0" for i in range(4)
    ]
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.PENDING
    fake.wait_image(fake.pod(JOB, 2))
    job["status"] = {"state": {"phase": "Running"}}
    fake.set_phase(fake.pod(JOB, 0), "Running")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.RUNNING
    assert _states(scheduler)[:3] == [ReplicaState.RUNNING, ReplicaState.PENDING] + [
        ReplicaState.PENDING
    ]
    assert "main[2] pod " in desc.msg and "ImagePullBackOff" in desc.msg
    job["status"] = {"state": {"phase": "Failed"}}
    assert scheduler.describe(APP_ID).state == AppState.FAILED  # type: ignore[union-attr]
    scheduler.cancel(APP_ID)
    assert fake.objects["vcjobs"] == {} and fake.pods(JOB) == []


def test_status_of_an_unknown_job_without_volcano_installed(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    fake.volcano = False
    assert scheduler.describe("default:gone") is None


# -- errors, as the user reads them ----------------------------------------------------------


def test_name_clash(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    app = ddp(script="main.py", j="2x1")
    info = scheduler.submit_dryrun(app, {})
    scheduler.schedule(info)
    with pytest.raises(KubernetesError) as error:
        scheduler.schedule(scheduler.submit_dryrun(app, {}))
    assert error.value.status == 409
    assert str(error.value) == (
        f"a Job named {JOB} already exists in namespace default; names are unique per run,"
        " so this request was submitted before."
        f" See it with `torchx status kubernetes://test/{APP_ID}`"
        " or submit the app again for a new name"
    )


def test_service_clash_rolls_the_job_back(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    fake.objects["services"][("default", JOB)] = {"metadata": {"name": JOB, "labels": {}}}
    with pytest.raises(KubernetesError) as error:
        _submit(scheduler)
    assert str(error.value).startswith(f"a Service named {JOB} already exists")
    assert fake.objects["jobs"] == {} and fake.pods(JOB) == []


def test_forbidden(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    fake.forbid("create", "jobs")
    with pytest.raises(KubernetesError) as error:
        _submit(scheduler)
    assert error.value.status == 403
    assert str(error.value) == (
        f"cannot create Job {JOB} in namespace default: forbidden (jobs.batch is forbidden:"
        ' User "alice" cannot create resource "jobs" in API group "batch" in the namespace'
        ' "default"). Ask a cluster admin for a Role that grants it, or choose a namespace'
        " you may use with -cfg namespace=NAME"
    )


def test_expired_credentials(scheduler: KubernetesScheduler, fake: FakeCluster) -> None:
    fake.token_expired = True
    with pytest.raises(KubernetesError) as error:
        scheduler.describe(APP_ID)
    assert str(error.value) == (
        f"cannot read Job {JOB} in namespace default: the API server at {fake.url} did not"
        " accept your credentials (Unauthorized); refresh them (e.g. your cloud's"
        " get-credentials command)"
    )


def test_invalid_manifest_is_answered_like_a_cluster(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """The fake validates what it is sent: the check of the scheduler's output can fail."""
    info = scheduler.submit_dryrun(ddp(script="main.py", j="2x1"), {})
    info.request.manifests[0]["spec"]["completionsMode"] = "Indexed"
    with pytest.raises(KubernetesError) as error:
        scheduler.schedule(info)
    assert error.value.status == 422
    assert str(error.value).startswith(
        f"cannot create Job {JOB} in namespace default: HTTP 422 Unprocessable Entity:"
        f" Job '{JOB}' is invalid: Additional properties are not allowed"
    )


def test_no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubernetesError) as error:
        create_scheduler("test").describe(APP_ID)
    assert str(error.value) == (
        f"no usable Kubernetes configuration ({missing}): Invalid kube-config file."
        " No configuration found. Point KUBECONFIG at a kubeconfig file (e.g. one written"
        " by your cloud's get-credentials command) or run inside the cluster with a"
        " service account"
    )


def test_in_cluster_without_a_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubernetesError) as error:
        create_scheduler("test").describe(APP_ID)
    assert str(error.value).startswith(
        "no usable Kubernetes configuration (in-cluster): Service token file does not exist."
    )


def test_unreachable_api_server(fake: FakeCluster, tmp_path: Path, monkeypatch: Any) -> None:
    url = fake.url
    fake.stop()
    with pytest.raises(KubernetesError) as error:
        create_scheduler("test").describe(APP_ID)
    assert str(error.value) == (
        f"cannot read Job {JOB} in namespace default: the Kubernetes API server at {url}"
        " is unreachable (Failed to establish a new connection: [Errno 111] Connection"
        " refused). Check that the cluster is up and that `kubectl config current-context`"
        " names it"
    )


def test_injected_client_and_list_namespace(fake: FakeCluster) -> None:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = fake.url
    scheduler = create_scheduler("test", client=client.ApiClient(configuration), namespace="ns")
    assert scheduler.list() == []
    assert fake.requests == [("list", "jobs/")]


def test_line_splitting_and_since() -> None:
    assert list(whole_lines([b"a\r", b"b\n\n", b""])) == ["a\rb\n", "\n"]
    assert since_seconds(None) is None
    now = datetime(2026, 1, 1, 12, 0, 0)
    assert since_seconds(now - timedelta(seconds=1.2), now) == 2
    assert since_seconds(now + timedelta(seconds=5), now) == 1


def test_status_shows_the_jobs_progress_from_replica_0s_pod_log(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    _submit(scheduler, j="2x2")
    pod0 = fake.pod(JOB, 0)
    fake.set_phase(pod0, "Running")
    fake.set_phase(fake.pod(JOB, 1), "Running")
    line = (
        b"[job progress] 120/200 (60.0%) of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120,"
        b" fastest r0 (n0) 131, 4.1 steps/s, ETA 29s\n"
    )
    fake.write_log(pod0, line, age_s=12)
    fake.write_log(pod0, b"[n0 r0] step 125\n")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.RUNNING
    assert desc.msg == (
        "progress 120/200 (60.0%) of 4/4 ranks, 4.1 steps/s, ETA 29s"
        f" (as of 12s ago, log of pod {pod0['metadata']['name']})"
    )
    # a log the scheduler may not read: the status says the rest, without progress
    fake.forbidden.add(("get", "pods"))
    assert scheduler.describe(APP_ID) is not None


def test_status_shows_the_progress_of_another_replica_where_replica_0_stands_by(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """Replica 0 joined after the job was full and stands by: node rank 0, which prints the
    job's progress, is another replica; its newest line is shown (a replica that was rank 0
    before holds an older one)."""
    _submit(scheduler, j="2x1", app={"spares": 1})
    pods = [fake.pod(JOB, k) for k in range(3)]
    for pod in pods:
        fake.set_phase(pod, "Running")
    standby = (
        "torchx-elastic: standing by: the job has its 2 nodes (3 here); this node takes the"
        " place of the first one lost, at the next round\n"
    )
    fake.write_log(pods[0], standby.encode(), age_s=30)
    line = "[job progress] {} of 2/2 ranks on 2/2 nodes, 1 standby, 4.1 steps/s\n"
    fake.write_log(pods[1], line.format("80/?").encode(), age_s=20)
    fake.write_log(pods[2], line.format("120/?").encode(), age_s=3)
    fake.write_log(pods[2], b"[n0 r0] step 125\n")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.msg == (
        "progress 120/? of 2/2 ranks, nodes: 2 training, 1 standby, 4.1 steps/s"
        f" (as of 3s ago, log of pod {pods[2]['metadata']['name']})"
    )


def test_status_counts_the_standby_of_a_job_whose_script_reports_no_progress(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """No rank reports progress: the rank-0 agent's nodes line, shown as it is (replica 0's
    log, then another replica's where replica 0 stands by)."""
    _submit(scheduler, j="2x1", app={"spares": 1})
    pods = [fake.pod(JOB, k) for k in range(3)]
    for pod in pods:
        fake.set_phase(pod, "Running")
    fake.write_log(pods[0], b"[job progress] nodes: 2 training, 1 standby\n", age_s=4)
    fake.write_log(pods[0], b"[n0 r0] step 7\n")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.msg == (
        f"nodes: 2 training, 1 standby (as of 4s ago, log of pod {pods[0]['metadata']['name']})"
    )


def test_status_says_how_many_nodes_joined_while_replica_0_waits(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    """Only two pods of a 3-node job fit: replica 0's agent prints its waiting line
    (agent/rendezvous/waiting.py), and torchx status shows it with the unschedulable pod."""
    _submit(scheduler, j="3x1")
    pod0, pod1, pod2 = (fake.pod(JOB, k) for k in range(3))
    for pod in (pod0, pod1):
        fake.set_phase(pod, "Running")
    fake.unschedulable(pod2, "0/1 nodes are available: 1 Insufficient cpu.")
    waiting = (
        "torchx-elastic: waiting for nodes: 2 of 3 joined; here: p0 (pid 7), p1 (pid 7);"
        f" missing: 1 node; hosting the rendezvous at {JOB}-0:29500, run id '{JOB}';"
        " gives up at 10:10:00 (join timeout 600s)\n"
    )
    fake.write_log(pod0, b"[torchx-elastic INFO] starting\n", age_s=9)
    fake.write_log(pod0, waiting.encode(), age_s=4)
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.RUNNING
    unschedulable, progress = desc.msg.splitlines()
    assert unschedulable.startswith(f"main[2] pod {pod2['metadata']['name']}: Unschedulable")
    assert progress == (
        f"{waiting.strip()[len('torchx-elastic: ') :]}"
        f" (as of 4s ago, log of pod {pod0['metadata']['name']})"
    )
    # the round completes: the workers' lines come after the waiting line
    fake.write_log(pod0, b"[n0 r0] step 1\n")
    desc = scheduler.describe(APP_ID)
    assert desc is not None and "waiting for nodes" not in desc.msg


def test_an_image_that_runs_as_root_says_which_option_runs_it() -> None:
    message = "container has runAsNonRoot and image will run as root (pod: x, container: main)"
    pod = {
        "status": {
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {
                        "waiting": {"reason": "CreateContainerConfigError", "message": message}
                    },
                }
            ]
        }
    }
    assert pod_problems(pod) == [
        f"CreateContainerConfigError: {message} (the image runs as root or a named user:"
        " -cfg run_as_root=True runs it as root)"
    ]
