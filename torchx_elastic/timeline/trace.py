"""The timeline as Chrome Trace Event JSON, for Perfetto (ui.perfetto.dev) or
``chrome://tracing``, beside a torch profiler trace.

One process per node (``node N (host)``), one thread per local rank (``rank R``) and one for
the node's agent; each run of the worker group is a complete event (``X``) on every rank's
thread, and the time from its rendezvous round to its start one on the agent's thread;
failures, victims and hangs are instant events on the rank, restarts, rendezvous, joins,
leaves and exits on the agent's thread; the job's progress is a counter (``C``) of the
slowest and fastest ranks' steps. Times are microseconds since the epoch (the format's
``ts``), as the agents' clocks gave them.
"""

from __future__ import annotations

from typing import Any

from torchx_elastic.timeline.model import Mark, NodeLane, ProgressSample, Span, Timeline

AGENT_TID = 0
_RANK_TID_BASE = 1  # thread ids 1.. are local ranks 0..
_JOB_PID = 1_000_000  # the process of job-wide tracks (progress, restarts)


def _us(time_s: float) -> int:
    return int(round(time_s * 1e6))


def _instant(mark: Mark, scope: str, pid: int, tid: int) -> dict[str, Any]:
    """An instant event (``i``) of ``scope`` ``t`` (its thread) or ``g`` (global)."""
    return {
        "ph": "i",
        "s": scope,
        "name": mark.label,
        "cat": mark.kind,
        "pid": pid,
        "tid": tid,
        "ts": _us(mark.time_s),
        "args": {"detail": mark.detail},
    }


def _metadata(name: str, pid: int, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    """A metadata event (``M``): a process's or thread's name or sort index."""
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _lane_metadata(pid: int, lane: NodeLane) -> list[dict[str, Any]]:
    """A node's process (``node N (host)``), its agent's thread and one per local rank
    (``rank R``, or ``rank R/S`` when its global rank changed between attempts)."""
    events = [
        _metadata("process_name", pid, {"name": f"node {lane.node} ({lane.host})"}),
        _metadata("process_sort_index", pid, {"sort_index": pid}),
        _metadata("thread_name", pid, {"name": "agent"}, AGENT_TID),
    ]
    for local_rank in range(lane.local_ranks):
        ranks = sorted({s.ranks[local_rank] for s in lane.spans if local_rank < len(s.ranks)})
        name = "rank " + "/".join(map(str, ranks)) if ranks else f"local rank {local_rank}"
        events.append(_metadata("thread_name", pid, {"name": name}, _RANK_TID_BASE + local_rank))
    return events


def _span_events(pid: int, span: Span) -> list[dict[str, Any]]:
    """A run of the worker group: its start on the agent's thread (from its rendezvous
    round), then the run itself on every rank's thread (complete events, ``X``)."""
    events = []
    if span.round_s is not None and span.start_s > span.round_s:
        events.append(
            {
                "ph": "X",
                "name": "starting the workers",
                "cat": "start",
                "pid": pid,
                "tid": AGENT_TID,
                "ts": _us(span.round_s),
                "dur": _us(span.start_s) - _us(span.round_s),
                "args": {"attempt": span.attempt},
            }
        )
    for local_rank, rank in enumerate(span.ranks):
        events.append(
            {
                "ph": "X",
                "name": f"attempt {span.attempt}",
                "cat": "attempt",
                "pid": pid,
                "tid": _RANK_TID_BASE + local_rank,
                "ts": _us(span.start_s),
                "dur": max(0, _us(span.end_s) - _us(span.start_s)),
                "args": {"rank": rank, "end": span.end},
            }
        )
    return events


def _progress_counter(sample: ProgressSample) -> dict[str, Any]:
    """The job's progress at one moment: the slowest and fastest ranks' steps (``C``)."""
    return {
        "ph": "C",
        "name": "steps",
        "pid": _JOB_PID,
        "tid": 0,
        "ts": _us(sample.time_s),
        "args": {"slowest": sample.step, "fastest": sample.fastest_step},
    }


def trace_events(timeline: Timeline) -> dict[str, Any]:
    events = [_metadata("process_name", _JOB_PID, {"name": f"job {timeline.title}"})]
    for pid, lane in enumerate(timeline.nodes):
        events += _lane_metadata(pid, lane)
        for span in lane.spans:
            events += _span_events(pid, span)
        for mark in lane.marks:
            tid = AGENT_TID if mark.local_rank is None else _RANK_TID_BASE + mark.local_rank
            events.append(_instant(mark, "t", pid, tid))
    events += [_instant(mark, "g", _JOB_PID, 0) for mark in timeline.job_marks]
    events += [_progress_counter(sample) for sample in timeline.progress]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"job": timeline.title, "source": timeline.source, "state": timeline.state},
    }
