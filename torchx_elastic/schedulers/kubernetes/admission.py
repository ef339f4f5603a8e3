"""Why the cluster does not create a Job's pods: its ``FailedCreate`` events.

A Job that admission refuses pods (Pod Security, a ResourceQuota or LimitRange, a
validating webhook) is created, but none of its pods ever is: the Job controller records
the refusal as a ``FailedCreate`` event of the Job and retries with a growing delay. Only
refusals are read here (``... is forbidden: ...``, ``admission webhook ... denied the
request``): a transient error (a conflict while quota usage is updated) passes by itself.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from torchx_elastic.schedulers.kubernetes.status import replica_id

Obj = Dict[str, Any]

FAILED_CREATE = "FailedCreate"
_REFUSALS = (" is forbidden: ", "denied the request")
_ERROR_PREFIX = "Error creating: "


def job_events_selector(name: str) -> str:
    """The field selector of the events of the batch/v1 Job ``name``."""
    return f"involvedObject.kind=Job,involvedObject.name={name}"


def _when(event: Obj) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def refusal(events: List[Obj], uid: str, since: str = "") -> Optional[str]:
    """The newest refusal among the events of the Job whose uid is ``uid``, as the API says it.

    Events of an earlier Job of the same name (another uid), and those older than ``since``
    (the newest pod's creation: a refusal that passed) do not count.
    """
    refused = [
        e
        for e in events
        if e.get("reason") == FAILED_CREATE
        and _when(e) >= since
        and (e.get("involvedObject") or {}).get("uid") in (None, "", uid)
        and any(text in str(e.get("message") or "") for text in _REFUSALS)
    ]
    if not refused:
        return None
    message = str(max(refused, key=_when).get("message") or "").strip()
    return message.removeprefix(_ERROR_PREFIX)


def refused_message(reason: str, deleted: bool = True) -> str:
    """The status message of a Job whose pods were refused (and which was deleted)."""
    if not deleted:
        return (
            f"the cluster refused to create the job's pods: {reason}"
            "\nThe Job could not be deleted (Kubernetes retries in vain): cancel it with"
            " torchx cancel or kubectl delete job; change the request or the namespace's policy"
            " and run it again"
        )
    return (
        f"the cluster refused to create the job's pods: {reason}"
        "\nThe Job was deleted (Kubernetes would retry in vain); change the request or the"
        " namespace's policy and run it again"
    )


def newest_pod_created(pods: List[Obj]) -> str:
    return max(
        (str((p.get("metadata") or {}).get("creationTimestamp") or "") for p in pods), default=""
    )


def pods_missing(job: Obj, pods: List[Obj]) -> bool:
    """Whether a running (not suspended, not finished) Job lacks a pod for some index."""
    spec = job.get("spec") or {}
    if spec.get("suspend"):
        return False
    conditions = (job.get("status") or {}).get("conditions") or []
    if any(c.get("status") == "True" for c in conditions):  # finished, suspended, ...
        return False
    indexes = {replica_id(p) for p in pods if (p.get("status") or {}).get("phase") != "Failed"}
    return len(indexes - {None}) < int(spec.get("parallelism") or 1)
