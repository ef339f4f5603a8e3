"""The job's latest progress for ``torchx status`` (docker, kubernetes), from replica 0's log.

Every status interval the rank-0 agent prints one ``[job progress]`` line for the whole job
(``torchx_elastic.contract.job_progress``). The schedulers read the tail of replica 0's log through
the engine's or the API server's log call, with timestamps (no exec into a container, no
extra permission beyond reading logs), and this module turns the newest such line into
``progress 120/200 (60.0%) of 4/4 ranks, 4.1 steps/s, ETA 29s (as of 3s ago)``; while
replica 0's agent waits for the other nodes, its ``waiting for nodes: 1 of 2 joined; ...``;
where no rank reports progress in a job that has had a standby, the nodes line's
``nodes: 2 training, 1 standby (as of 3s ago)``.

Node rank 0 is replica 0 while replica 0 trains (torch ranks a round's nodes by their
address, and replica 0's sorts first). Where replica 0 does not train (it stands by as a
spare, having joined after the job was full, or its replacement has not joined yet), the
rank-0 agent is another replica: :func:`replicas_progress` then reads the next replicas'
logs too, at most :data:`PROGRESS_REPLICAS` of them, and shows the newest line among them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from torchx_elastic.contract import WAITING_FOR_NODES
from torchx_elastic.contract.job_progress import (
    LINE_PREFIX,
    WAITING_LINE_PREFIX,
    LineFigures,
    NodeCounts,
    format_duration,
    nodes_text,
    parse_line,
    parse_nodes_line,
)

# lines of replica 0's log read per status call; the agent prints its line every 5 s, so a
# job printing more lines than this in 5 s shows no progress in its status
TAIL_LINES = 1000
# replicas after replica 0 whose logs a status call reads where replica 0's has no progress
PROGRESS_REPLICAS = 8


def log_timestamp(text: str) -> Optional[datetime]:
    """An RFC 3339 timestamp as Docker and Kubernetes write them (nanoseconds, ``Z``)."""
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    whole, dot, rest = text.partition(".")
    if dot:  # datetime takes at most microseconds
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        text = f"{whole}.{(digits + '000000')[:6]}{rest[len(digits) :]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def timestamped_figures(line: str) -> Optional[Tuple[Optional[datetime], LineFigures]]:
    """The time (None: no readable stamp) and figures of a ``TIMESTAMP [job progress] ...``
    log line; None when ``line`` is not a ``[job progress]`` line."""
    if LINE_PREFIX not in line:
        return None
    figures = parse_line(line)
    if figures is None:
        return None
    stamp, _, _ = line.partition(" ")
    return log_timestamp(stamp), figures


# what a waiting agent prints (agent/rendezvous/waiting.py) until its first round is complete
AGENT_LINE_PREFIX = "torchx-elastic: "
WAITING_MARK = f"{AGENT_LINE_PREFIX}{WAITING_FOR_NODES}"


def waiting_message(
    lines: List[str], now: Optional[datetime] = None, where: str = "replica 0's log"
) -> Optional[str]:
    """``waiting for nodes: 1 of 2 joined; ...`` when the newest line of ``lines`` is the
    agent's waiting line (nothing came after it: its first round is not complete), or the
    ``[job progress]`` line of the same wait, after the waiting line it sums up."""
    newest_stamp: Optional[str] = None
    for line in reversed(lines):
        stamp, _, text = line.partition(" ")
        if not line.strip():
            continue
        newest_stamp = stamp if newest_stamp is None else newest_stamp
        if not text.startswith(WAITING_LINE_PREFIX):
            break
    else:
        return None
    if not text.startswith(WAITING_MARK):
        return None
    message = text[len(AGENT_LINE_PREFIX) :].strip()
    return message + as_of(log_timestamp(newest_stamp or stamp), now, where)


Progress = Tuple[Optional[datetime], LineFigures]  # a [job progress] line's time and figures


def newest_progress(lines: Iterable[str]) -> Optional[Progress]:
    """The time and figures of the newest ``[job progress]`` line of ``lines``."""
    for line in reversed(list(lines)):
        found = timestamped_figures(line)
        if found is not None:
            return found
    return None


def figures_text(
    progress: Progress, now: Optional[datetime] = None, where: str = "replica 0's log"
) -> str:
    """``progress 120/200 (60.0%) of 4/4 ranks, 4.1 steps/s, ETA 29s (as of 3s ago, ...)``;
    with spares, ``, nodes: 2 training, 1 standby`` after the ranks."""
    at, figures = progress
    text = f"progress {step_text(figures)} of {figures.ranks_reporting}/{figures.ranks} ranks"
    if figures.standbys is not None:  # the job has had spares: where they are
        text += f", {nodes_text(figures.nodes or 0, figures.standbys)}"
    text += "".join(f", {part}" for part in pace_text(figures))
    if figures.quiet:
        text += f", quiet: {figures.quiet}"
    return text + as_of(at, now, where)


# a ``[job progress]`` line's time and what it says: figures, or the nodes alone
JobLine = Tuple[Optional[datetime], Union[LineFigures, NodeCounts]]


def newest_job_line(lines: Iterable[str]) -> Optional[JobLine]:
    """The time and content of the newest ``[job progress]`` line of ``lines``, progress
    figures or (where no rank reports progress) the nodes line's counts."""
    for line in reversed(list(lines)):
        found: Optional[JobLine] = timestamped_figures(line)
        if found is None and LINE_PREFIX in line:
            counts = parse_nodes_line(line)
            if counts is not None:
                found = (log_timestamp(line.partition(" ")[0]), counts)
        if found is not None:
            return found
    return None


