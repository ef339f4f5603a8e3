"""State mapping: a Job (or Volcano Job) and its pods as torchx's describe response.

Pod-level reasons (an image that cannot be pulled, a pod no node can take, a container
killed for memory) are surfaced in the response's ``msg``: a job whose pods cannot start
says why on the first status call instead of staying silently PENDING.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppState, ReplicaState, ReplicaStatus, Role, RoleStatus

from torchx_elastic.contract.error_exit import ERROR_PREFIX
from torchx_elastic.contract.error_file import parse_error_json
from torchx_elastic.schedulers.compat import torchx_kubernetes
from torchx_elastic.schedulers.kubernetes.manifests import ANNOTATION_COMPLETION_INDEX
from torchx_elastic.schedulers.kubernetes.security import with_hint

Obj = Dict[str, Any]

POD_PHASE: Dict[str, ReplicaState] = {
    "Pending": ReplicaState.PENDING,
    "Running": ReplicaState.RUNNING,
    "Succeeded": ReplicaState.SUCCEEDED,
    "Failed": ReplicaState.FAILED,
    "Unknown": ReplicaState.UNKNOWN,
}
# waiting reasons that mean the container will not start by itself
WAITING_PROBLEMS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
ANNOTATION_INDEX_FAILURES = "batch.kubernetes.io/job-index-failure-count"
ANNOTATION_INDEX_IGNORED_FAILURES = "batch.kubernetes.io/job-index-ignored-failure-count"
# lines of a log tail (the termination message of a container without a report) kept
TERMINATION_TAIL_LINES = 6
_REPORT_HEADER = "Root cause"
_REPORT_END = ("Logs of every rank:", "Summary (JSON):")
_JSON_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)"')
VOLCANO_STATE: Dict[str, AppState] = {
    **{
        phase: state
        for phase, state in torchx_kubernetes.JOB_STATE.items()
        if isinstance(state, AppState)
    },
    # torchx 0.7 maps "Failed" to a ReplicaState by mistake
    "Failed": AppState.FAILED,
}


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _condition(obj: Obj, kind: str) -> Optional[Obj]:
    for condition in _get(obj, "status", "conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def pod_problems(pod: Obj) -> List[str]:
    """Why a pod is not running (or why it stopped), in the API's own reason words."""
    problems: List[str] = []
    for condition in _get(pod, "status", "conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            problems.append(f"Unschedulable: {condition.get('message', '')}".rstrip(": "))
    statuses = (_get(pod, "status", "initContainerStatuses") or []) + (
        _get(pod, "status", "containerStatuses") or []
    )
    for status in statuses:
        waiting = _get(status, "state", "waiting") or {}
        if waiting.get("reason") in WAITING_PROBLEMS:
            message = with_hint(waiting.get("message", ""))
            problems.append(f"{waiting['reason']}: {message}".rstrip(": "))
        terminated = _get(status, "state", "terminated") or {}
        if terminated and terminated.get("exitCode", 0) != 0:
            reason = terminated.get("reason") or "Error"
            text = f"{reason} (container {status.get('name')}, exit code {terminated['exitCode']})"
            summary = termination_summary(terminated.get("message") or "")
            if summary:
                text += f": {summary}"
            problems.append(text)
    reason = _get(pod, "status", "reason")
    if reason:  # Evicted, DeadlineExceeded, UnexpectedAdmissionError, ...
        problems.append(f"{reason}: {_get(pod, 'status', 'message') or ''}".rstrip(": "))
    return problems


def termination_summary(message: str) -> str:
    """The root cause in a container's termination message.

    The agent writes torch's error-file JSON there (``TORCHELASTIC_ERROR_FILE``); a container
    that wrote none has the tail of its log (``FallbackToLogsOnError``), from which the
    agent's "Root cause" section is kept, or else the last lines.
    """
    message = message.strip()
    if not message:
        return ""
    content = parse_error_json(message)
    if content is not None:
        return content.message.strip()
    if message.startswith("{"):  # the JSON, cut at the API's size limit
        match = _JSON_MESSAGE.search(message)
        if match:
            return str(json.loads(f'"{match.group(1)}"')).strip()
    lines = [line.rstrip() for line in message.splitlines()]
    if _REPORT_HEADER in lines:
        section = lines[lines.index(_REPORT_HEADER) + 2 :]
        kept = [ln for ln in section if ln.strip() and not ln.startswith(_REPORT_END)]
        return "\n".join(kept)
    # the agent's own last word (e.g. why its rendezvous failed) says more than the lines above
    errors = [ln for ln in lines if ln.startswith(ERROR_PREFIX)]
    if errors:
        return errors[-1]
    return "\n".join(ln for ln in lines[-TERMINATION_TAIL_LINES:] if ln.strip())


def restarts_of(pod: Obj) -> int:
    """How many pods of this pod's index failed before it (or were lost to a disruption)."""
    annotations = _get(pod, "metadata", "annotations") or {}
    count = 0
    for key in (ANNOTATION_INDEX_FAILURES, ANNOTATION_INDEX_IGNORED_FAILURES):
        text = str(annotations.get(key, "0"))
        count += int(text) if text.isdigit() else 0
    return count


def attempts_restarted(pods: List[Obj]) -> int:
    """Restarts of the job as attempts: the most any one replica was replaced.

    One failure fails every node of a job at once, so it counts once, not once per pod.
    Servers that do not annotate pods with their index's failures: older pods of a replica.
    """
    pods_of: Dict[Tuple[str, int], int] = {}
    annotated: Dict[Tuple[str, int], int] = {}
    for pod in pods:
        index = replica_id(pod)
        if index is None:
            continue
        key = (
            (_get(pod, "metadata", "labels") or {}).get(torchx_kubernetes.LABEL_ROLE_NAME, ""),
            index,
        )
        pods_of[key] = pods_of.get(key, 0) + 1
        annotated[key] = max(annotated.get(key, 0), restarts_of(pod))
    return max((max(n - 1, annotated[key]) for key, n in pods_of.items()), default=0)


def replica_id(pod: Obj) -> Optional[int]:
    """The replica of a pod: Volcano's replica label or the Indexed Job's completion index."""
    labels = _get(pod, "metadata", "labels") or {}
    annotations = _get(pod, "metadata", "annotations") or {}
    text = labels.get(
        torchx_kubernetes.LABEL_REPLICA_ID, annotations.get(ANNOTATION_COMPLETION_INDEX)
    )
    return int(text) if text is not None and str(text).isdigit() else None


def latest_pods(pods: List[Obj]) -> Dict[Tuple[str, int], Obj]:
    """The newest pod of each (role, replica): a retried replica has older, failed pods."""
    latest: Dict[Tuple[str, int], Obj] = {}
    for pod in sorted(pods, key=lambda p: str(_get(p, "metadata", "creationTimestamp") or "")):
        index = replica_id(pod)
        role = (_get(pod, "metadata", "labels") or {}).get(torchx_kubernetes.LABEL_ROLE_NAME, "")
        if index is not None:
            latest[(role, index)] = pod
    return latest


def roles_and_problems(
    roles: List[Role], pods: List[Obj], finished: bool = False
) -> Tuple[List[RoleStatus], List[str], bool]:
    """Replica states and why pods stopped; ``finished``: the job is over, so a replica
    without a pod lost it (not yet created is what it means while the job runs)."""
    newest = latest_pods(pods)
    statuses: List[RoleStatus] = []
    problems: List[str] = []
    any_running = False
    for role in roles:
        replicas: List[ReplicaStatus] = []
        for index in range(role.num_replicas):
            pod = newest.get((role.name, index))
            state = ReplicaState.PENDING
            node = ""
            if pod is not None:
                state = POD_PHASE.get(_get(pod, "status", "phase") or "", ReplicaState.UNKNOWN)
                node = _get(pod, "spec", "nodeName") or ""
                pod_name = _get(pod, "metadata", "name")
                problems += [f"{role.name}[{index}] pod {pod_name}: {p}" for p in pod_problems(pod)]
            elif finished:
                state = ReplicaState.UNKNOWN
                problems.append(f"{role.name}[{index}]: no pod: {POD_DELETED}")
            any_running = any_running or state == ReplicaState.RUNNING
            replicas.append(ReplicaStatus(id=index, state=state, role=role.name, hostname=node))
        statuses.append(RoleStatus(role=role.name, replicas=replicas))
    return statuses, problems, any_running


def role_of(obj: Obj, template: Obj, num_replicas: int) -> Role:
    labels = _get(template, "metadata", "labels") or _get(obj, "metadata", "labels") or {}
    containers = _get(template, "spec", "containers") or [{}]
    return Role(
        name=labels.get(torchx_kubernetes.LABEL_ROLE_NAME, "worker"),
        image=containers[0].get("image", ""),
        num_replicas=num_replicas,
    )


# why a replica of a finished Job has no pod
POD_DELETED = (
    "it was deleted, with its log (the Job controller deletes the pods still running when a"
    " Job fails, and those that never joined when an elastic Job succeeds)"
)


def job_state(job: Obj, any_running: bool) -> Tuple[AppState, str]:
    """The app state of a batch/v1 Job, and what its conditions say."""
    # SuccessCriteriaMet: an elastic Job's successPolicy is met; Complete follows once the
    # Job controller has removed the pods that never joined
    ending = (
        ("Complete", AppState.SUCCEEDED),
        ("SuccessCriteriaMet", AppState.SUCCEEDED),
        ("Failed", AppState.FAILED),
    )
    for kind, state in ending:
        condition = _condition(job, kind)
        if condition is not None:
            detail = ": ".join(x for x in (condition.get("reason"), condition.get("message")) if x)
            return state, detail
    if _get(job, "spec", "suspend") or _condition(job, "Suspended"):
        queue = (_get(job, "metadata", "labels") or {}).get("kueue.x-k8s.io/queue-name")
        waiting_for = f"admission by Kueue queue {queue}" if queue else "the Job to be resumed"
        return AppState.PENDING, f"suspended, waiting for {waiting_for}"
    return (AppState.RUNNING if any_running else AppState.PENDING), ""


def describe_job(app_id: str, job: Obj, pods: List[Obj]) -> DescribeAppResponse:
    template = _get(job, "spec", "template") or {}
    role = role_of(job, template, int(_get(job, "spec", "completions") or 1))
    finished = job_state(job, any_running=False)[0] in (AppState.SUCCEEDED, AppState.FAILED)
    statuses, problems, any_running = roles_and_problems([role], pods, finished)
    state, detail = job_state(job, any_running)
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=attempts_restarted(pods),
        msg=_message(detail, problems),
        roles_statuses=statuses,
        roles=[role],
    )


def describe_volcano_job(app_id: str, job: Obj, pods: List[Obj]) -> DescribeAppResponse:
    roles: Dict[str, Role] = {}
    for task in _get(job, "spec", "tasks") or []:
        template = task.get("template") or {}
        labels = _get(template, "metadata", "labels") or {}
        role = role_of(job, template, 0)
        role = roles.setdefault(labels.get(torchx_kubernetes.LABEL_ROLE_INDEX, role.name), role)
        role.num_replicas += int(task.get("replicas", 1))
    statuses, problems, any_running = roles_and_problems(list(roles.values()), pods)
    phase = _get(job, "status", "state", "phase")
    state = VOLCANO_STATE.get(phase or "", AppState.UNKNOWN if phase else AppState.PENDING)
    return DescribeAppResponse(
        app_id=app_id,
        state=state,
        num_restarts=int(_get(job, "status", "retryCount") or 0),
        msg=_message(_get(job, "status", "state", "message") or "", problems),
        roles_statuses=statuses,
        roles=list(roles.values()),
    )


def _message(detail: str, problems: List[str]) -> str:
    return "\n".join(x for x in [detail, *problems] if x)
