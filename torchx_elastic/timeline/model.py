"""What a timeline shows, as plain data: lanes per node (agent) and rank, marks, progress.

:func:`build` turns the agents' event records (:mod:`torchx_elastic.contract.events`) into a
:class:`Timeline`; it reads records defensively (unknown events and fields are skipped, a
record without a time is dropped) because fields are added over time. The failures of each
attempt are classified by the agent's own policy (root cause, victims) in ``failures.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchx_elastic.contract import events as ev

MAX_PROGRESS_SAMPLES = 1000  # a day-long job's samples, thinned out for the picture


@dataclass(frozen=True)
class Span:
    """One run of one node's worker group: from its start to its failure, restart or exit."""

    attempt: int
    start_s: float
    end_s: float
    ranks: tuple[int, ...]  # global ranks, by local rank
    end: str  # failed | restarted | succeeded | stopped | running
    round_s: float | None = None  # its rendezvous round completed (then the workers started)


@dataclass(frozen=True)
class Mark:
    """A moment on a node's lane (``local_rank`` None) or on one of its ranks."""

    time_s: float
    kind: str  # rendezvous | restart | failure | victim | hang | join | leave | exit
    label: str
    detail: str = ""
    local_rank: int | None = None
    attempt: int = 0


@dataclass
class NodeLane:
    """One agent: a node of the job (keyed by host and agent pid, labelled by node rank)."""

    key: str
    node: int
    host: str
    local_ranks: int = 0
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


@dataclass(frozen=True)
class ProgressSample:
    time_s: float
    step: int
    fastest_step: int
    total: int | None
    slowest: str  # ``r3 (n1)``
    fastest: str
    rate_per_s: float | None


@dataclass(frozen=True)
class RankFailureView:
    """A failed rank as the timeline shows it."""

    attempt: int
    rank: int
    node: int
    local_rank: int
    time_s: float
    how: str  # ``exit code 1`` or ``signal SIGTERM``
    role: str  # root | victim | other
    reason: str  # the message, or why it is a victim
    traceback_head: str


@dataclass
class Timeline:
    title: str
    source: str
    start_s: float
    end_s: float
    nodes: list[NodeLane]
    job_marks: list[Mark]  # job-wide: restarts with their cause
    failures: list[RankFailureView]
    progress: list[ProgressSample]
    state: str
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> int:
        return sum(lane.local_ranks for lane in self.nodes)


def _time(record: Mapping[str, Any]) -> float | None:
    value = record.get("time_s")
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _lane_key(record: Mapping[str, Any]) -> str:
    return f"{record.get('host', '?')}:{record.get('agent_pid', '?')}"


class _LaneBuilder:
    """Follows one agent's records in time order."""

    def __init__(self, lane: NodeLane) -> None:
        self.lane = lane
        # attempt, start, ranks, round
        self.open: tuple[int, float, tuple[int, ...], float | None] | None = None
        self.ranks: tuple[int, ...] = ()
        self.round_s: float | None = None
        self.last_s = 0.0
        self.exited = False

    def close(self, time_s: float, end: str) -> None:
        if self.open is not None:
            attempt, start_s, ranks, round_s = self.open
            self.lane.spans.append(Span(attempt, start_s, time_s, ranks, end, round_s))
            self.open = None

    def local_rank_of(self, rank: int) -> int | None:
        return self.ranks.index(rank) if rank in self.ranks else None


# (attempt, one dict per failed rank: rank, node, local_rank, pid, exitcode, time_s) ->
# the ranks as shown, with their role (``failures.classifier``)
ClassifyFailures = Callable[[int, Sequence[Mapping[str, Any]]], "list[RankFailureView]"]


_NODE_EVENTS = frozenset({ev.RENDEZVOUS, ev.START, ev.HANG, ev.FAILURE, ev.RESTART, ev.EXIT})


