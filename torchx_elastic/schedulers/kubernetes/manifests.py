"""Request building: the Kubernetes objects of one app, as plain dicts.

- ``job`` backend: a ``batch/v1`` Job in Indexed completion mode plus a headless Service.
  Each pod's hostname is ``<job>-<index>`` (set by the Job controller) and its subdomain
  the Service, so pod 0 answers at ``<job>-0.<service>.<namespace>.svc`` from the moment
  it has an address (the Service publishes not-ready addresses).
- ``volcano`` backend: a ``batch.volcano.sh/v1alpha1`` Job laid out like torchx's own
  (one task per replica), gang-scheduled on the first ``min_replicas`` tasks.
"""

from __future__ import annotations

import signal
from typing import Dict, List, Mapping, Sequence

import torchx
from torchx.specs import AppDef, Role, macros

from torchx_elastic.contract import ERROR_FILE_ENV, RANK0_ENV
from torchx_elastic.schedulers.compat import torchx_kubernetes
from torchx_elastic.schedulers.kubernetes import job_access
from torchx_elastic.schedulers.kubernetes.names import JobNames
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions
from torchx_elastic.schedulers.kubernetes.pods import Manifest, pod_template
from torchx_elastic.schedulers.names import dns_label

# the agent's exit code when a signal stopped it (its pod deleted): 143
AGENT_STOPPED_EXIT_CODE = 128 + int(signal.SIGTERM)

MANAGED_BY = "torchx-elastic"
MANAGED_BY_SELECTOR = f"{torchx_kubernetes.LABEL_ORGANIZATION}={MANAGED_BY}"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's partial admission: admit the Job with fewer pods, down to this many
ANNOTATION_KUEUE_MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
ANNOTATION_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
REPLICA_ID_ENV = "TORCHX_REPLICA_ID"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
DEFAULT_VOLCANO_QUEUE = "default"
VOLCANO_TASK_MAX = 20

# left by the macro step where each pod's own index goes; replaced after escaping
_REPLICA_MARKER = "\x00replica_id\x00"


def labels(app: AppDef, role: Role, role_index: int, names: JobNames) -> Dict[str, str]:
    """torchx's labels (so torchx's tools recognise the pods), with valid label values."""
    app_label = dns_label(app.name)
    return {
        torchx_kubernetes.LABEL_VERSION: torchx.__version__,
        torchx_kubernetes.LABEL_APP_NAME: app_label,
        torchx_kubernetes.LABEL_ROLE_INDEX: str(role_index),
        torchx_kubernetes.LABEL_ROLE_NAME: dns_label(role.name, fallback="worker"),
        torchx_kubernetes.LABEL_KUBE_APP_NAME: app_label,
        torchx_kubernetes.LABEL_ORGANIZATION: MANAGED_BY,
        torchx_kubernetes.LABEL_UNIQUE_NAME: names.job,
    }


def selector(names: JobNames) -> str:
    """The label selector of every object of one job."""
    return f"{torchx_kubernetes.LABEL_UNIQUE_NAME}={names.job}"


def _only_role(app: AppDef) -> Role:
    if len(app.roles) != 1:
        role_names = ", ".join(role.name for role in app.roles)
        raise ValueError(
            f"the kubernetes job backend runs apps of one role; {app.name!r} has"
            f" {len(app.roles)} ({role_names}): use -cfg backend=volcano"
        )
    return app.roles[0]


def indexed_job(app: AppDef, options: KubernetesOptions, names: JobNames) -> List[Manifest]:
    """The Indexed Job and its headless Service."""
    role = _only_role(app)
    job = role_job(app, role, 0, options, names, names.job)
    access = job_access.manifests(names, labels(app, role, 0, names), options.network_policy)
    return [job, headless_service(labels(app, role, 0, names), role.port_map, names), *access]


