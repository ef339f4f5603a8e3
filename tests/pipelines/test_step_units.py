"""The submit-and-wait step against the fake API server (``tests/kubernetes/fake_api.py``):
every node's lines, exit status and root cause, outputs, cancellation, a missing permission."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Callable, Iterator, List, Set, Tuple

import pytest
import yaml
from torchx.runner import Runner

from tests.kubernetes.conftest import SUFFIX
from tests.kubernetes.fake_api import FakeCluster
from tests.kubernetes.validation import REPO
from tests.waiting import wait_until
from torchx_elastic.pipelines import __main__ as step_main
from torchx_elastic.pipelines.step import EXIT_STOPPED, Step
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler

JOB = f"train-{SUFFIX}"
APP = "kubernetes://torchx/default:" + JOB
DDP = ["dist.ddp", "-j", "2x1", "--script", "train.py"]


@pytest.fixture
def runner(fake: FakeCluster) -> Iterator[Runner]:
    def scheduler(session_name: str, **kwargs: object) -> KubernetesScheduler:
        return KubernetesScheduler(session_name, suffix=lambda: SUFFIX)

    with Runner("torchx", {"kubernetes": scheduler}) as found:
        yield found


def _in_background(target: Callable[[], int]) -> Callable[[], int]:
    result: List[int] = []
    thread = threading.Thread(target=lambda: result.append(target()), daemon=True)
    thread.start()

    def join() -> int:
        thread.join(60)
        assert result, "the step did not end"
        return result[0]

    return join


def _wait_for_pods(fake: FakeCluster, count: int) -> None:
    wait_until(lambda: len(fake.pods(JOB)) >= count, what=f"the job's {count} pods")


def _run(runner: Runner, argv: List[str], out: io.StringIO) -> Callable[[], int]:
    args = step_main.parser().parse_args(argv)
    app = step_main.parse_app(args, step_main.parser())
    step = Step(out, runner)
    return _in_background(lambda: step.run(app, {}))


def test_every_node_s_lines_then_success(runner: Runner, fake: FakeCluster) -> None:
    out = io.StringIO()
    join = _run(runner, DDP, out)
    _wait_for_pods(fake, 2)
    for index in (0, 1):
        pod = fake.pod(JOB, index)
        fake.set_phase(pod, "Running")
        fake.write_log(pod, f"[{index}]: rank {index} says hello\n".encode())
    for index in (0, 1):
        fake.set_phase(fake.pod(JOB, index), "Succeeded")
    assert join() == 0
    text = out.getvalue()
    assert f"torchx-elastic: submitted {APP}\n" in text
    assert text.count("train/0 [0]: rank 0 says hello\n") == 1
    assert text.count("train/1 [1]: rank 1 says hello\n") == 1
    assert text.endswith(f"torchx-elastic: {APP} SUCCEEDED\n")


def test_a_failed_job_ends_the_step_with_its_root_cause(runner: Runner, fake: FakeCluster) -> None:
    out = io.StringIO()
    join = _run(runner, DDP, out)
    _wait_for_pods(fake, 2)
    for index in (0, 1):
        fake.set_phase(fake.pod(JOB, index), "Running")
    fake.set_phase(fake.pod(JOB, 1), "Failed", exit_code=1, message="ValueError: bad batch")
    fake.set_phase(fake.pod(JOB, 0), "Failed", exit_code=1)
    assert join() == 1
    end = out.getvalue().rpartition(f"torchx-elastic: {APP} FAILED: ")[2]
    assert "pod train-bcdfghjk-1-00000: Error (container train, exit code 1)" in end
    assert end.endswith("ValueError: bad batch\n")


def test_stopping_the_step_cancels_the_job(runner: Runner, fake: FakeCluster) -> None:
    out = io.StringIO()
    args = step_main.parser().parse_args(DDP)
    step = Step(out, runner)
    join = _in_background(lambda: step.run(step_main.parse_app(args, step_main.parser()), {}))
    _wait_for_pods(fake, 2)
    step.stop()
    assert join() == EXIT_STOPPED, out.getvalue()
    assert ("default", JOB) not in fake.objects["jobs"]
    assert out.getvalue().endswith(
        f"torchx-elastic: {APP} CANCELLED: the step was stopped: the job was cancelled\n"
    )


def test_a_missing_permission_is_said_with_the_role_to_ask_for(
    runner: Runner, fake: FakeCluster
) -> None:
    fake.forbid("create", "jobs")
    out = io.StringIO()
    assert _run(runner, DDP, out)() == 1
    text = out.getvalue()
    assert text.startswith("torchx-elastic: cannot submit train to Kubernetes: cannot create Job")
    assert 'User "alice" cannot create resource "jobs"' in text
    assert "docs/pipelines-role.yaml" in text


def test_the_command_writes_its_outputs_once_the_job_succeeded(
    runner: Runner, fake: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m torchx_elastic.pipelines`` (in this process: its signal handlers need the
    main thread), the cluster driven from another thread."""
    monkeypatch.setattr(step_main, "get_runner", lambda: runner)
    output = tmp_path / "outputs" / "checkpoint"
    seen: List[object] = []

    def cluster() -> int:
        _wait_for_pods(fake, 2)
        job = fake.objects["jobs"][("default", JOB)]
        container = job["spec"]["template"]["spec"]["containers"][0]
        seen.append(container["command"] + container.get("args", []))
        seen.append(output.exists())
        for index in (0, 1):
            fake.set_phase(fake.pod(JOB, index), "Running")
            fake.set_phase(fake.pod(JOB, index), "Succeeded")
        return 0

    join = _in_background(cluster)
    data = "{{pipeline_input:data}}"
    status = step_main.main(
        ["--input", "data", "/data/$run", "--output", str(output), f"{data}/ckpt"]
        + [*DDP, "--", "--data", data]
    )
    assert join() == 0 and status == 0
    command, written_before_the_end = seen
    # the input as given, after torchx's macros; "$$" is Kubernetes' escape of "$" in a command
    assert command[-2:] == ["--data", "/data/$$run"]  # type: ignore[index]
    assert written_before_the_end is False
    assert output.read_text() == "/data/$run/ckpt"


