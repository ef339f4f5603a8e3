"""The compiled KFP training step on the real node (``../shared/k8s/cluster.sh``), run as the
pipeline engine runs it: a pod with the step's image and command (KFP's placeholders filled
in as its launcher fills them) and a service account bound to ``docs/pipelines-role.yaml``.

The cluster, its image and its lock come from ``tests/kubernetes/test_real_node.py``'s
fixture. What this one node lacks for a pod to reach the API server as a pod of a real
cluster would, the step pod is given by hand: no kube-proxy (the ``kubernetes`` Service does
not route: the pod uses the host's network and ``KUBERNETES_SERVICE_HOST=127.0.0.1``), and
an empty root CA ConfigMap (its kubeconfig skips TLS verification: the pod's service-account
volume is written out, the same token, namespace and path, with the API server's own CA).
Its API server authorizes every request (``AlwaysAllow``): that the Role grants what a step
does is checked against the fake API server (``test_step_units.py``).
"""

# ruff: noqa: F811  (the fixture `cluster` is imported, and named by the tests that use it)
from __future__ import annotations

import json
import re
import subprocess
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml

from tests.kubernetes.test_real_node import (  # noqa: F401  (cluster: a fixture)
    NODE_IMAGE,
    Cluster,
    _wait,
    cluster,
)
from tests.kubernetes.validation import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEP_YAML = REPO / "tests" / "pipelines" / "golden" / "real_node_step.yaml"
ROLE = REPO / "docs" / "pipelines-role.yaml"
SERVICE_ACCOUNT = "torchx-elastic-step"
CA_CONFIG_MAP = "torchx-elastic-step-ca"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
INPUT = re.compile(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}")
OUTPUT_FILE = re.compile(r"\{\{\$\.outputs\.parameters\['(\w+)'\]\.output_file\}\}")
STEP_TIMEOUT_S = 240.0


def _kubectl(cluster: Cluster, *args: str, stdin: str = "") -> str:
    result = subprocess.run(
        ["kubectl", *args], input=stdin, env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _api_server(cluster: Cluster) -> Tuple[str, str]:
    with open(cluster.env["KUBECONFIG"]) as f:
        config = yaml.safe_load(f)
    host, _, port = (
        config["clusters"][0]["cluster"]["server"].removeprefix("https://").partition(":")
    )
    return host, port


def _api_server_ca(host: str, port: str) -> str:
    """The certificates the API server presents (its own CA among them)."""
    shown = subprocess.run(
        ["openssl", "s_client", "-showcerts", "-connect", f"{host}:{port}"],
        input="", capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    certs = re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", shown, re.S)
    assert certs, shown
    return "".join(certs)


@pytest.fixture(scope="module")
def step_account(cluster: Cluster) -> Tuple[str, str]:
    """The documented Role, its binding and service account; the API server's address."""
    _kubectl(cluster, "apply", "-f", str(ROLE))
    host, port = _api_server(cluster)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CA_CONFIG_MAP, "namespace": "default"},
        "data": {"ca.crt": _api_server_ca(host, port)},
    }
    _kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(config_map))
    return host, port


def _step_container(values: Dict[str, str]) -> Tuple[str, List[str]]:
    """The training step's image and command from the compiled pipeline, its placeholders
    filled in as KFP's launcher fills them."""
    spec = yaml.safe_load(STEP_YAML.read_text())
    container = spec["deploymentSpec"]["executors"]["exec-train"]["container"]

    def resolve(arg: str) -> str:
        arg = INPUT.sub(lambda m: values[m[1]], arg)
        return OUTPUT_FILE.sub(lambda m: f"/tmp/outputs/{m[1]}/data", arg)

    return container["image"], [resolve(arg) for arg in container["command"]]


def _start_step(cluster: Cluster, api: Tuple[str, str], name: str, **values: str) -> None:
    image, command = _step_container(values)
    host, port = api
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,  # mounted below, with a CA that works
            "hostNetwork": True,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "env": [
                        {"name": "KUBERNETES_SERVICE_HOST", "value": host},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
                    ],
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    "volumeMounts": [{"name": "sa", "mountPath": TOKEN_DIR, "readOnly": True}],
                }
            ],
            "volumes": [
                {
                    "name": "sa",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token"}},
                            {"configMap": {"name": CA_CONFIG_MAP}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ]
                    },
                }
            ],
        },
    }
    _kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(pod))