def role_job(
    app: AppDef,
    role: Role,
    role_index: int,
    options: KubernetesOptions,
    names: JobNames,
    job_name: str,
    more_env: Sequence[Manifest] = (),
) -> Manifest:
    """The Indexed Job named ``job_name`` of one role: its pods behind the app's headless
    Service (``names.service``); ``TORCHX_RANK0_HOST`` names pod 0 of the Job ``names.job``."""
    rank0_host = names.pod_host(f"{names.job}-0")
    values = macros.Values(
        img_root="", app_id=names.app_id, replica_id=_REPLICA_MARKER, rank0_env=RANK0_ENV
    )
    job_labels = labels(app, role, role_index, names)
    if options.queue:
        job_labels[LABEL_KUEUE_QUEUE] = options.queue
    template = pod_template(
        values.apply(role),
        options,
        labels(app, role, role_index, names),
        first_env=[
            {
                "name": REPLICA_ID_ENV,
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{ANNOTATION_COMPLETION_INDEX}']"
                    }
                },
            },
            {"name": RANK0_ENV, "value": rank0_host},
            # the agent writes the root cause there: the pod's status keeps it
            {"name": ERROR_FILE_ENV, "value": TERMINATION_MESSAGE_PATH},
            job_access.secret_env(names),
            *more_env,
        ],
        placeholders={_REPLICA_MARKER: f"$({REPLICA_ID_ENV})"},
    )
    template["spec"]["subdomain"] = names.service
    metadata: Manifest = {"name": job_name, "namespace": names.namespace, "labels": job_labels}
    min_replicas = role.min_replicas or role.num_replicas
    if options.queue and min_replicas < role.num_replicas:
        metadata["annotations"] = {ANNOTATION_KUEUE_MIN_PARALLELISM: str(min_replicas)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "completionMode": "Indexed",
            "completions": role.num_replicas,
            "parallelism": role.num_replicas,
            **retry_policy(role.max_retries),
            **success_policy(min_replicas, role.num_replicas),
            "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
            "template": template,
        },
    }