def job_line_text(
    found: JobLine, now: Optional[datetime] = None, where: str = "replica 0's log"
) -> str:
    """:func:`figures_text`, or ``nodes: 2 training, 1 standby (as of 3s ago, ...)``."""
    at, said = found
    if isinstance(said, NodeCounts):
        return said.text() + as_of(at, now, where)
    return figures_text((at, said), now, where)


def step_text(figures: LineFigures) -> str:
    """``120/200 (60.0%)``; ``120/?`` without a total."""
    if not figures.total:
        return f"{figures.step}/{'?' if figures.total is None else figures.total}"
    return f"{figures.step}/{figures.total} ({100 * min(1.0, figures.step / figures.total):.1f}%)"


def pace_text(figures: LineFigures) -> List[str]:
    """``4.1 steps/s``, ``ETA 29s``: those of the two that are known."""
    parts = [] if figures.rate_per_s is None else [f"{figures.rate_per_s:.3g} steps/s"]
    return parts + ([] if figures.eta is None else [f"ETA {figures.eta}"])


def as_of(at: Optional[datetime], now: Optional[datetime], where: str) -> str:
    """`` (as of 3s ago, log of X)`` (``where`` may be empty); nothing when the time is
    unknown."""
    if at is None:
        return ""
    age_s = ((now or datetime.now(timezone.utc)) - at).total_seconds()
    return f" (as of {format_duration(max(0.0, age_s))} ago{f', {where}' if where else ''})"


def progress_message(
    lines: Iterable[str], now: Optional[datetime] = None, where: str = "replica 0's log"
) -> Optional[str]:
    """The newest ``[job progress]`` line of ``lines`` (each ``TIMESTAMP TEXT``, as the
    log calls return them with timestamps on), in words; while the agent waits for the
    other nodes, its waiting line; None when there is neither."""
    lines = list(lines)
    waiting = waiting_message(lines, now, where)
    if waiting is not None:
        return waiting
    found = newest_job_line(lines)
    return None if found is None else job_line_text(found, now, where)


LogReader = Tuple[str, Callable[[], Optional[List[str]]]]  # where, and how to read its tail


def replicas_progress(
    replicas: Sequence[LogReader], now: Optional[datetime] = None
) -> Optional[str]:
    """:func:`progress_message` of the first log of ``replicas`` (replica 0's, then the
    others' in order, each a name and how to read its tail); where replica 0's has neither a
    progress nor a waiting line (it stands by, or is not there), the newest ``[job
    progress]`` line among the next :data:`PROGRESS_REPLICAS` replicas' logs."""
    if not replicas:
        return None
    (where, read), others = replicas[0], replicas[1 : PROGRESS_REPLICAS + 1]
    lines = read()
    message = None if lines is None else progress_message(lines, now, where)
    if message is not None:
        return message
    found: List[Tuple[JobLine, str]] = []
    for where, read in others:
        lines = read()
        newest = None if lines is None else newest_job_line(lines)
        if newest is not None:
            found.append((newest, where))
    if not found:
        return None
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    newest, where = max(found, key=lambda item: item[0][0] or oldest)
    return job_line_text(newest, now, where)


def join_message(message: str, progress: Optional[str], not_set: str = "") -> str:
    """``message`` with the progress on a line of its own (``not_set``: no message)."""
    if not progress:
        return message
    if not message or message == not_set:
        return progress
    return f"{message}\n{progress}"
