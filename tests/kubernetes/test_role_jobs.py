"""Apps of several roles (ft.ddp) on the job backend: one Indexed Job per role, against the
golden YAML, the API schemas and the fake cluster's Job controller."""

from __future__ import annotations

from typing import Any, Dict

import yaml
from torchx.specs import AppState

from tests.kubernetes.conftest import SUFFIX
from tests.kubernetes.fake_api import FakeCluster
from tests.kubernetes.test_manifests import GOLDEN, _check_golden, _dryrun_yaml
from tests.kubernetes.validation import validate_all
from torchx_elastic.components.ft import ddp as ft_ddp
from torchx_elastic.contract import RANK0_ENV, ROLE_RANK0_ENV
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler

JOB = f"ft-ddp-{SUFFIX}"
APP_ID = f"default:{JOB}"
Obj = Dict[str, Any]


def _ft(**kwargs: Any) -> Any:
    return ft_ddp(script="examples/ft_ddp.py", j="2x1", cpu=1, max_retries=2, **kwargs)


def test_golden_ft_ddp_two_groups_of_2x1() -> None:
    _check_golden("job_ft_2_groups_2x1.yaml", _dryrun_yaml(_ft()))
    validate_all(list(yaml.safe_load_all((GOLDEN / "job_ft_2_groups_2x1.yaml").read_text())))


def _env(job: Obj) -> Dict[str, str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_one_job_per_role_behind_one_service(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    assert scheduler.schedule(scheduler.submit_dryrun(_ft(), {})) == APP_ID
    jobs = fake.objects["jobs"]
    first = jobs[("default", JOB)]
    groups = [jobs[("default", f"{JOB}-group{g}")] for g in (0, 1)]
    # every group's Job (and the Service) is owned by the Lighthouse's: one deletion ends all
    for owned in [*groups, fake.objects["services"][("default", JOB)]]:
        assert [o["name"] for o in owned["metadata"]["ownerReferences"]] == [JOB]
    lighthouse_host = f"{JOB}-0.{JOB}.default.svc"
    assert _env(first)[RANK0_ENV] == lighthouse_host
    for g, group in enumerate(groups):
        assert _env(group)[RANK0_ENV] == lighthouse_host
        own_host = f"{JOB}-group{g}-0.{JOB}.default.svc"
        assert _env(group)[ROLE_RANK0_ENV] == own_host
        assert group["spec"]["backoffLimitPerIndex"] == 2
        # a pod's bare hostname (torchft's Manager advertises it) resolves in every pod
        assert group["spec"]["template"]["spec"]["dnsConfig"] == {
            "searches": [f"{JOB}.default.svc.cluster.local"]
        }
    assert [a.app_id for a in scheduler.list()] == [APP_ID]  # the app once, not per Job


def _pod(fake: FakeCluster, job: str, index: int) -> Obj:
    return [p for p in fake.pods(job) if p["metadata"]["name"].startswith(f"{job}-{index}-")][-1]


def test_a_failed_group_pod_is_replaced_in_its_own_job(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    scheduler.schedule(scheduler.submit_dryrun(_ft(), {}))
    groups = [f"{JOB}-group{g}" for g in (0, 1)]
    for job in (JOB, *groups):
        for index in range(1 if job == JOB else 2):
            fake.set_phase(_pod(fake, job, index), "Running")
    group0_pods = [p["metadata"]["name"] for p in fake.pods(groups[0])]
    lost = _pod(fake, groups[1], 1)
    fake.set_phase(lost, "Failed", exit_code=143)
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.RUNNING, desc
    assert [p["metadata"]["name"] for p in fake.pods(groups[0])] == group0_pods
    assert _pod(fake, groups[1], 1)["metadata"]["name"] != lost["metadata"]["name"]
    assert desc.msg.splitlines() == [
        "lighthouse: RUNNING",
        "group0: RUNNING",
        "group1: RUNNING, 1 restart(s)",
    ]
    # the Lighthouse's last quorum, from its log: group 1 is not in it yet; each group's
    # progress from its rank-0 agent's log (group 1's, before its pod was replaced, is gone)
    fake.write_log(
        _pod(fake, JOB, 0),
        b"[torchx-elastic ft] quorum 2 at step 8: 1 of 2 replica groups (ft_ddp_0)\n",
    )
    fake.write_log(
        _pod(fake, groups[0], 0),
        b"[job progress] 9/200 (4.5%) of 2/2 ranks on 2/2 nodes, slowest r1 (n1) 9,"
        b" fastest r0 (n0) 9, 5.1 steps/s, ETA 37s\n",
        age_s=3,
    )
    desc = scheduler.describe(APP_ID)
    assert desc is not None
    assert desc.msg.splitlines() == [
        "lighthouse: RUNNING",
        "group0: RUNNING; training (in quorum 2), progress 9/200 (4.5%) of 2/2 ranks,"
        " 5.1 steps/s, ETA 37s (as of 3s ago, its rank-0 agent)",
        "group1: RUNNING, 1 restart(s); recovering (not in quorum 2)",
        "last quorum 2 at step 8: 1 of 2 replica groups (ft_ddp_0)",
        "job progress 9/200 (4.5%), group0 the furthest of 2 groups: 2/2 ranks reporting,"
        " 5.1 steps/s, ETA 37s (as of 3s ago); 1 of 2 groups in quorum 2",
    ]
    assert [r.role for r in desc.roles_statuses] == ["lighthouse", "group0", "group1"]
    for job in groups:
        for index in range(2):
            fake.set_phase(_pod(fake, job, index), "Running")
            fake.set_phase(_pod(fake, job, index), "Succeeded")
    assert scheduler.describe(APP_ID).state == AppState.RUNNING  # type: ignore[union-attr]
    fake.set_phase(_pod(fake, JOB, 0), "Succeeded")  # the Lighthouse saw every group end
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.SUCCEEDED, desc.msg
    scheduler.cancel(APP_ID)
    assert not fake.objects["jobs"] and not fake.pods(JOB)


def test_pods_refused_by_admission_fail_an_app_of_several_jobs_with_the_reason(
    scheduler: KubernetesScheduler, fake: FakeCluster
) -> None:
    fake.refuse_pods = f'pods "{JOB}-group0-0-abcde" is forbidden: exceeded quota: team'
    assert scheduler.schedule(scheduler.submit_dryrun(_ft(), {})) == APP_ID
    desc = scheduler.describe(APP_ID)
    assert desc is not None and desc.state == AppState.FAILED
    assert desc.msg.startswith(
        f"the cluster refused to create the job's pods: {fake.refuse_pods}\nThe Job was deleted"
    )
    assert not fake.objects["jobs"]  # every role's Job
    again = scheduler.describe(APP_ID)  # as torchx run --wait's next status
    assert again is not None and again.state == AppState.FAILED