def headless_service(
    service_labels: Dict[str, str], port_map: Mapping[str, int], names: JobNames
) -> Manifest:
    """The app's headless Service: every pod of the app (its roles' Jobs) by DNS name."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service,
            "namespace": names.namespace,
            "labels": service_labels,
        },
        "spec": {
            "clusterIP": "None",
            # pod 0's name resolves as soon as it has an address, before it is ready
            "publishNotReadyAddresses": True,
            "selector": {torchx_kubernetes.LABEL_UNIQUE_NAME: names.job},
            "ports": [
                {"name": dns_label(name, 15, fallback="port"), "port": port, "targetPort": port}
                for name, port in port_map.items()
            ],
        },
    }


def retry_policy(max_retries: int) -> Manifest:
    """``max_retries`` as attempts of the job, whatever number of pods one failure fails.

    When a rank fails for good, every node exits non-zero: counted per pod (``backoffLimit``)
    one failure would use up as many retries as the job has nodes. Counted per index, each
    node may be replaced ``max_retries`` times. The Job ends when every index has succeeded
    or is out of retries (no ``maxFailedIndexes``): the Job controller then never deletes a
    pod that is still writing its root-cause report. A lost node is not the job's failure: a
    pod lost to a disruption (eviction, preemption, a drained node: a ``DisruptionTarget``
    condition) or stopped from outside (``kubectl delete pod``: no condition, but its agent
    exits 128 + SIGTERM, which it does only when stopped) is replaced without counting, so
    spares work with torchx's default ``--max_retries 0``. Servers without per-index limits:
    :func:`for_server`.
    """
    return {
        "backoffLimitPerIndex": max_retries,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
                {
                    "action": "Ignore",
                    "onExitCodes": {"operator": "In", "values": [AGENT_STOPPED_EXIT_CODE]},
                    "onPodConditions": [],  # required by servers before 1.31
                },
            ]
        },
    }


def success_policy(min_nodes: int, max_nodes: int) -> Manifest:
    """An elastic job succeeds when its worker group has, whatever number of nodes took part.

    Index 0 hosts the rendezvous, so it takes part in every round, and its agent exits 0
    only once the group succeeded and every node of the last round passed the exit barrier.
    The Job then succeeds at once and the Job controller removes the pods still pending or
    joining (they never train: a late agent finds the rendezvous closed and exits 0). Without
    it an Indexed Job waits for every index, and a pod that found no room until the others
    ended would wait for a rendezvous host that is gone. A job of a fixed size needs none:
    every index takes part. Servers before 1.31: :func:`for_server`.
    """
    if min_nodes >= max_nodes:
        return {}
    return {"successPolicy": {"rules": [{"succeededIndexes": "0"}]}}


# the first Kubernetes minor version whose Jobs count failures per index by default (beta)
PER_INDEX_BACKOFF_SINCE = (1, 29)
# the first whose Jobs take a successPolicy by default (beta; GA in 1.33)
SUCCESS_POLICY_SINCE = (1, 31)


def for_server(manifest: Manifest, server_version: tuple[int, int]) -> Manifest:
    """``manifest`` as a server of ``server_version`` (major, minor) understands it.

    Before 1.29 a Job counts failed pods only (an unknown field is dropped silently, which
    would leave the default of 6 retries): the limit becomes ``max_retries + 1`` failures of
    every node, less one, so that a job whose nodes all fail together gets ``max_retries``
    attempts more (a node lost alone costs one pod of that budget). Before 1.31 a Job has no
    ``successPolicy``: an elastic Job completes only when every index has succeeded.
    """
    spec = manifest.get("spec") or {}
    if manifest.get("apiVersion") != "batch/v1":
        return manifest
    new_spec = dict(spec)
    if "successPolicy" in spec and server_version < SUCCESS_POLICY_SINCE:
        del new_spec["successPolicy"]
    if "backoffLimitPerIndex" in spec and server_version < PER_INDEX_BACKOFF_SINCE:
        del new_spec["backoffLimitPerIndex"]
        nodes = int(spec.get("completions") or 1)
        new_spec["backoffLimit"] = nodes * (spec["backoffLimitPerIndex"] + 1) - 1
    if new_spec == spec:
        return manifest
    return {**manifest, "spec": new_spec}


def volcano_task_name(role: Role, replica_id: int) -> str:
    return f"{dns_label(role.name, VOLCANO_TASK_MAX, fallback='worker')}-{replica_id}"


def volcano_job(app: AppDef, options: KubernetesOptions, names: JobNames) -> List[Manifest]:
    """A Volcano Job with one task per replica (macros differ per replica), then the job's
    Secret and NetworkPolicy.

    Volcano's svc plugin names each pod ``<job>-<task>-0`` with the job as subdomain; every
    replica reaches the store by that DNS name (replica 0 of role 0 knows it hosts it by its
    hostname, and listens on its pod address only).
    """
    tasks: List[Manifest] = []
    rank0_host = names.pod_host(f"{names.job}-{volcano_task_name(app.roles[0], 0)}-0")
    for role_index, role in enumerate(app.roles):
        for replica_id in range(role.num_replicas):
            values = macros.Values(
                img_root="", app_id=names.app_id, replica_id=str(replica_id), rank0_env=RANK0_ENV
            )
            pod_labels = labels(app, role, role_index, names)
            pod_labels[torchx_kubernetes.LABEL_REPLICA_ID] = str(replica_id)
            template = pod_template(
                values.apply(role),
                options,
                pod_labels,
                first_env=[
                    {"name": REPLICA_ID_ENV, "value": str(replica_id)},
                    {"name": RANK0_ENV, "value": rank0_host},
                    {"name": ERROR_FILE_ENV, "value": TERMINATION_MESSAGE_PATH},
                    job_access.secret_env(names),
                ],
            )
            task: Manifest = {
                "name": volcano_task_name(role, replica_id),
                "replicas": 1,
                "template": template,
            }
            if role.max_retries > 0:
                task["maxRetry"] = role.max_retries
                task["policies"] = [
                    dict(p) for p in torchx_kubernetes.RETRY_POLICIES[role.retry_policy]
                ]
            if role.min_replicas is not None:
                # the first min_replicas tasks form the gang, the rest are optional
                task["minAvailable"] = 1 if replica_id < role.min_replicas else 0
            tasks.append(task)
    spec: Manifest = {
        "schedulerName": "volcano",
        "queue": options.queue or DEFAULT_VOLCANO_QUEUE,
        "minAvailable": sum(role.min_replicas or role.num_replicas for role in app.roles),
        "maxRetry": min(role.max_retries for role in app.roles),
        "plugins": {"svc": ["--publish-not-ready-addresses"], "env": []},
        "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
        "tasks": tasks,
    }
    if options.priority_class:
        spec["priorityClassName"] = options.priority_class
    job_labels = labels(app, app.roles[0], 0, names)
    job: Manifest = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": names.job, "namespace": names.namespace, "labels": job_labels},
        "spec": spec,
    }
    return [job, *job_access.manifests(names, job_labels, options.network_policy)]