class _Replay:
    """The agents' records replayed in time order: a lane per agent, the job's progress,
    each attempt's failure records and hang, the agents' exit states."""

    def __init__(self) -> None:
        self.builders: dict[str, _LaneBuilder] = {}
        self.progress: list[ProgressSample] = []
        self.failed: dict[int, list[tuple[float, str, Mapping[str, Any]]]] = {}  # by attempt
        self.hangs: dict[int, str] = {}
        self.first_start_s: float | None = None  # a node's first round after this is a join
        self.states: list[str] = []

    def feed(self, time_s: float, record: Mapping[str, Any]) -> None:
        event = record.get("event")
        if event == ev.PROGRESS:
            self.progress.append(_progress_sample(time_s, record))
            return
        if event not in _NODE_EVENTS:
            return  # a newer agent's record: its fields are not drawn (yet)
        key = _lane_key(record)
        builder = self.builders.get(key)
        if builder is None:
            node = _int(record.get("node"), -1)
            builder = self.builders[key] = _LaneBuilder(
                NodeLane(key=key, node=node, host=str(record.get("host", "?")))
            )
        builder.last_s = time_s
        if record.get("node") is not None:
            builder.lane.node = _int(record.get("node"), builder.lane.node)
        attempt = _int(record.get("attempt"))
        if event == ev.RENDEZVOUS:
            self._rendezvous(builder, time_s, attempt, record)
        elif event == ev.START:
            self.first_start_s = time_s if self.first_start_s is None else self.first_start_s
            builder.close(time_s, "restarted")
            builder.open = (attempt, time_s, builder.ranks, builder.round_s)
            builder.round_s = None
        elif event == ev.HANG:
            self._hang(builder, time_s, attempt, record)
        elif event == ev.FAILURE:
            builder.close(time_s, "failed")
            self.failed.setdefault(attempt, []).append((time_s, key, record))
        elif event == ev.RESTART:
            builder.close(time_s, "restarted")
            reason = str(record.get("reason", ""))
            builder.lane.marks.append(
                Mark(time_s, "restart", f"restart: {reason}", attempt=attempt)
            )
        elif event == ev.EXIT:
            self._exit(builder, time_s, record)

    def _rendezvous(
        self, builder: _LaneBuilder, time_s: float, attempt: int, record: Mapping[str, Any]
    ) -> None:
        lane = builder.lane
        builder.close(time_s, "restarted")
        ranks = tuple(_int(r) for r in record.get("ranks") or ())
        builder.ranks, builder.round_s = ranks, time_s
        lane.local_ranks = max(lane.local_ranks, len(ranks))
        world = record.get("group_world_size")
        if self.first_start_s is not None and not lane.spans and not lane.marks:
            lane.marks.append(
                Mark(time_s, "join", f"node {lane.node} joined", f"the job has {world} nodes")
            )
        lane.marks.append(
            Mark(
                time_s,
                "rendezvous",
                f"rendezvous: {world} node{'s' if world != 1 else ''}",
                f"attempt {attempt}, ranks {_ranges(ranks)}, master {record.get('master')}",
            )
        )

    def _hang(
        self, builder: _LaneBuilder, time_s: float, attempt: int, record: Mapping[str, Any]
    ) -> None:
        message = str(record.get("message", ""))
        self.hangs.setdefault(attempt, message)
        for rank in record.get("ranks") or ():
            builder.lane.marks.append(
                Mark(time_s, "hang", f"rank {rank} hung", message, builder.local_rank_of(rank))
            )

    def _exit(self, builder: _LaneBuilder, time_s: float, record: Mapping[str, Any]) -> None:
        state = str(record.get("state", ""))
        self.states.append(state)
        builder.close(time_s, state.lower() or "stopped")
        builder.exited = True
        builder.lane.marks.append(Mark(time_s, "exit", f"exit {record.get('exit_code')}", state))

    def classify(self, classify_failures: ClassifyFailures) -> list[RankFailureView]:
        """Each attempt's failed ranks, as ``classify_failures`` names them, marked on their
        node's lane (a victim's mark apart from a failure's)."""
        failures: list[RankFailureView] = []
        for attempt, attempt_records in sorted(self.failed.items()):
            for key, view in _failure_views(attempt, attempt_records, classify_failures):
                failures.append(view)
                kind = "victim" if view.role == "victim" else "failure"
                self.builders[key].lane.marks.append(
                    Mark(
                        view.time_s,
                        kind,
                        f"rank {view.rank}: {view.how}",
                        _failure_detail(view),
                        view.local_rank,
                    )
                )
        return failures

    def end(self, end_s: float) -> None:
        """Close every lane: an agent that exited at its last record, the others run on."""
        for builder in self.builders.values():
            builder.close(builder.last_s if builder.exited else end_s, "running")
        _mark_leaves(self.builders, end_s)


def build(
    records: Iterable[Mapping[str, Any]],
    title: str,
    source: str,
    classify_failures: ClassifyFailures,
) -> Timeline:
    """The timeline of ``records`` (every agent's, any order).

    ``classify_failures`` names the root cause and the victims of each attempt.
    """
    timed = sorted(
        ((t, dict(r)) for r in records if (t := _time(r)) is not None), key=lambda p: p[0]
    )
    replay = _Replay()
    for time_s, record in timed:
        replay.feed(time_s, record)
    failures = replay.classify(classify_failures)
    end_s = max((t for t, _ in timed), default=0.0)
    replay.end(end_s)
    lanes = [b.lane for b in replay.builders.values()]
    job_marks = _with_restart_causes(lanes, failures, replay.hangs)
    lanes.sort(key=lambda lane: (lane.node, lane.key))
    return Timeline(
        title=title,
        source=source,
        start_s=timed[0][0] if timed else 0.0,
        end_s=end_s,
        nodes=lanes,
        job_marks=_first_per_restart(job_marks),
        failures=failures,
        progress=thin(replay.progress, MAX_PROGRESS_SAMPLES),
        state=_job_state(replay.states),
    )


def _with_restart_causes(
    lanes: Sequence[NodeLane], failures: Sequence[RankFailureView], hangs: Mapping[int, str]
) -> list[Mark]:
    """Each lane's restart marks with their cause (sorted with its other marks), and every
    lane's restarts for the job's marks."""
    job_marks: list[Mark] = []
    for lane in lanes:
        job_marks += [_restart_cause(m, failures, hangs) for m in lane.marks if m.kind == "restart"]
    for lane in lanes:
        lane.marks = [
            _restart_cause(m, failures, hangs) if m.kind == "restart" else m for m in lane.marks
        ]
        lane.marks.sort(key=lambda m: m.time_s)
    return job_marks