def test_a_job_deleted_by_someone_else_ends_the_step(runner: Runner, fake: FakeCluster) -> None:
    out = io.StringIO()
    join = _run(runner, DDP, out)
    _wait_for_pods(fake, 2)
    _remove(fake)  # kubectl delete job (its pods and Service go with it)
    assert join() == 1
    assert out.getvalue().endswith(
        f"torchx-elastic: {APP} GONE: the job was deleted before it ended\n"
    )


ROLE = REPO / "docs" / "pipelines-role.yaml"
# the fake API's request kinds as (API group, resource)
KINDS = {
    "jobs": ("batch", "jobs"),
    "services": ("", "services"),
    "pods": ("", "pods"),
    "vcjobs": ("batch.volcano.sh", "jobs"),
    "secrets": ("", "secrets"),
    "networkpolicies": ("networking.k8s.io", "networkpolicies"),
}


def _remove(fake: FakeCluster) -> None:
    """What a finished job leaves: its Job (with its pods), its Service, Secret and
    NetworkPolicy (the garbage collector removes them with the Job; the fake does not when
    someone else deleted the Job alone)."""
    recorded = len(fake.requests)
    for kind, path in [
        ("jobs", "/apis/batch/v1"),
        ("services", "/api/v1"),
        ("secrets", "/api/v1"),
        ("networkpolicies", "/apis/networking.k8s.io/v1"),
    ]:
        if ("default", JOB) in fake.objects[kind]:
            url = f"{path}/namespaces/default/{kind}/{JOB}"
            fake.handle("DELETE", url, {"propagationPolicy": ["Background"]}, None)
    del fake.requests[recorded:]  # the test's own requests, not the step's
    assert not fake.pods(JOB)


def _granted() -> Set[Tuple[str, str, str]]:
    (role,) = [d for d in yaml.safe_load_all(ROLE.read_text()) if d["kind"] == "Role"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_documented_role_grants_what_the_step_does_and_no_more(
    runner: Runner, fake: FakeCluster
) -> None:
    """Every request of a step that succeeds, one whose job someone deletes and one that is
    stopped (all three with its log followed) is granted by docs/pipelines-role.yaml, and
    every permission there is used."""
    test_every_node_s_lines_then_success(runner, fake)
    _remove(fake)  # the next step's job gets the same name
    test_a_job_deleted_by_someone_else_ends_the_step(runner, fake)
    _remove(fake)
    test_stopping_the_step_cancels_the_job(runner, fake)
    used = set()
    for verb, what in fake.requests:
        kind = what.partition("/")[0]
        group, resource = KINDS[kind]
        used.add((group, f"{resource}/log", "get") if verb == "log" else (group, resource, verb))
    assert used <= _granted(), used - _granted()
    assert used == _granted(), _granted() - used


def test_a_log_it_may_not_read_is_said_and_the_job_still_followed(
    runner: Runner, fake: FakeCluster
) -> None:
    fake.forbid("get", "pods")  # pods/log: the fake API answers 403 to reading a log
    out = io.StringIO()
    join = _run(runner, DDP, out)
    _wait_for_pods(fake, 2)
    for index in (0, 1):
        fake.set_phase(fake.pod(JOB, index), "Running")
    for index in (0, 1):
        fake.set_phase(fake.pod(JOB, index), "Succeeded")
    assert join() == 0
    text = out.getvalue()
    for index in (0, 1):
        said = f"torchx-elastic: cannot follow the log of train/{index}: cannot read the log"
        assert said in text
    assert "(the step's service account needs the Role in docs/pipelines-role.yaml" in text
    assert text.endswith(f"torchx-elastic: {APP} SUCCEEDED\n")


def test_a_status_it_cannot_read_ends_the_step(runner: Runner, fake: FakeCluster) -> None:
    out = io.StringIO()
    join = _run(runner, DDP, out)
    wait_until(lambda: "torchx-elastic: submitted" in out.getvalue(), what="the job submitted")
    fake.token_expired = True
    assert join() == 1
    end = out.getvalue().rpartition(f"torchx-elastic: {APP} UNKNOWN: ")[2]
    # the token expires between two of the status' calls: whichever comes next says it
    assert end.startswith("cannot read the job's status: cannot ")
    assert "did not accept your credentials (Unauthorized)" in end


def test_a_stopped_step_that_may_not_cancel_says_so(runner: Runner, fake: FakeCluster) -> None:
    fake.forbid("delete", "jobs")
    out = io.StringIO()
    args = step_main.parser().parse_args(DDP)
    step = Step(out, runner)
    join = _in_background(lambda: step.run(step_main.parse_app(args, step_main.parser()), {}))
    _wait_for_pods(fake, 2)
    step.stop()
    assert join() == EXIT_STOPPED, out.getvalue()
    end = out.getvalue().rpartition(f"torchx-elastic: {APP} UNKNOWN: ")[2]
    assert end.startswith("the step was stopped; cancelling the job: cannot delete Job")
    assert "(the step's service account needs the Role in docs/pipelines-role.yaml" in end
