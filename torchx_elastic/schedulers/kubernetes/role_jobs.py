"""Apps of several roles on the ``job`` backend (``ft.ddp``: a Lighthouse and R replica
groups): one Indexed Job per role, every pod behind the app's one headless Service.

- the first role's Job is named as the app (``<job>``): its pod 0 is ``TORCHX_RANK0_HOST``
  for every pod (the Lighthouse, for ``ft.ddp``); it owns the Service, the Secret, the
  NetworkPolicy and the other roles' Jobs, so deleting it (``torchx cancel``, its TTL)
  deletes the app;
- role ``r`` runs as the Job ``<job>-<r>`` (pods ``<job>-<r>-<index>``), marked part of the
  app (:data:`ANNOTATION_PART_OF`: ``torchx list`` shows the app once), with
  ``TORCHX_ELASTIC_ROLE_RANK0_HOST`` set to its own pod 0 (a replica group's rendezvous
  host);
- each Job counts its own retries (``backoffLimitPerIndex``): a failed or deleted pod of one
  replica group is replaced in that group's Job, and the other groups' pods never notice;
- the pods' DNS search path has the Service's domain, so a pod's bare hostname (what
  ``socket.gethostname()`` gives, which torchft's ``Manager`` advertises) resolves from
  every pod of the app.

The app's state is its Jobs' (``schedulers/role_states.py``): a failed group's Job never
stops the others.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppDef, AppState, ReplicaState, Role

from torchx_elastic.contract import ROLE_RANK0_ENV
from torchx_elastic.schedulers import role_status
from torchx_elastic.schedulers.compat import torchx_kubernetes
from torchx_elastic.schedulers.kubernetes import job_access, status
from torchx_elastic.schedulers.kubernetes.manifests import headless_service, labels, role_job
from torchx_elastic.schedulers.kubernetes.names import JobNames
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions
from torchx_elastic.schedulers.kubernetes.pods import Manifest
from torchx_elastic.schedulers.names import dns_label
from torchx_elastic.schedulers.progress_status import Progress
from torchx_elastic.schedulers.role_states import several_roles_state

# on the first role's Job: the names of the app's other Jobs; on those: the first's name
ANNOTATION_ROLE_JOBS = "torchx-elastic/role-jobs"
ANNOTATION_PART_OF = "torchx-elastic/part-of"
_PORT_NAME_MAX = 15


def role_suffix(role: Role) -> str:
    return dns_label(role.name, fallback="worker")


def longest_child(app: AppDef) -> int:
    """The longest part a pod hostname adds to the app's job name: ``-<role>-<index>``."""
    return max(
        len(f"-{role_suffix(role)}-{role.num_replicas - 1}" if i else f"-{role.num_replicas - 1}")
        for i, role in enumerate(app.roles)
    )


def role_job_name(names: JobNames, role: Role) -> str:
    return f"{names.job}-{role_suffix(role)}"


def role_jobs(app: AppDef, options: KubernetesOptions, names: JobNames) -> List[Manifest]:
    """The first role's Job (the owner of the rest), the Service, the Secret and the
    NetworkPolicy, then one Job per other role."""
    search = {"searches": [f"{names.service}.{names.namespace}.svc.cluster.local"]}
    jobs: List[Manifest] = []
    for index, role in enumerate(app.roles):
        job_name = role_job_name(names, role) if index else names.job
        own_rank0 = {"name": ROLE_RANK0_ENV, "value": names.pod_host(f"{job_name}-0")}
        job = role_job(app, role, index, options, names, job_name, more_env=[own_rank0])
        job["spec"]["template"]["spec"]["dnsConfig"] = search
        jobs.append(job)
    first, others = jobs[0], jobs[1:]
    first["metadata"].setdefault("annotations", {})[ANNOTATION_ROLE_JOBS] = ",".join(
        job["metadata"]["name"] for job in others
    )
    for job in others:
        job["metadata"].setdefault("annotations", {})[ANNOTATION_PART_OF] = names.job
    first_labels = labels(app, app.roles[0], 0, names)
    service = headless_service(first_labels, _port_map(app), names)
    access = job_access.manifests(names, first_labels, options.network_policy)
    return [first, service, *access, *others]


def _port_map(app: AppDef) -> Dict[str, int]:
    """Every role's ports, each port once, under names unique in the Service."""
    ports: Dict[str, int] = {}
    for role in app.roles:
        for name, port in role.port_map.items():
            if port in ports.values():
                continue
            label = dns_label(name, _PORT_NAME_MAX, fallback="port")
            ports[label if label not in ports else f"port-{port}"] = port
    return ports


def _role_label(pod: Manifest) -> str:
    return str(
        ((pod.get("metadata") or {}).get("labels") or {}).get(torchx_kubernetes.LABEL_ROLE_NAME, "")
    )


def is_part(job: Manifest) -> bool:
    """Whether a Job is one of an app's role Jobs other than the first."""
    return ANNOTATION_PART_OF in ((job.get("metadata") or {}).get("annotations") or {})


def first_role_name(job: Manifest) -> str:
    """The role label of a Job's pods (the first role's, for the app's first Job)."""
    template = (job.get("spec") or {}).get("template") or {}
    return str(
        ((template.get("metadata") or {}).get("labels") or {}).get(
            torchx_kubernetes.LABEL_ROLE_NAME, ""
        )
    )


def pods_of(job: Manifest, pods: List[Manifest]) -> List[Manifest]:
    """The pods of one role Job of an app, among the app's."""
    role = first_role_name(job)
    return [pod for pod in pods if _role_label(pod) == role]


def role_job_names(job: Manifest) -> List[str]:
    """The other Jobs of the app whose first Job is ``job`` (none for a one-role app)."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ROLE_JOBS, "")
    return [name for name in str(text).split(",") if name]


def describe_role_jobs(
    app_id: str,
    jobs: List[Manifest],
    pods: List[Manifest],
    first_role_log: Optional[Sequence[str]] = None,
    progress: Optional[Mapping[str, Progress]] = None,
) -> DescribeAppResponse:
    """torchx's description of an app of several role Jobs (the first role's Job first):
    the roles' replicas, each role's Job state, why pods stopped and, for ``ft.ddp``, what
    each group does (``first_role_log``: the tail of the Lighthouse's log, which has its
    last quorum; ``progress``: each group's)."""
    roles = [
        status.role_of(job, job["spec"]["template"], int(job["spec"].get("completions") or 1))
        for job in jobs
    ]
    ended = [status.job_state(job, any_running=False)[0] for job in jobs]
    finished = all(state in (AppState.SUCCEEDED, AppState.FAILED) for state in ended)
    statuses, problems, _ = status.roles_and_problems(roles, pods, finished)
    states: Dict[str, AppState] = {}
    restarts: Dict[str, int] = {}
    details: Dict[str, str] = {}
    for role, of_role, job in zip(roles, statuses, jobs, strict=True):
        running = any(r.state == ReplicaState.RUNNING for r in of_role.replicas)
        states[role.name], details[role.name] = status.job_state(job, running)
        restarts[role.name] = status.attempts_restarted(
            [p for p in pods if _role_label(p) == role.name]
        )
    lines = role_status.read(first_role_log).roles_lines(states, progress or {}, restarts, details)
    state, why = several_roles_state(list(states.items()))
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=status.attempts_restarted(pods),
        msg="\n".join(x for x in [why, *lines, *problems] if x),
        roles_statuses=statuses,
        roles=roles,
    )