def thin(samples: Sequence[ProgressSample], limit: int) -> list[ProgressSample]:
    """At most ``limit`` samples, evenly spread, the first and the last kept."""
    if len(samples) <= limit:
        return list(samples)
    last = len(samples) - 1
    return [samples[round(i * last / (limit - 1))] for i in range(limit)]


def _progress_sample(time_s: float, record: Mapping[str, Any]) -> ProgressSample:
    total = record.get("total")
    rate = record.get("rate_per_s")
    return ProgressSample(
        time_s=time_s,
        step=_int(record.get("step")),
        fastest_step=_int(record.get("fastest_step")),
        total=_int(total) if total is not None else None,
        slowest=f"r{record.get('slowest_rank')} (n{record.get('slowest_node')})",
        fastest=f"r{record.get('fastest_rank')} (n{record.get('fastest_node')})",
        rate_per_s=float(rate) if isinstance(rate, (int, float)) else None,
    )


def _failure_views(
    attempt: int,
    records: Sequence[tuple[float, str, Mapping[str, Any]]],
    classify_failures: ClassifyFailures,
) -> list[tuple[str, RankFailureView]]:
    """The failed ranks of an attempt, each with the key of its node's lane."""
    failed: list[dict[str, Any]] = []
    lane_of: dict[int, str] = {}
    for time_s, key, record in records:
        entries = record.get("failures")
        if not isinstance(entries, Mapping):
            continue
        for rank, facts in entries.items():
            facts = facts if isinstance(facts, Mapping) else {}
            lane_of[_int(rank)] = key
            failed.append(
                {
                    "rank": _int(rank),
                    "node": _int(record.get("node")),
                    "local_rank": _int(facts.get("local_rank")),
                    "pid": _int(facts.get("pid")),
                    "exitcode": _int(facts.get("exitcode"), 1),
                    "time_s": time_s,
                }
            )
    return [(lane_of[view.rank], view) for view in classify_failures(attempt, failed)]


def _failure_detail(view: RankFailureView) -> str:
    """What a click on a failed rank shows: why it is a victim, and its traceback's head."""
    if view.role == "victim":
        return "\n".join(x for x in (view.reason, view.traceback_head) if x)
    return view.traceback_head or view.reason


def _restart_cause(
    mark: Mark, failures: Sequence[RankFailureView], hangs: Mapping[int, str]
) -> Mark:
    """A restart after a failure, with its cause: the first failure of the attempt that
    ended (a restart's record names the attempt that starts), or its hang."""
    if mark.label != f"restart: {ev.RESTART_AFTER_FAILURE}":
        return mark
    ended = mark.attempt - 1
    of_attempt = [f for f in failures if f.attempt == ended]
    roots = [f for f in of_attempt if f.role == "root"] or of_attempt
    if not roots:
        return mark
    root = min(roots, key=lambda f: f.time_s)
    hang = hangs.get(ended)
    cause = f"rank {root.rank} (node {root.node}) failed first: {root.how}"
    if hang:
        cause = hang if hang.startswith("hang") else f"hang: {hang}"
    elif root.reason:
        cause += f", {_first_line(root.reason)}"
    return Mark(
        mark.time_s,
        mark.kind,
        f"restart {mark.attempt} after {cause}",
        root.traceback_head,
        attempt=mark.attempt,
    )


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_per_restart(marks: Sequence[Mark]) -> list[Mark]:
    """One job-wide mark per restart: the earliest node's (they restart within a second)."""
    chosen: list[Mark] = []
    for mark in sorted(marks, key=lambda m: m.time_s):
        if chosen and chosen[-1].label == mark.label and mark.time_s - chosen[-1].time_s < 30:
            continue
        chosen.append(mark)
    return chosen


def _mark_leaves(builders: Mapping[str, _LaneBuilder], end_s: float) -> None:
    """A node left when its agent stopped writing while the job went on without it."""
    for builder in builders.values():
        if builder.exited and any(
            m.kind == "exit" and m.detail == "SUCCEEDED" for m in builder.lane.marks
        ):
            continue
        later = any(
            other is not builder and other.last_s > builder.last_s + 1.0
            for other in builders.values()
        )
        if later:
            builder.lane.marks.append(
                Mark(
                    builder.last_s,
                    "leave",
                    f"node {builder.lane.node} left",
                    "its agent wrote nothing after this while the others went on",
                )
            )


def _job_state(states: Sequence[str]) -> str:
    """From the agents' exits: RUNNING while none exited (or none could write its exit)."""
    if "FAILED" in states:
        return "FAILED"
    if states and all(s == "SUCCEEDED" for s in states):
        return "SUCCEEDED"
    return states[-1] if states else "RUNNING"


def _ranges(ranks: Sequence[int]) -> str:
    """``0-3`` for consecutive ranks, else ``0,2,5``."""
    if not ranks:
        return "none"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(map(str, ranks))