def _phase(cluster: Cluster, name: str) -> Dict[str, Any]:
    found = cluster.core().read_namespaced_pod(name, "default", _preload_content=False)
    return dict(json.loads(found.data)["status"])


def _ended(cluster: Cluster, name: str) -> Tuple[str, str]:
    """(phase, log) of a step pod once it ended."""

    def done() -> Optional[str]:
        phase = str(_phase(cluster, name).get("phase"))
        return phase if phase in ("Succeeded", "Failed") else None

    phase = _wait(f"step pod {name} to end", done, timeout_s=STEP_TIMEOUT_S)
    return phase, _log(cluster, name)


def _log(cluster: Cluster, name: str) -> str:
    from kubernetes.client.rest import ApiException

    try:
        found = cluster.core().read_namespaced_pod_log(name, "default", _preload_content=False)
    except ApiException:
        return ""  # not started yet
    return str(found.data.decode("utf-8", "replace"))


def _job_exists(cluster: Cluster, job: str) -> bool:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    batch = client.BatchV1Api(cluster.core().api_client)
    try:
        batch.read_namespaced_job(job, "default", _preload_content=False)
    except ApiException as e:
        assert e.status == 404, e
        return False
    return True


def _submitted_job(log: str) -> Optional[str]:
    match = re.search(r"torchx-elastic: submitted kubernetes://torchx/default:(\S+)", log)
    return match[1] if match else None


def test_the_step_streams_every_rank_and_succeeds(
    cluster: Cluster,
    step_account: Tuple[str, str],
) -> None:
    _start_step(cluster, step_account, "step-ok", seconds="8", crash_rank="-1")
    phase, log = _ended(cluster, "step-ok")
    assert phase == "Succeeded", log
    job = _submitted_job(log)
    assert job is not None, log
    for rank in (0, 1):  # the rendezvous places each rank on either node
        assert re.search(
            rf"^timed/[01] \[n[01] r{rank}\] rank {rank} of world size 2, attempt 0$", log, re.M
        ), log
        assert re.search(
            rf"^timed/[01] \[n[01] r{rank}\] rank {rank} done: \d+ steps", log, re.M
        ), log
    assert log.rstrip().endswith(f"torchx-elastic: kubernetes://torchx/default:{job} SUCCEEDED")


def test_a_rank_that_raises_fails_the_step_with_its_traceback(
    cluster: Cluster,
    step_account: Tuple[str, str],
) -> None:
    _start_step(cluster, step_account, "step-crash", seconds="60", crash_rank="1")
    phase, log = _ended(cluster, "step-crash")
    assert phase == "Failed", log
    state = _phase(cluster, "step-crash")["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 1
    assert "Traceback (most recent call last)" in log, log
    assert "CrashOnPurpose: rank 1 crashes on purpose" in log, log
    end = log.rpartition(" FAILED: ")[2]
    assert "rank 1 crashes on purpose" in end, log


def test_deleting_the_step_pod_leaves_no_job_behind(
    cluster: Cluster,
    step_account: Tuple[str, str],
) -> None:
    _start_step(cluster, step_account, "step-deleted", seconds="600", crash_rank="-1")

    def training() -> Optional[str]:
        log = _log(cluster, "step-deleted")
        both = all(f"rank {rank} of world size 2" in log for rank in (0, 1))
        return _submitted_job(log) if both else None

    job = _wait("both ranks to train", training, timeout_s=STEP_TIMEOUT_S)
    assert _job_exists(cluster, job)
    # SIGTERM, then a grace period: the step deletes its job in it (after it, a SIGKILL
    # would leave the job behind, and this wait would time out)
    cluster.delete_pod("step-deleted")
    _wait("the step to delete its job", lambda: None if _job_exists(cluster, job) else True)
    _wait("the job's pods to go", lambda: True if not cluster.pods(job) else None, timeout_s=120)
    assert job not in cluster.services()
