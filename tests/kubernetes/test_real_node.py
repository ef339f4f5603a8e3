"""End to end on a real single-node Kubernetes cluster (``../shared/k8s/cluster.sh``).

The module starts the cluster once (``down`` then ``up``), loads the project image into the
node under a ``:latest`` tag (so that the default pull policy must take the node's own
image), drives the real ``torchx`` CLI against it, and ``down``s it at the end. Without a
cluster (not root, no ``cluster.sh``, ``up`` fails, no image) these tests skip with the
reason locally, and fail in CI (tests/ci.py).

``TORCHX_ELASTIC_K8S_IMAGE`` picks the Docker image to load (default
``torchx-elastic:latest``, built by ``make image``). ``TORCHX_ELASTIC_K8S_MOUNT_SOURCES=1``
mounts this checkout's ``torchx_elastic/`` and ``examples/`` over the image's (``hostPath``
volumes: one node), to try a change without building the image again. The cluster is one per
machine: it is used under ``flock /tmp/k8s-cluster.lock``.
"""

from __future__ import annotations

import calendar
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, TypeVar

import pytest
from torchx.specs import AppState, ReplicaState

from tests.ci import unavailable
from tests.kubernetes.validation import REPO
from torchx_elastic.components.dist import ddp
from torchx_elastic.schedulers.kubernetes.client import load_api_client
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler

# the first test also starts the cluster and loads the image (a minute or two)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CLUSTER_SH = REPO.parent / "shared" / "k8s" / "cluster.sh"
CLUSTER_LOCK = "/tmp/k8s-cluster.lock"
SOURCE_IMAGE = os.environ.get("TORCHX_ELASTIC_K8S_IMAGE", "torchx-elastic:latest")
# a :latest tag that exists only on the node: Kubernetes' own default would pull it (Always)
NODE_IMAGE = "torchx-elastic-e2e:latest"
TORCHX = str(Path(sys.executable).parent / "torchx")
IMAGE_PACKAGE_DIR = "/opt/venv/lib/python3.11/site-packages/torchx_elastic"
IMAGE_WORKDIR = "/workspace"
JOB_TIMEOUT_S = 300.0
ELASTIC_TTL_S = 30
POLL_S = 1.0
NODE_CHECK_S = 10.0
NODE_GRACE_S = 30.0
# the running cluster's kubeconfig, for the node checks of _wait
_KUBECONFIG: Optional[str] = None
# what the waits that timed out waited for; at MAX_TIMEOUTS the later tests fail at once
_TIMED_OUT: List[str] = []
MAX_TIMEOUTS = 3

T = TypeVar("T")


