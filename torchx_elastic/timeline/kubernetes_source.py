"""A Kubernetes job's timeline, from what the cluster still holds.

The agents' files live in each pod's filesystem, which the API server does not serve (only
an exec into a running container could read them). What it does serve, with the same
permissions as ``torchx status``: the job's pods (one lane per pod, from its start to its
end; a replaced pod is a restart of its replica), each container's exit code and
termination message (the agent writes the job's root cause there: rank, exception and
traceback), and replica 0's log, whose ``[job progress]`` lines give the progress over
time. Missing, and said so on the page: the per-rank lanes, restarts of the worker group
inside a pod, victims, rendezvous rounds and hang reports. Once the pods are deleted
(``ttlSecondsAfterFinished``, ``torchx delete``) nothing is left to draw.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from torchx_elastic.contract.error_file import parse_error_json
from torchx_elastic.timeline.log_dir import SourceError
from torchx_elastic.timeline.model import (
    MAX_PROGRESS_SAMPLES,
    Mark,
    NodeLane,
    ProgressSample,
    Span,
    Timeline,
    thin,
)

LOG_LINES = 20_000  # of replica 0's log, for its progress lines
MISSING = (
    "From the Kubernetes API: one lane per pod, its exit code and the root cause the agent"
    " wrote as its termination message, and the progress lines of replica 0's log. Per-rank"
    " lanes, restarts inside a pod, victims, rendezvous rounds and hang reports are in the"
    " agents' files inside the pods, which the API server does not serve."
)


def _seconds(stamp: Any) -> float | None:
    from torchx_elastic.schedulers.progress_status import log_timestamp

    when: datetime | None = log_timestamp(str(stamp)) if stamp else None
    return when.timestamp() if when else None


def _state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    state: dict[str, Any] = statuses[0].get("state") or {}
    return state


def _root_cause(message: str) -> tuple[str, str]:
    """(summary, traceback) of a termination message (torch's error-file JSON or log text)."""
    from torchx_elastic.schedulers.kubernetes.status import termination_summary

    content = parse_error_json(message)
    return termination_summary(message), content.traceback if content is not None else ""


def pod_lanes(pods: list[dict[str, Any]], now_s: float) -> list[NodeLane]:
    from torchx_elastic.schedulers.kubernetes.status import replica_id

    lanes: dict[int, NodeLane] = {}
    ordered = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp")))
    for pod in ordered:
        index = replica_id(pod)
        if index is None:
            continue
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        name = str(meta.get("name"))
        state = _state(pod)
        running, terminated = state.get("running") or {}, state.get("terminated")
        start_s = (
            _seconds(running.get("startedAt"))
            or _seconds((terminated or {}).get("startedAt"))
            or _seconds(status.get("startTime"))
            or _seconds(meta.get("creationTimestamp"))
            or now_s
        )
        lane = lanes.setdefault(index, NodeLane(key=f"replica {index}", node=index, host=name))
        attempt = len(lane.spans)
        if attempt:
            lane.host = name
            lane.marks.append(
                Mark(
                    start_s,
                    "restart",
                    f"restart: pod {name} replaced replica {index}",
                    attempt=attempt,
                )
            )
        if terminated is None:
            lane.spans.append(Span(attempt, start_s, now_s, (), "running"))
            continue
        end_s = _seconds(terminated.get("finishedAt")) or now_s
        code = int(terminated.get("exitCode", 0))
        lane.spans.append(Span(attempt, start_s, end_s, (), "failed" if code else "succeeded"))
        if code:
            summary, traceback = _root_cause(str(terminated.get("message") or ""))
            lane.marks.append(
                Mark(
                    end_s,
                    "failure",
                    f"pod {name}: exit code {code}",
                    "\n".join(x for x in (summary, traceback) if x),
                    attempt=attempt,
                )
            )
        else:
            lane.marks.append(Mark(end_s, "exit", "exit 0", "SUCCEEDED", attempt=attempt))
    return [lanes[i] for i in sorted(lanes)]


def progress_samples(log_text: str) -> list[ProgressSample]:
    """The ``[job progress]`` lines of a log read with timestamps."""
    from torchx_elastic.schedulers.progress_status import timestamped_figures

    samples = []
    for line in log_text.splitlines():
        found = timestamped_figures(line)
        if found is None:
            continue
        at, figures = found
        if at is None:
            continue
        samples.append(
            ProgressSample(
                at.timestamp(),
                figures.step,
                figures.step,
                figures.total,
                "?",
                "?",
                figures.rate_per_s,
            )
        )
    return thin(samples, MAX_PROGRESS_SAMPLES)


def timeline_of_kubernetes_job(app_id: str, api: Any = None) -> Timeline:
    """``app_id``: ``namespace:job`` as torchx prints it."""
    from torchx_elastic.schedulers.kubernetes import manifests
    from torchx_elastic.schedulers.kubernetes.client import KubeApi, load_api_client
    from torchx_elastic.schedulers.kubernetes.names import JobNames, parse_app_id

    namespace, name = parse_app_id(app_id)
    api = api or KubeApi(load_api_client())
    pods = api.list_pods(namespace, manifests.selector(JobNames(name, namespace)))
    now_s = time.time()
    lanes = pod_lanes(pods, now_s)
    if not lanes:
        raise SourceError(
            f"no pods of {app_id} in the cluster any more: the agents' files lived in them,"
            " so nothing of the job is left to draw (keep finished pods longer, or give the"
            " agents a --log-dir on a persistent volume and draw that directory)"
        )
    progress: list[ProgressSample] = []
    first = lanes[0]
    if first.node == 0:
        try:
            progress = progress_samples(api.pod_log_tail(namespace, first.host, LOG_LINES))
        except Exception:  # noqa: BLE001 - the pod's log is gone: the lanes are still there
            progress = []
    spans = [s for lane in lanes for s in lane.spans]
    last = [lane.spans[-1].end for lane in lanes]
    failed, ended = "failed" in last, "running" not in last
    job_marks = sorted(
        (m for lane in lanes for m in lane.marks if m.kind == "restart"), key=lambda m: m.time_s
    )
    return Timeline(
        title=app_id,
        source=f"Kubernetes pods of {app_id}",
        start_s=min(s.start_s for s in spans),
        end_s=max(s.end_s for s in spans),
        nodes=lanes,
        job_marks=job_marks,
        failures=[],
        progress=progress,
        state="RUNNING" if not ended else ("FAILED" if failed else "SUCCEEDED"),
        notes=[MISSING],
    )