@dataclass
class Cluster:
    env: Dict[str, str]
    workdir: Path
    launched: List[str] = field(default_factory=list)

    def core(self) -> Any:
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(self.env["KUBECONFIG"]))

    def torchx(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The real ``torchx`` CLI, in a directory without a .torchxconfig."""
        return subprocess.run(
            [TORCHX, *args],
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def run(self, *component_args: str, cfg: str = "", component: str = "dist.ddp") -> str:
        """``torchx run -s kubernetes dist.ddp ...``; returns the app handle."""
        cfg_args = ["-cfg", cfg] if cfg else []
        if os.environ.get("TORCHX_ELASTIC_K8S_MOUNT_SOURCES") == "1":
            package = f"type=bind,src={REPO / 'torchx_elastic'},dst={IMAGE_PACKAGE_DIR},readonly"
            examples = f"type=bind,src={REPO / 'examples'},dst={IMAGE_WORKDIR}/examples,readonly"
            component_args = ("--mounts", f"{package},{examples}", *component_args)
        result = self.torchx(
            "run", "--workspace", "", "-s", "kubernetes", *cfg_args,
            component, "--image", NODE_IMAGE, *component_args,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        handle = result.stdout.strip().splitlines()[-1]
        assert handle.startswith("kubernetes://torchx/default:"), result.stdout
        self.launched.append(handle)
        return handle

    def logs_of(self, job: str) -> str:
        """Phase and log tail of every pod of ``job``: what a failed assertion shows."""
        return "\n".join(
            f"--- {p['metadata']['name']} ({p['status'].get('phase')}):\n"
            + "\n".join(self.pod_log(p["metadata"]["name"]).splitlines()[-40:])
            for p in self.pods(job)
        )

    def kubectl(self, *args: str, stdin: str = "") -> str:
        result = subprocess.run(
            ["kubectl", *args], env=self.env, input=stdin, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    def namespace(self, name: str, *objects: str, labels: str = "") -> None:
        """A fresh namespace ``name`` (labelled with ``labels``, k=v,...) holding ``objects``
        (YAML documents)."""
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true")
        self.kubectl("create", "namespace", name)
        # pods are refused until the namespace's ServiceAccount controller made "default"
        _wait(
            f"the default ServiceAccount of {name}",
            lambda: (
                True if "default" in self.kubectl("get", "sa", "-n", name, "-o", "name") else None
            ),
            timeout_s=120,
        )
        if labels:
            self.kubectl("label", "namespace", name, *labels.split(","))
        for manifest in objects:
            self.kubectl("apply", "-n", name, "-f", "-", stdin=manifest)

    def pods(self, job: str) -> List[Dict[str, Any]]:
        """The pods of a job, oldest first, as the API's JSON."""
        found = self.core().list_namespaced_pod(
            "default", label_selector=f"app.kubernetes.io/instance={job}", _preload_content=False
        )
        items = json.loads(found.data)["items"]
        return sorted(items, key=lambda p: str(p["metadata"]["creationTimestamp"]))

    def delete_pod(self, name: str) -> None:
        """``kubectl delete pod NAME --wait=false``."""
        self.core().delete_namespaced_pod(name, "default")

    def pod_log(self, name: str) -> str:
        from kubernetes.client.rest import ApiException

        try:
            return str(self.core().read_namespaced_pod_log(name, "default"))
        except ApiException:
            return ""  # not started yet

    def logged_at(self, name: str, text: str, after_s: float) -> Optional[float]:
        """The time (epoch seconds) of the first line of pod ``name``'s log that holds
        ``text`` and was written after ``after_s``, or None. The times are the container
        runtime's, stamped as it read each line from the container (the node is this machine:
        the same clock as time.time())."""
        from kubernetes.client.rest import ApiException

        try:
            found = self.core().read_namespaced_pod_log(
                name, "default", timestamps=True, _preload_content=False
            )
        except ApiException:
            return None  # not started yet
        for line in found.data.decode(errors="replace").splitlines():
            stamp, _, rest = line.partition(" ")
            if text not in rest:
                continue
            # RFC3339Nano, e.g. 2026-11-29T16:08:23.123456789Z: to microseconds
            whole, _, fraction = stamp.rstrip("Z").partition(".")
            at_s = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(
                f"0.{fraction or 0}"
            )
            if at_s > after_s:
                return at_s
        return None

    def network_policies(self) -> Dict[str, Any]:
        """Name -> spec of the NetworkPolicies in ``default``."""
        from kubernetes import client, config

        api = client.NetworkingV1Api(config.new_client_from_config(self.env["KUBECONFIG"]))
        found = api.list_namespaced_network_policy("default", _preload_content=False)
        return {i["metadata"]["name"]: i["spec"] for i in json.loads(found.data)["items"]}

    def secrets(self) -> List[str]:
        found = self.core().list_namespaced_secret("default", _preload_content=False)
        return [item["metadata"]["name"] for item in json.loads(found.data)["items"]]

    def create_pod(self, manifest: Dict[str, Any]) -> None:
        self.core().create_namespaced_pod("default", manifest)

    def allocatable_millicpu(self) -> int:
        (node,) = json.loads(self.core().list_node(_preload_content=False).data)["items"]
        return _millicpu(node["status"]["allocatable"]["cpu"])

    def free_millicpu(self) -> int:
        """The node's allocatable CPU less what the pods on it request, in millicpus."""
        core = self.core()
        free = self.allocatable_millicpu()
        pods = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
        for pod in pods["items"]:
            if pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            if not pod["spec"].get("nodeName"):
                continue
            for container in pod["spec"]["containers"]:
                requests = (container.get("resources") or {}).get("requests") or {}
                free -= _millicpu(requests.get("cpu", "0"))
        return free

    def services(self) -> List[str]:
        found = self.core().list_namespaced_service("default", _preload_content=False)
        return [item["metadata"]["name"] for item in json.loads(found.data)["items"]]


def _millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _cluster_sh(
    *args: str, env: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not CLUSTER_SH.is_file():
        unavailable(f"no {CLUSTER_SH}: the real-node tests need ../shared/k8s beside the repo")
    if os.geteuid() != 0:
        unavailable("the real Kubernetes node (../shared/k8s/cluster.sh) needs root")
    image = subprocess.run(["docker", "image", "inspect", SOURCE_IMAGE], capture_output=True)
    if image.returncode != 0:
        unavailable(f"no Docker image {SOURCE_IMAGE}: build it with `make image`")
    with open(CLUSTER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one cluster per machine
        try:
            yield _start(tmp_path_factory.mktemp("k8s-e2e"))
        finally:
            _cluster_sh("down")


def _start(workdir: Path) -> Cluster:
    _cluster_sh("down")
    up = _cluster_sh("up")
    if up.returncode != 0:
        unavailable(
            f"cluster.sh up failed (`{CLUSTER_SH} install` installs what it needs):\n"
            f"{up.stderr[-3000:]}"
        )
    kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
    global _KUBECONFIG
    _KUBECONFIG = kubeconfig
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    subprocess.run(["docker", "tag", SOURCE_IMAGE, NODE_IMAGE], check=True)
    # the docs' commands name the image as docker/build-image.sh tags it (same layers)
    loaded = _cluster_sh("load-image", NODE_IMAGE, SOURCE_IMAGE, env=env)
    if loaded.returncode != 0:
        unavailable(f"cluster.sh load-image {NODE_IMAGE} failed:\n{loaded.stderr[-3000:]}")
    return Cluster(env=env, workdir=workdir)


@pytest.fixture(autouse=True)
def cancel_what_the_test_left(cluster: Cluster) -> Iterator[None]:
    """Cancel the jobs a test launched, whatever its outcome: a job left running by a
    failed test would hold the node's CPUs and fail the tests after it. A node that cannot
    run pods fails the test at its start, and so do three waits that timed out before it
    (a node that runs no pod fails every test: each would wait its whole timeout)."""
    if len(_TIMED_OUT) >= MAX_TIMEOUTS:
        pytest.fail(
            f"{len(_TIMED_OUT)} earlier tests on this node timed out waiting (for"
            f" {'; '.join(_TIMED_OUT)}): their output says why\n{_node_report()}"
        )
    _fail_if_the_node_is_unwell("before the test")
    yield
    while cluster.launched:
        cluster.torchx("cancel", cluster.launched.pop())


@pytest.fixture
def scheduler(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> KubernetesScheduler:
    """The scheduler in this process, to poll states without starting a CLI each time."""
    monkeypatch.setenv("KUBECONFIG", cluster.env["KUBECONFIG"])
    return KubernetesScheduler("torchx", client=load_api_client())


def _wait(what: str, check: Callable[[], Optional[T]], timeout_s: float = JOB_TIMEOUT_S) -> T:
    """Poll ``check`` until it returns a value; a node that cannot run pods ends the wait at
    once (every later test would wait its whole timeout too), saying why."""
    deadline = time.monotonic() + timeout_s
    next_node_check = time.monotonic() + NODE_CHECK_S
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > next_node_check:
            next_node_check = time.monotonic() + NODE_CHECK_S
            _fail_if_the_node_is_unwell(f"while waiting for {what}")
        if time.monotonic() > deadline:
            _TIMED_OUT.append(what)
            raise AssertionError(
                f"timed out after {timeout_s:.0f} s waiting for {what}\n{_node_report()}"
            )
        time.sleep(POLL_S)


def _node_problem() -> str:
    """What keeps the node from running pods (not Ready, a pressure condition, a taint), or
    "" when nothing does."""
    if _KUBECONFIG is None:
        return ""
    found = subprocess.run(
        ["kubectl", "get", "nodes", "-o", "json"], env={**os.environ, "KUBECONFIG": _KUBECONFIG},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if found.returncode != 0:
        return f"kubectl get nodes failed: {found.stderr.strip()}"
    problems = []
    for node in json.loads(found.stdout)["items"]:
        name = node["metadata"]["name"]
        for condition in node["status"].get("conditions", []):
            kind, status = condition["type"], condition["status"]
            if (kind == "Ready") != (status == "True"):
                problems.append(f"{name}: {kind}={status} ({condition.get('message', '')})")
        for taint in node["spec"].get("taints", []):
            problems.append(f"{name}: taint {taint['key']}:{taint['effect']}")
    return "; ".join(problems)


def _kubectl_lines(*args: str, last: int = 15) -> List[str]:
    if _KUBECONFIG is None:
        return []
    found = subprocess.run(
        ["kubectl", *args], env={**os.environ, "KUBECONFIG": _KUBECONFIG},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return (found.stdout + found.stderr).splitlines()[-last:]


def _node_report() -> str:
    """The node's problem, the disk, every pod, the last events and the kubelet's last
    lines: what a failed wait shows."""
    kubelet_log = Path(os.environ.get("K8S_STATE", "/tmp/k8s")) / "log" / "kubelet.log"
    tail = []
    if kubelet_log.exists():
        tail = kubelet_log.read_text(errors="replace").splitlines()[-15:]
    disk = subprocess.run(["df", "-h", "/"], capture_output=True, text=True).stdout.strip()
    pods = _kubectl_lines("get", "pods", "-A", "-o", "wide", last=30)
    events = _kubectl_lines("get", "events", "-A", "--sort-by=.lastTimestamp")
    node = f"node: {_node_problem() or 'Ready, no pressure, no taint'}"
    return "\n".join([node, disk, *pods, *events, *tail])


def _fail_if_the_node_is_unwell(when: str) -> None:
    """Fail when the node has had a problem for NODE_GRACE_S (a new node is not Ready for
    a moment)."""
    deadline = time.monotonic() + NODE_GRACE_S
    while _node_problem():
        if time.monotonic() > deadline:
            pytest.fail(
                f"the Kubernetes node cannot run pods {when}: {_node_problem()}\n{_node_report()}"
            )
        time.sleep(2)


def _app_id(handle: str) -> str:
    return handle.rpartition("/")[2]


def _ended(scheduler: KubernetesScheduler, handle: str) -> Optional[AppState]:
    desc = scheduler.describe(_app_id(handle))
    assert desc is not None, f"{handle} is gone"
    return desc.state if desc.state in (AppState.SUCCEEDED, AppState.FAILED) else None


def _wait_done(scheduler: KubernetesScheduler, handle: str) -> AppState:
    return _wait(f"{handle} to end", lambda: _ended(scheduler, handle))


def _wait_in(cluster: Cluster, job: str, what: str, check: Callable[[], Optional[T]]) -> T:
    """:func:`_wait`, with the logs of ``job``'s pods in the error where it times out."""
    try:
        return _wait(what, check)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{cluster.logs_of(job)}") from None


def _succeeded(cluster: Cluster, scheduler: KubernetesScheduler, handle: str, job: str) -> str:
    """The job's logs once it SUCCEEDED (its logs in the error where it did not end so)."""
    state = _wait_in(cluster, job, f"{handle} to end", lambda: _ended(scheduler, handle))
    logs = cluster.logs_of(job)
    assert state == AppState.SUCCEEDED, logs
    return logs


def _log_has(cluster: Cluster, pod: str, text: str) -> Optional[bool]:
    return True if text in cluster.pod_log(pod) else None


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


def _no_traceback_of_torchx(result: subprocess.CompletedProcess[str]) -> None:
    """torchx's own tracebacks go to stderr (the job's own are in its log, on stdout)."""
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_2x2_job_on_a_loaded_latest_image(cluster: Cluster, scheduler: KubernetesScheduler) -> None:
    """World size 4 over two pods, fractional CPUs, the node's own :latest image; then the
    log and status of a replica whose pod was deleted after the end."""
    handle = cluster.run(
        "-j", "2x2", "--cpu", "0.5", "--memMB", "1500", "--script", "examples/main.py"
    )
    assert _wait_done(scheduler, handle) == AppState.SUCCEEDED
    status = cluster.torchx("status", handle)
    assert "State: SUCCEEDED" in status.stdout and "Num Restarts: 0" in status.stdout
    log = cluster.torchx("log", handle)
    assert log.returncode == 0, log.stderr
    assert "world size 4" in log.stdout and "done: 20 steps" in log.stdout
    job = _app_id(handle).partition(":")[2]
    pods = cluster.pods(job)
    assert len(pods) == 2
    assert {p["spec"]["containers"][0]["imagePullPolicy"] for p in pods} == {"IfNotPresent"}
    assert pods[0]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"

    index = "batch.kubernetes.io/job-completion-index"
    (second,) = [p for p in pods if p["metadata"]["annotations"][index] == "1"]
    cluster.delete_pod(second["metadata"]["name"])
    _wait("the pod to go", lambda: True if len(cluster.pods(job)) == 1 else None, timeout_s=120)
    log = cluster.torchx("log", f"{handle}/main/1")
    _no_traceback(log)
    assert log.returncode == 0
    assert (
        f"replica main/1 of {_app_id(handle)} has no pod: it was deleted, with its log"
        in log.stdout
    )
    log = cluster.torchx("log", handle)  # every replica: the one left, and a plain line
    _no_traceback(log)
    assert "world size 4" in log.stdout and "has no pod" in log.stdout
    desc = scheduler.describe(_app_id(handle))
    assert desc is not None
    assert [r.state for r in desc.roles_statuses[0].replicas] == [
        ReplicaState.SUCCEEDED,
        ReplicaState.UNKNOWN,
    ]
    assert "main[1]: no pod: it was deleted" in desc.msg
    cluster.torchx("cancel", handle)


def test_elastic_job_and_ttl_cleanup(cluster: Cluster, scheduler: KubernetesScheduler) -> None:
    handle = cluster.run(
        "-j", "1:2x1", "--cpu", "0.5", "--script", "examples/main.py",
        cfg=f"ttl_seconds_after_finished={ELASTIC_TTL_S}",
    )  # fmt: skip
    assert _wait_done(scheduler, handle) == AppState.SUCCEEDED
    # read in this process: a CLI can take longer than the TTL on a busy machine
    log = "".join(scheduler.log_iter(_app_id(handle), "main", 0))
    assert "world size 2" in log, log
    # the finished Job goes by itself, with its pods and Service
    job = _app_id(handle).partition(":")[2]
    _wait(
        "the TTL controller to delete the finished Job",
        lambda: True if scheduler.describe(_app_id(handle)) is None else None,
        timeout_s=ELASTIC_TTL_S + 150,
    )
    _wait("its pods to go", lambda: True if not cluster.pods(job) else None, timeout_s=150)
    status = cluster.torchx("status", handle)
    assert "does not exist or has been removed" in status.stdout + status.stderr


def test_a_rank_that_keeps_crashing_uses_the_retries_as_attempts(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """A rank fails for good: every node fails, which is one attempt of the job; the pods
    are replaced once (--max_retries 1), then the job fails with the root cause in status."""
    handle = cluster.run(
        "-j", "2x1", "--cpu", "0.5", "--max_retries", "1", "--script", "examples/timed.py",
        "--", "--seconds", "60", "--crash-rank", "1", "--crash-after-s", "1",
    )  # fmt: skip
    assert _wait_done(scheduler, handle) == AppState.FAILED
    job = _app_id(handle).partition(":")[2]
    pods = cluster.pods(job)
    assert len(pods) == 4, [p["metadata"]["name"] for p in pods]
    status = cluster.torchx("status", handle)
    annotations = [(p["metadata"]["name"], p["metadata"]["annotations"]) for p in pods]
    assert "State: FAILED" in status.stdout, status.stdout
    assert "Num Restarts: 1" in status.stdout, (status.stdout, annotations)
    # rank 1 is on either node (the rendezvous assigns ranks): its report reaches status
    assert "failed first: CrashOnPurpose: rank 1 crashes on purpose" in status.stdout, status.stdout
    log = cluster.torchx("log", handle)
    _no_traceback_of_torchx(log)
    assert "Root cause" in log.stdout and "rank 1 crashes on purpose" in log.stdout, log.stdout


def test_a_deleted_pod_is_replaced_and_the_job_goes_on(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """kubectl delete pod (an eviction, a node drain): the other node waits in the open
    rendezvous, the Job replaces the pod (same host name) and the job succeeds."""
    handle = cluster.run(
        "-j", "2x1", "--cpu", "0.5", "--max_retries", "1", "--script", "examples/timed.py",
        "--", "--seconds", "25",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]

    def training() -> Optional[List[str]]:
        names = [str(p["metadata"]["name"]) for p in cluster.pods(job)]
        started = len(names) == 2 and all(_log_has(cluster, n, "attempt 0") for n in names)
        return names if started else None

    first_pods = _wait("both nodes to train", training)
    lost = next(n for n in first_pods if n.startswith(f"{job}-1-"))
    cluster.delete_pod(lost)
    try:
        state = _wait_done(scheduler, handle)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{cluster.logs_of(job)}") from None
    assert state == AppState.SUCCEEDED, cluster.torchx("status", handle).stdout
    pods = cluster.pods(job)
    # node 0 restarted its workers in place: had the lost node closed the rendezvous, node 0
    # would have failed too and been replaced (the job may still succeed on the retries)
    node0 = [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(f"{job}-0-")]
    assert node0 == [n for n in first_pods if n.startswith(f"{job}-0-")], node0
    replacements = [p for p in pods if str(p["metadata"]["name"]).startswith(f"{job}-1-")]
    assert [p["metadata"]["name"] for p in replacements] != [lost]
    assert {p["spec"]["hostname"] for p in replacements} == {f"{job}-1"}
    status = cluster.torchx("status", handle)
    assert "State: SUCCEEDED" in status.stdout and "Num Restarts: 1" in status.stdout, status.stdout
    log = cluster.torchx("log", f"{handle}/timed/0")
    assert "rank 0 done" in log.stdout, log.stdout


def test_a_deleted_rendezvous_pod_leaves_the_job_to_the_other_which_it_rejoins(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """-j 1:2x1: pod 0 hosts the rendezvous and is deleted mid-run. Pod 1 moves the
    rendezvous to itself and trains on alone; the Job recreates pod 0 (same host name), which
    hosts a rendezvous at the original endpoint, learns from pod 1 where the job went, and
    joins it there: the world is 2 again and the job succeeds."""
    handle = cluster.run(
        "-j", "1:2x1", "--cpu", "0.5", "--max_retries", "1", *SHORT_LAST_CALL, *ONE_THREAD,
        "--script", "examples/timed.py", "--", "--seconds", "20", "--seconds-alone", "300",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]
    first = _wait("pod 0 to train with pod 1", lambda: _world_of_2(cluster, job, 0))
    deleted_s = time.time()
    cluster.delete_pod(first)
    # the figures: from the delete to the first line after it of examples/timed.py (printed
    # once init_process_group returned) at world 1 in pod 1, and at world 2 in the recreated
    # pod 0, by the log's own times. They include pod 0's termination (SIGTERM: its agent
    # leaves), pod 1 seeing the loss and moving the rendezvous, its worker's restart; for
    # world 2 also the Job creating pod 0 again, its scheduling, container start, the agent's
    # start, its finding where the job went, and pod 1's workers restarting in world 2.
    alone_s = _wait_in(
        cluster,
        job,
        "pod 1 to train alone",
        lambda: cluster.logged_at(_pod_of(cluster, job, 1), "of world size 1,", deleted_s),
    )
    again_s = _wait_in(
        cluster,
        job,
        "the recreated pod 0 to train with pod 1",
        lambda: next(
            (
                cluster.logged_at(name, "of world size 2,", deleted_s)
                for name in [_pod_of(cluster, job, 0)]
                if name and name != first
            ),
            None,
        ),
    )
    _succeeded(cluster, scheduler, handle, job)
    print(
        f"\n[kubernetes] pod 0 (the rendezvous host) deleted: pod 1 trained alone (world 1)"
        f" {alone_s - deleted_s:.1f}s after the delete, and with the recreated pod 0"
        f" (world 2) {again_s - deleted_s:.1f}s after it"
    )  # (a figure, not a verdict: the lines asserted below say what happened)
    survivor = cluster.pod_log(_pod_of(cluster, job, 1))
    assert "torchx-elastic: the rendezvous host is lost: " in survivor, survivor
    assert "(this node hosts it) and the job re-forms without the lost host" in survivor
    back = cluster.pod_log(_pod_of(cluster, job, 0))
    assert _pod_of(cluster, job, 0) != first
    assert "; this node joins the job there" in back, back
    assert "of world size 2" in back and "rank 1 done" in survivor + back, (back, survivor)


# (how many are "here" counts the roll call, the lost pod's entry too)
STANDING_BY = "torchx-elastic: standing by: the job has its 2 nodes ("
END_FILE = "/tmp/torchx-elastic-test-end"  # examples/timed.py --until-file


def test_a_spare_pod_takes_the_place_of_a_deleted_one(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """-j 2x1 --spares 1: three pods, two train and one stands by (--cpu 0.5: the node's two
    CPUs hold three such pods, not three of --cpu 1), and torchx status says so. A training
    pod other than the rendezvous host is deleted: the spare takes its place at the next
    round, the Job's replacement pod becomes the new spare, and the job succeeds with no pod
    left running. How soon, and when the replacement was scheduled, is printed. The job trains
    until the test tells it to end (a file in the rendezvous host's pod): a fixed time raced
    the replacement's start on a loaded machine, and the late replacement found the job over.
    A node is dropped after 30 s without heartbeats, not the agent's 10 s: on a busy 2-core
    machine a half-CPU pod hosting the rendezvous stalled that long, and the others dropped it
    (what a dropped node says: tests/agent/test_supervisor_units.py, test_waiting_units.py)."""
    handle = cluster.run(
        "-j", "2x1", "--spares", "1", "--cpu", "0.5", "--max_retries", "1", *ONE_THREAD,
        "--rdzv_conf", "keep_alive_max_attempt=15", "--script", "examples/timed.py",
        "--", "--seconds", "600", "--until-file", END_FILE, "--progress",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]

    spare = _wait_in(cluster, job, "a pod to stand by", lambda: _spare_pod(cluster, job))
    _status_once(cluster, handle, "nodes: 2 training, 1 standby", timeout_s=120)
    lost = next(
        n for n in _job_pod_names(cluster, job) if n != spare and not n.startswith(f"{job}-0-")
    )
    stood_by = cluster.pod_log(spare)
    assert " of world size " not in stood_by, stood_by  # it never trained before the loss
    deleted_s = time.time()
    cluster.delete_pod(lost)
    # at whichever attempt: the deleted pod's agent leaves the rendezvous as it stops, and a
    # survivor that sees it gone before its ranks fail re-forms without counting a restart (a
    # membership change), else after counting one (its ranks' failure)
    _wait_in(
        cluster,
        job,
        "the spare to train",
        lambda: _log_has(cluster, spare, "of world size 2, attempt "),
    )
    trained_s = time.time() - deleted_s
    index = lost.split("-")[-2]
    replacement = _wait_in(
        cluster,
        job,
        "the replacement pod",
        lambda: next(
            (
                n
                for n in _job_pod_names(cluster, job)
                if n.startswith(f"{job}-{index}-") and n != lost
            ),
            None,
        ),
    )
    _wait_in(
        cluster,
        job,
        "the replacement to stand by",
        lambda: _log_has(cluster, replacement, STANDING_BY),
    )
    replaced_s = time.time() - deleted_s
    _status_once(cluster, handle, "nodes: 2 training, 1 standby", timeout_s=JOB_TIMEOUT_S)
    _end_the_job(cluster, job)
    logs = _succeeded(cluster, scheduler, handle, job)
    pods = {str(p["metadata"]["name"]): p for p in cluster.pods(job)}
    assert lost not in pods and replacement in pods
    assert {str(p["status"]["phase"]) for p in pods.values()} == {"Succeeded"}, logs
    spare_log = cluster.pod_log(spare)
    assert " of world size 1," not in spare_log, spare_log  # it never trained alone
    assert "stood by as a spare, so this node exits without training" in cluster.pod_log(
        replacement
    )
    assert re.search(
        rf"torchx-elastic: round 2: \S+ \(agent pid \d+\) takes the place of {job}-{index}\S*"
        r" \(agent pid \d+\), lost; the job is back at 2 nodes",
        logs,
    ), logs
    scheduled = next(
        c["lastTransitionTime"]
        for c in pods[replacement]["status"]["conditions"]
        if c["type"] == "PodScheduled"
    )
    # (the API's times are whole seconds, rounded down: the comparison is the stricter for it)
    scheduled_s = calendar.timegm(time.strptime(scheduled, "%Y-%m-%dT%H:%M:%SZ"))
    print(
        f"\n[kubernetes] the spare trained at world 2 {trained_s:.1f}s after the delete;"
        f" the replacement pod was scheduled {scheduled_s - deleted_s:.0f}s after it and"
        f" stood by {replaced_s:.0f}s after it"
    )  # (a figure, not a verdict: "round 2: ... takes the place of" above says the spare did)


def test_a_spare_pod_takes_the_place_of_the_deleted_rendezvous_pod(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """-j 2x1 --spares 1 with torchx's default --max_retries (0: a deleted pod spends no
    retry): pod 0, which hosts the rendezvous (the store), is deleted while it trains. The
    survivor moves the rendezvous to itself, the spare trains with it at world 2 again, and the
    job succeeds. How soon is printed. The job ends as the spare test's does (a file)."""
    handle = cluster.run(
        "-j", "2x1", "--spares", "1", "--cpu", "0.5", *ONE_THREAD,
        "--rdzv_conf", "keep_alive_max_attempt=15", "--script", "examples/timed.py",
        "--", "--seconds", "600", "--until-file", END_FILE, "--progress",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]

    spare = _wait_in(cluster, job, "a pod to stand by", lambda: _spare_pod(cluster, job))
    lost = _pod_of(cluster, job, 0)
    assert lost != spare, "pod 0, the rendezvous host, stands by: nothing to delete here"
    _wait_in(cluster, job, "pod 0 to train", lambda: _log_has(cluster, lost, "of world size 2,"))
    deleted_s = time.time()
    cluster.delete_pod(lost)
    # the figure: from the delete to the spare's first line at world 2 (examples/timed.py's,
    # printed once init_process_group returned), by the log's own times. It includes pod 0's
    # termination (SIGTERM: its agent leaves), the survivor moving the rendezvous to itself,
    # the spare joining it there and both workers starting; not the recreated pod 0's start
    trained_at_s = _wait_in(
        cluster,
        job,
        "the spare to train",
        lambda: cluster.logged_at(spare, "of world size 2, attempt ", deleted_s),
    )
    # the Job recreates pod 0 (its agent exited 143: no retry spent); the job ends only once
    # it found where the rendezvous moved (it then stands by; index 0 must succeed too)
    back = _wait_in(
        cluster,
        job,
        "the recreated pod 0 to join the moved rendezvous",
        lambda: next(
            (
                name
                for name in [_pod_of(cluster, job, 0)]
                if name
                and name != lost
                and _log_has(cluster, name, "; this node joins the job there")
            ),
            None,
        ),
    )
    _end_the_job(cluster, job)
    logs = _succeeded(cluster, scheduler, handle, job)
    pods = {str(p["metadata"]["name"]): p for p in cluster.pods(job)}
    assert lost not in pods and back in pods, logs
    assert {str(p["status"]["phase"]) for p in pods.values()} == {"Succeeded"}, logs
    spare_log = cluster.pod_log(spare)
    assert " of world size 1," not in spare_log, spare_log  # it never trained alone
    back_log = cluster.pod_log(back)
    assert " of world size " not in back_log, back_log  # the recreated pod 0 never trained
    print(
        f"\n[kubernetes] pod 0 (the rendezvous host) deleted: the spare trained at world 2"
        f" {trained_at_s - deleted_s:.1f}s after the delete"
    )  # (a figure, not a verdict)


def _spare_pod(cluster: Cluster, job: str) -> Optional[str]:
    """The pod of the job whose agent stands by (None: none yet)."""
    standing_by = (n for n in _job_pod_names(cluster, job) if _log_has(cluster, n, STANDING_BY))
    return next(standing_by, None)


def _end_the_job(cluster: Cluster, job: str) -> None:
    """The file that ends examples/timed.py --until-file, in every running pod of the job:
    whichever nodes train see it (a pod whose container just ended refuses the exec)."""
    touched = [
        subprocess.run(
            ["kubectl", "exec", str(pod["metadata"]["name"]), "--", "touch", END_FILE],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        for pod in cluster.pods(job)
        if pod["status"]["phase"] == "Running"
    ]
    assert any(t.returncode == 0 for t in touched), [t.stderr for t in touched]


def _world_of_2(cluster: Cluster, job: str, index: int) -> Optional[str]:
    """The name of the job's pod ``index`` once its log shows a world of 2."""
    name = _pod_of(cluster, job, index)
    return name if _log_has(cluster, name, "of world size 2") else None


def test_cancel_while_running(cluster: Cluster, scheduler: KubernetesScheduler) -> None:
    handle = cluster.run(
        "-j", "2x1", "--cpu", "0.5", "--script", "examples/timed.py", "--", "--seconds", "600"
    )
    job = _app_id(handle).partition(":")[2]

    def running() -> Optional[bool]:
        desc = scheduler.describe(_app_id(handle))
        return True if desc is not None and desc.state == AppState.RUNNING else None

    _wait("the job to run", running)
    # while it runs: its Secret, and its NetworkPolicy admitting the job's own pods only (the
    # node's network plugin does not enforce policies: the object is what is checked)
    pods = {"matchLabels": {"app.kubernetes.io/instance": job}}
    assert cluster.network_policies()[job] == {
        "podSelector": pods,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": pods}]}],
    }
    assert job in cluster.secrets()
    log = cluster.torchx("log", f"{handle}/timed/0")
    assert log.returncode == 0, log.stderr
    cancel = cluster.torchx("cancel", handle)
    assert cancel.returncode == 0, cancel.stderr
    _wait("the pods to go", lambda: True if not cluster.pods(job) else None, timeout_s=120)
    assert scheduler.describe(_app_id(handle)) is None and job not in cluster.services()
    # gone with the Job (owned by it)
    _wait(
        "the Secret and NetworkPolicy to go",
        lambda: (
            True if job not in cluster.network_policies() and job not in cluster.secrets() else None
        ),
        timeout_s=120,
    )
    status = cluster.torchx("status", handle)
    assert "does not exist or has been removed" in status.stdout + status.stderr


def test_a_missing_image_says_why_the_job_waits(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    result = cluster.torchx(
        "run", "--workspace", "", "-s", "kubernetes", "dist.ddp", "-j", "2x1", "--cpu", "0.5",
        "--image", "torchx-elastic-e2e:no-such-tag", "--script", "examples/main.py",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    handle = result.stdout.strip().splitlines()[-1]

    def pull_error() -> Optional[str]:
        desc = scheduler.describe(_app_id(handle))
        assert desc is not None
        pulling = "ErrImagePull" in desc.msg or "ImagePullBackOff" in desc.msg
        return desc.msg if pulling and desc.state == AppState.PENDING else None

    _wait("the pull error in the status", pull_error, timeout_s=120)
    status = cluster.torchx("status", handle)
    assert "State: PENDING" in status.stdout and "torchx-elastic-e2e:no-such-tag" in status.stdout
    # torchx's log of a whole app waits for it to start: one replica's says why it does not
    log = cluster.torchx("log", f"{handle}/main/0")
    _no_traceback(log)
    assert log.returncode == 0
    assert "has not started: " in log.stdout and "no-such-tag" in log.stdout, log.stdout
    assert cluster.torchx("cancel", handle).returncode == 0


def test_status_shows_the_progress_of_the_whole_job(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """The rank-0 agent's job-wide line, read from replica 0's pod log by torchx status."""
    handle = cluster.run(
        "-j", "2x2", "--cpu", "0.5", "--memMB", "1500", "--script", "examples/progress.py",
        "--", "--steps", "100000", "--step-s", "0.02", "--log-every", "100000",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]
    progress = re.compile(
        r"progress (\d+)/100000 \([\d.]+%\) of 4/4 ranks, [\d.]+ steps/s, ETA \w+"
        rf" \(as of \w+ ago, log of pod {re.escape(job)}-0-\w+\)"
    )
    steps: List[int] = []

    def more_progress() -> Optional[bool]:
        status = cluster.torchx("status", handle)
        assert "State: FAILED" not in status.stdout, status.stdout
        match = progress.search(status.stdout)
        if match and (not steps or int(match[1]) > steps[-1]):
            steps.append(int(match[1]))
        return True if len(steps) >= 2 else None

    _wait("two growing progress figures in torchx status", more_progress)
    assert "State: RUNNING" in cluster.torchx("status", handle).stdout
    assert cluster.torchx("cancel", handle).returncode == 0


# a shorter last call for the nodes beyond MIN: seconds of CI time, same behaviour
SHORT_LAST_CALL = ("--rdzv_conf", "last_call_timeout=5")
# a worker with torch's default threads (the node's 2 CPUs) under a 1-CPU limit starves its
# agent's rendezvous store (seen: its keep-alive timed out, a joining pod's handshake too)
ONE_THREAD = ("--env", "OMP_NUM_THREADS=1")
# `--cpu 1` requests 900m (torchx's reservation of 100m is taken off the limit)
POD_MILLICPU = 900


def _pod_outcomes(cluster: Cluster, job: str) -> List[str]:
    """Each pod of a job: name, phase, exit code and the start of its termination message."""
    outcomes = []
    for pod in cluster.pods(job):
        name = pod["metadata"]["name"]
        state: Dict[str, Any] = {}
        for container in pod["status"].get("containerStatuses") or []:
            state = container.get("state", {}).get("terminated") or {}
        outcomes.append(
            f"{name} {pod['status'].get('phase')} rc={state.get('exitCode')}"
            f" {str(state.get('message', ''))[:300]!r}"
        )
    return outcomes


def test_an_elastic_job_ends_when_its_training_ends(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """-j 1:3x1 --cpu 1 on a node with room for two such pods: pod 0 and one more train;
    the Job succeeds when they are done, and the third pod never trains."""
    assert _idle_millicpu(cluster) < 3 * POD_MILLICPU, "the node fits three pods: no late pod"
    handle = cluster.run(
        "-j", "1:3x1", "--cpu", "1", *SHORT_LAST_CALL, "--script", "examples/timed.py",
        "--", "--seconds", "10",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]
    _wait("the training to end", lambda: _log_has(cluster, _pod_of(cluster, job, 0), "rank 0 done"))
    trained = time.monotonic()
    state = _wait_done(scheduler, handle)  # (how soon after the training is a speed: bench/)
    ended_s = time.monotonic() - trained
    status = cluster.torchx("status", handle)
    assert state == AppState.SUCCEEDED, (status.stdout, _pod_outcomes(cluster, job))
    assert "State: SUCCEEDED" in status.stdout, status.stdout
    logs = {
        p["metadata"]["name"]: cluster.pod_log(p["metadata"]["name"]) for p in cluster.pods(job)
    }
    trained_pods = [name for name, log in logs.items() if "of world size 2" in log]
    assert len(trained_pods) == 2 and trained_pods[0].startswith(f"{job}-0-"), logs
    # the third pod was removed before it could train (pending, starting, or at the closed
    # rendezvous, which it leaves saying the job has finished)
    for name, log in logs.items():
        assert name in trained_pods or "world size" not in log, (name, log)

    # the third pod is gone (removed by the Job controller), ended by itself (the agent that
    # met the closed rendezvous, or its host going away, exits 0 saying so), or was still
    # waiting when the Job controller stopped it as the job succeeded (SIGTERM: its agent
    # says so and exits 143; CI once saw it so, its pod Failed until the controller removes it)
    def settled() -> Optional[List[str]]:
        phases = [p["status"].get("phase") for p in cluster.pods(job)]
        return _pod_outcomes(cluster, job) if not {"Pending", "Running"} & set(phases) else None

    outcomes = _wait("no pod of the job left pending or running", settled, 90)
    print("elastic end:", f"SUCCEEDED {ended_s:.1f} s after the training;", outcomes)
    for outcome in outcomes:
        assert " Failed " not in outcome or " Failed rc=143 " in outcome, outcomes


def _idle_millicpu(cluster: Cluster) -> int:
    """The node's CPU, once the pods of the tests before (terminating ones too) are gone."""
    allocatable = cluster.allocatable_millicpu()
    _wait(
        "the node to be idle",
        lambda: True if cluster.free_millicpu() == allocatable else None,
        timeout_s=120,
    )
    return allocatable


def _job_pod_names(cluster: Cluster, job: str) -> List[str]:
    return [str(p["metadata"]["name"]) for p in cluster.pods(job)]


def _pod_of(cluster: Cluster, job: str, index: int) -> str:
    names = _job_pod_names(cluster, job)
    return next((n for n in names if n.startswith(f"{job}-{index}-")), "")


def test_status_says_how_many_nodes_joined_while_a_pod_finds_no_room(
    cluster: Cluster,
) -> None:
    """-j 3x1 --cpu 1 on a node with room for two such pods: the two that run wait for the
    third, and torchx status says so (replica 0's waiting line); cancelled, its pods go."""
    assert _idle_millicpu(cluster) < 3 * POD_MILLICPU, "the node fits three pods: none waits"
    handle = cluster.run("-j", "3x1", "--cpu", "1", "--script", "examples/main.py")
    job = _app_id(handle).partition(":")[2]
    waiting = re.compile(
        r"waiting for nodes: 2 of 3 joined; here: .+; missing: 1 node; hosting the rendezvous"
        rf" at \S+:\d+, run id .+ \(as of \w+ ago, log of pod {re.escape(job)}-0-"
    )
    started = time.monotonic()
    try:

        def says_waiting() -> Optional[str]:
            status = cluster.torchx("status", handle)
            assert "State: FAILED" not in status.stdout, status.stdout
            return status.stdout if waiting.search(status.stdout) else None

        status = _wait("the waiting state in torchx status", says_waiting, timeout_s=120)
        print(f"waiting state in torchx status after {time.monotonic() - started:.0f} s")
        assert "Unschedulable" in status, status
    finally:
        assert cluster.torchx("cancel", handle).returncode == 0
        _wait("the pods to go", lambda: True if not cluster.pods(job) else None, timeout_s=120)


def test_a_failing_elastic_job_still_fails_with_its_root_cause(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    handle = cluster.run(
        "-j", "1:2x1", "--cpu", "0.5", *SHORT_LAST_CALL, "--script", "examples/timed.py",
        "--", "--seconds", "30", "--crash-rank", "0", "--crash-after-s", "1",
    )  # fmt: skip
    assert _wait_done(scheduler, handle) == AppState.FAILED
    status = cluster.torchx("status", handle)
    assert "State: FAILED" in status.stdout, status.stdout
    assert "failed first: CrashOnPurpose: rank 0 crashes on purpose" in status.stdout, status.stdout


def test_a_late_pod_joins_a_running_elastic_job_at_the_next_round(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """-j 1:2x1 on a node with room for one pod: pod 0 trains alone; room is freed, pod 1
    starts, joins at the next round, and the world grows to 2."""
    blocker = f"room-{os.getpid()}"
    room = _idle_millicpu(cluster) - (POD_MILLICPU + 100)  # one pod fits, not two
    cluster.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": blocker},
            "spec": {
                "containers": [
                    {
                        "name": "sleep",
                        "image": NODE_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "600"],
                        "resources": {"requests": {"cpu": f"{room}m"}},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
    )
    try:
        handle = cluster.run(
            "-j", "1:2x1", "--cpu", "1", *SHORT_LAST_CALL, *ONE_THREAD,
            "--script", "examples/timed.py", "--", "--seconds", "10", "--seconds-alone", "240",
        )  # fmt: skip
        job = _app_id(handle).partition(":")[2]
        _wait(
            "pod 0 to train alone",
            lambda: _log_has(cluster, _pod_of(cluster, job, 0), "of world size 1"),
        )
        pending = [p for p in cluster.pods(job) if p["status"]["phase"] == "Pending"]
        assert [p["metadata"]["name"] for p in pending] == [_pod_of(cluster, job, 1)]
    finally:
        cluster.delete_pod(blocker)
    try:
        _wait(
            "the world to grow",
            lambda: _log_has(cluster, _pod_of(cluster, job, 0), "world size 2"),
        )
    except AssertionError as err:  # what each pod's agent said decides where to look
        logs = [f"{name}:\n{cluster.pod_log(name)}" for name in _job_pod_names(cluster, job)]
        raise AssertionError("\n".join([str(err), *logs])) from None
    if _wait_done(scheduler, handle) != AppState.SUCCEEDED:  # the status, then what each said
        logs = [f"{name}:\n{cluster.pod_log(name)}" for name in _job_pod_names(cluster, job)]
        raise AssertionError("\n".join([cluster.torchx("status", handle).stdout, *logs]))
    first, second = (
        cluster.pod_log(_pod_of(cluster, job, 0)),
        cluster.pod_log(_pod_of(cluster, job, 1)),
    )
    assert "of world size 2" in first and "of world size 2" in second, (first, second)
    assert "rank 0 done" in first + second and "rank 1 done" in first + second, (first, second)


DOC = REPO / "docs" / "kubernetes.md"
DOC_IMAGE = "torchx-elastic:latest"


def doc_command_blocks() -> List[List[str]]:
    """The commands of the fenced blocks of docs/kubernetes.md, one per (continued) line,
    without their comments; a block marked with another language (```text) is no command."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", DOC.read_text(), re.S | re.M)
    commands = []
    for language, block in blocks:
        if language not in ("", "sh", "bash", "console"):
            continue
        joined = re.sub(r"\\\n\s*", "", block)
        lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
        commands.append([line for line in lines if line])
    return commands


def test_the_docs_commands_run_as_written(cluster: Cluster) -> None:
    """Each fenced block of docs/kubernetes.md in a shell, as a reader types it: the app
    handle that `torchx run` prints replaces the doc's ``main-xxxxxxxx``."""
    blocks = doc_command_blocks()
    assert len(blocks) == 2 and all(b[0].startswith(("torchx run", "kubectl")) for b in blocks)
    env = {**cluster.env, "PATH": f"{Path(TORCHX).parent}:{cluster.env['PATH']}"}
    for commands in blocks:
        handle = ""
        for command in commands:
            command = command.replace(DOC_IMAGE, SOURCE_IMAGE)
            if handle:
                command = re.sub(r"kubernetes://torchx/[\w-]+:main-x{8}", handle, command)
            result = subprocess.run(
                ["bash", "-c", command], env=env, cwd=cluster.workdir,
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert result.returncode == 0, (command, result.stdout, result.stderr)
            assert "Traceback" not in result.stderr, (command, result.stderr)
            if command.startswith("torchx run"):
                handle = result.stdout.strip().splitlines()[-1]
                assert re.fullmatch(r"kubernetes://torchx/[\w-]+:main-\w{8}", handle), handle
            if command.startswith("torchx status"):
                assert "State: " in result.stdout, result.stdout
            if command.startswith("torchx log") and "--tail" in command:
                assert "world size" in result.stdout, result.stdout


def _run_2x1(cluster: Cluster, cfg: str, *run_args: str) -> subprocess.CompletedProcess[str]:
    """``torchx run -cfg CFG RUN_ARGS dist.ddp -j 2x1`` of examples/main.py."""
    return cluster.torchx(
        "run", "--workspace", "", "-s", "kubernetes", "-cfg", cfg, *run_args,
        "dist.ddp", "--image", NODE_IMAGE, "-j", "2x1", "--cpu", "0.5",
        "--script", "examples/main.py",
    )  # fmt: skip


def _status_once(cluster: Cluster, handle: str, text: str, timeout_s: float) -> str:
    """``torchx status`` once it says ``text``; when it never does, the failure shows what it
    said last and the tail of each of the job's pods' logs."""
    said = [""]

    def says() -> Optional[str]:
        said[0] = cluster.torchx("status", handle).stdout
        return said[0] if text in said[0] else None

    try:
        return _wait(f"{text!r} in torchx status", says, timeout_s=timeout_s)
    except AssertionError as err:
        job = _app_id(handle).partition(":")[2]
        tails = "".join(
            f"\n--- log of {name} (its last 40 lines):\n"
            + "\n".join(cluster.pod_log(name).splitlines()[-40:])
            for name in _job_pod_names(cluster, job)
        )
        raise AssertionError(f"{err}\ntorchx status said last:\n{said[0]}{tails}") from None


def _refused_status(cluster: Cluster, submitted: subprocess.CompletedProcess[str]) -> str:
    """The FAILED status of a refused job: ``torchx run`` prints the app's status once after
    submitting, which may already say it (the Job is then deleted), else ``torchx status``."""
    assert submitted.returncode == 0, submitted.stderr
    if "State: FAILED" in submitted.stderr:
        status = submitted.stderr
    else:
        status = _status_once(
            cluster, submitted.stdout.strip().splitlines()[-1], "State: FAILED", 30
        )
    gone = cluster.torchx("status", submitted.stdout.strip().splitlines()[-1])
    assert "does not exist" in gone.stdout + gone.stderr  # not left behind
    return status


def test_a_job_succeeds_in_a_namespace_that_enforces_pod_security_restricted(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    cluster.namespace("restricted", labels="pod-security.kubernetes.io/enforce=restricted")
    result = _run_2x1(cluster, "namespace=restricted")
    assert result.returncode == 0, result.stderr
    handle = result.stdout.strip().splitlines()[-1]
    # the same job as root is refused there, says why, and is not left behind
    status = _refused_status(cluster, _run_2x1(cluster, "namespace=restricted,run_as_root=True"))
    assert 'violates PodSecurity "restricted:latest"' in status, status
    assert "runAsNonRoot != true" in status and "The Job was deleted" in status, status
    assert _wait_done(scheduler, handle) == AppState.SUCCEEDED


QUOTA = """
apiVersion: v1
kind: ResourceQuota
metadata: {name: small}
spec: {hard: {limits.cpu: 200m}}
"""


def test_a_job_refused_by_a_resource_quota_says_so_and_ends_wait(cluster: Cluster) -> None:
    cluster.namespace("quota", QUOTA)
    _wait(
        "the quota controller to count the namespace",
        lambda: True if "limits.cpu" in cluster.kubectl("get", "quota", "small", "-n", "quota",
                                                         "-o", "jsonpath={.status.hard}") else None,
        timeout_s=120,
    )  # fmt: skip
    status = _refused_status(cluster, _run_2x1(cluster, "namespace=quota"))
    assert "the cluster refused to create the job's pods: pods " in status, status
    assert "is forbidden: exceeded quota: small" in status, status
    # the wait ends with the refusal (not after the CLI's timeout, which would raise)
    waited = _run_2x1(cluster, "namespace=quota", "--wait")
    assert waited.returncode != 0, waited.stdout
    assert "exceeded quota: small" in waited.stdout + waited.stderr, waited.stdout
    assert "Traceback" not in waited.stderr, waited.stderr


def test_a_suspended_job_waits_for_kueue_and_runs_once_admitted(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """Created suspended with a queue label, as Kueue's webhook leaves it; Kueue admits it
    by setting spec.suspend to false."""
    app = ddp(script="examples/main.py", j="2x1", cpu=0.5, image=NODE_IMAGE)
    info = scheduler.submit_dryrun(app, {"queue": "team-q"})
    info.request.manifests[0]["spec"]["suspend"] = True
    handle = f"kubernetes://torchx/{scheduler.schedule(info)}"
    job = _app_id(handle).partition(":")[2]
    status = _status_once(cluster, handle, "State: PENDING", timeout_s=120)
    assert "suspended, waiting for admission by Kueue queue team-q" in status, status
    assert cluster.pods(job) == []
    cluster.kubectl("patch", "job", job, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    assert _wait_done(scheduler, handle) == AppState.SUCCEEDED


FT_STEP = re.compile(r"group (\d) step (\d+) quorum (\d+) loss \S+ t ([0-9.]+)")
FT_STEPS = 300  # about 45 s: group 0 still trains when group 1 is back


def _ft_steps(log: str, group: int) -> List[tuple[int, int, float]]:
    """(step, quorum size, time) of each step a group's rank 0 committed, from its log."""
    found = [m for m in FT_STEP.finditer(log) if int(m[1]) == group]
    return [(int(m[2]), int(m[3]), float(m[4])) for m in found]


def test_ft_ddp_a_deleted_group_pod_is_replaced_while_the_other_group_trains(
    cluster: Cluster, scheduler: KubernetesScheduler
) -> None:
    """ft.ddp, 2 groups x (1x2) with 1-CPU pods and a small Lighthouse pod: one Indexed Job
    per role. Group 1's pod is deleted mid-run: its Job replaces it, group 0's pod trains
    on (never replaced, its steps never go back), torchx status shows group 1 recovering
    then training, group 1 rejoins, SUCCEEDED."""
    handle = cluster.run(
        "--replica_groups", "2", "-j", "1x2", "--cpu", "1", "--max_retries", "2",
        "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000",
        "--script", "examples/ft_ddp.py", "--", "--steps", str(FT_STEPS), "--step-s", "0.1",
        component="ft.ddp", cfg="reserved_millicpu=200",
    )  # fmt: skip
    job = _app_id(handle).partition(":")[2]

    def group_pod(group: int) -> str:
        """The newest pod of a group."""
        names = [str(p["metadata"]["name"]) for p in cluster.pods(job)]
        return ([n for n in names if n.startswith(f"{job}-group{group}-0-")] or [""])[-1]

    def joint_steps() -> Optional[str]:
        pod = group_pod(1)
        steps = _ft_steps(cluster.pod_log(pod), 1) if pod else []
        return pod if sum(q == 2 for _, q, _ in steps) >= 5 else None

    lost = _wait("group 1 to train in a quorum of both groups", joint_steps)
    group0_pod = group_pod(0)
    status = cluster.torchx("status", handle)
    assert "State: RUNNING" in status.stdout, status.stdout
    for group in (0, 1):  # in the Lighthouse pod's last quorum line
        assert re.search(rf"group{group}: RUNNING; training \(in quorum \d+\)", status.stdout), (
            status.stdout
        )
    assert "last quorum " in status.stdout, status.stdout
    deleted_at = time.time()
    cluster.delete_pod(lost)
    # the Lighthouse drops group 1 from the quorum after its heartbeat timeout (1 s)
    app_id = _app_id(handle)

    def recovering() -> Optional[str]:
        desc = scheduler.describe(app_id)
        msg = desc.msg if desc is not None else ""
        found = re.search(r"^group1: \w+, 1 restart\(s\); recovering \(not in quorum", msg, re.M)
        return msg if found else None

    said = _wait("torchx status to show group 1 recovering", recovering)
    assert re.search(r"group0: RUNNING; training \(in quorum \d+\)", said), said
    state = _wait_done(scheduler, handle)
    status = cluster.torchx("status", handle)
    assert state == AppState.SUCCEEDED, (status.stdout, _pod_outcomes(cluster, job))
    assert "State: SUCCEEDED" in status.stdout, status.stdout
    # group 1's Job replaced its pod; group 0's pod is the same one, never restarted
    assert "group1: SUCCEEDED, 1 restart(s)" in status.stdout, status.stdout
    assert "group0: SUCCEEDED" in status.stdout, status.stdout
    assert "group0: SUCCEEDED," not in status.stdout, status.stdout  # no restart
    assert group_pod(0) == group0_pod and group_pod(1) != lost
    group0 = _ft_steps(cluster.pod_log(group0_pod), 0)
    steps = [step for step, _, _ in group0]
    assert steps == list(range(steps[0], FT_STEPS + 1)), steps
    group1 = _ft_steps(cluster.pod_log(group_pod(1)), 1)
    assert group1 and group1[-1][0] == FT_STEPS and group1[-1][1] == 2, group1
    # group 0 trained on while group 1 was being replaced
    back_at = group1[0][2]
    while_down = [step for step, _, t in group0 if deleted_at < t < back_at]
    print(
        f"group 1's pod replaced and back in {back_at - deleted_at:.1f} s (deletion to its"
        f" first committed step); group 0 committed {len(while_down)} steps meanwhile"
    )
    assert while_down, (group0, group1)
