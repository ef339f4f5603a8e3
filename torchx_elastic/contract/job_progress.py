"""The whole job's progress as the rank-0 node's agent sees it: one value, three forms.

- :class:`JobSummary`: every node's ranks together (slowest and fastest rank with their
  nodes, rate, ETA, quiet ranks); built by the agent (``agent/console/progress/exchange.py``).
- :meth:`JobSummary.line`: the plain ``[job progress] ...`` line the rank-0 agent prints
  every status interval (CI logs, ``docker logs``, ``kubectl logs``); :func:`parse_line`
  reads the figures back, which is how ``torchx status`` on docker and kubernetes finds
  them in replica 0's log.
- :meth:`JobSummary.to_json` / :func:`read_file`: the small file the rank-0 agent rewrites
  in its log directory (``JOB_PROGRESS_FILE``), which ``local_cwd`` draws as a live bar.
- :class:`NodeCounts`: while no rank reports progress (a script that never calls
  ``torchx_elastic.progress``), a job that has had a standby still has its nodes said:
  ``[job progress] nodes: 2 training, 1 standby`` (:func:`parse_nodes_line` reads it back),
  and the same in the file (:func:`read_nodes_file`).

Standard library only: the agent and the schedulers both import it (the ``rich`` bar that
draws a summary is ``torchx_elastic/rich_job_bar.py``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from torchx_elastic.contract import WAITING_FOR_NODES
from torchx_elastic.contract.log_layout import NodeLogs

T = TypeVar("T")
LINE_PREFIX = "[job progress] "
# the line's form while the first rendezvous round waits for nodes (no step yet)
WAITING_LINE_PREFIX = f"{LINE_PREFIX}{WAITING_FOR_NODES}"
MAX_QUIET_SHOWN = 4
STANDBY = "standby"  # ``of 2/2 ranks on 2/2 nodes, 1 standby``: nodes waiting as spares
NODES_LINE_PREFIX = f"{LINE_PREFIX}nodes: "  # the line's form without progress figures


@dataclass(frozen=True)
class QuietRank:
    """A rank that reported before but has been silent for ``silent_s``."""

    rank: int
    node: int
    silent_s: float


@dataclass(frozen=True)
class JobSummary:
    """Where the ranks of every node are; the job moves at its slowest rank's pace."""

    step: int  # the slowest rank's step
    total: int | None
    slowest_rank: int
    slowest_node: int
    fastest_rank: int
    fastest_node: int
    fastest_step: int
    rate_per_s: float | None  # the slowest rank's, over its last 30 s
    eta_s: float | None
    ranks_reporting: int
    ranks: int  # ranks of the nodes that reported
    nodes_reporting: int
    nodes: int
    quiet: tuple[QuietRank, ...] = field(default=())
    time_s: float = 0.0  # wall-clock time (seconds since the epoch) of the figures
    # nodes standing by as spares (None: the job never had one)
    standbys: int | None = None

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.step / self.total)

    def details(self) -> str:
        """``slowest r3 (n1) 120, fastest r0 (n0) 130, 4.1 steps/s, ETA 3m05s, quiet: ...``"""
        parts = [
            f"slowest r{self.slowest_rank} (n{self.slowest_node}) {self.step}",
            f"fastest r{self.fastest_rank} (n{self.fastest_node}) {self.fastest_step}",
        ]
        parts += pace_parts(self.rate_per_s, self.eta_s)
        if self.quiet:
            shown = [
                f"r{q.rank} (n{q.node}) {format_duration(q.silent_s)}"
                for q in self.quiet[:MAX_QUIET_SHOWN]
            ]
            more = len(self.quiet) - MAX_QUIET_SHOWN
            parts.append("quiet: " + " ".join(shown) + (f" +{more} more" if more > 0 else ""))
        return ", ".join(parts)

    def counts(self) -> str:
        """``of 4/4 ranks on 2/2 nodes`` (ranks that reported a step / ranks of the nodes),
        ``, 1 standby`` once the job has had spares."""
        text = (
            f"of {self.ranks_reporting}/{self.ranks} ranks"
            f" on {self.nodes_reporting}/{self.nodes} nodes"
        )
        return text if self.standbys is None else f"{text}, {self.standbys} {STANDBY}"

    def line(self) -> str:
        """The plain status line (no colour, no cursor movement)."""
        total = "?" if self.total is None else str(self.total)
        fraction = self.fraction
        percent = "" if fraction is None else f" ({100 * fraction:.1f}%)"
        return f"{LINE_PREFIX}{self.step}/{total}{percent} {self.counts()}, {self.details()}"

    def figures(self) -> LineFigures:
        """What its line says (:func:`parse_line` of :meth:`line`)."""
        return LineFigures(
            step=self.step,
            total=self.total,
            ranks_reporting=self.ranks_reporting,
            ranks=self.ranks,
            rate_per_s=self.rate_per_s,
            eta=None if self.eta_s is None else format_duration(self.eta_s),
            quiet=None,
            nodes=self.nodes,
            standbys=self.standbys,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> JobSummary:
        """The summary in ``text``; ``ValueError`` when it is not one."""
        try:
            data: dict[str, Any] = json.loads(text)
            quiet = tuple(QuietRank(**q) for q in data.pop("quiet", ()))
            return cls(**data, quiet=quiet)
        except (TypeError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a job progress summary: {err}") from None


@dataclass(frozen=True)
class NodeCounts:
    """The job's nodes while no rank reports progress, said once it has had a standby."""

    nodes: int  # of the round: training
    standbys: int  # standing by as spares
    time_s: float = 0.0  # wall-clock time (seconds since the epoch) of the counts

    def text(self) -> str:
        """``nodes: 2 training, 1 standby``"""
        return nodes_text(self.nodes, self.standbys)

    def line(self) -> str:
        """``[job progress] nodes: 2 training, 1 standby``"""
        return f"{LINE_PREFIX}{self.text()}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> NodeCounts:
        """The counts in ``text``; ``ValueError`` when they are not (a :class:`JobSummary`
        is not)."""
        try:
            data: dict[str, Any] = json.loads(text)
            return cls(**data)
        except (TypeError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"not the job's node counts: {err}") from None


def is_nodes_line(text: str) -> bool:
    """Whether ``text`` is the line of :class:`NodeCounts` (not of a :class:`JobSummary`)."""
    return text.startswith(NODES_LINE_PREFIX)


def nodes_text(nodes: int, standbys: int) -> str:
    """``nodes: 2 training, 1 standby``"""
    return f"nodes: {nodes} training, {standbys} {STANDBY}"


def pace_parts(rate_per_s: float | None, eta_s: float | None) -> list[str]:
    """``4.1 steps/s``, ``ETA 3m05s``: those of the two that are known."""
    parts: list[str] = []
    if rate_per_s is not None:
        parts.append(f"{rate_per_s:.3g} steps/s")
    if eta_s is not None:
        parts.append(f"ETA {format_duration(eta_s)}")
    return parts


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def write_file(directory: str, summary: JobSummary | NodeCounts) -> str:
    """Replace ``directory/job_progress.json`` atomically (readers never see half a file)."""
    path = NodeLogs(directory).job_progress
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as file:
        file.write(summary.to_json())
    os.replace(temporary, path)
    return path


def read_file(path: str) -> JobSummary | None:
    """The summary in ``path``; None when there is none (yet) or it cannot be read."""
    return _read(path, JobSummary.from_json)


def read_nodes_file(path: str) -> NodeCounts | None:
    """The node counts in ``path``; None when it holds none (or a summary, or is absent)."""
    return _read(path, NodeCounts.from_json)


def _read(path: str, parse: Callable[[str], T]) -> T | None:
    try:
        with open(path) as file:
            return parse(file.read())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class LineFigures:
    """What :func:`parse_line` reads back from a ``[job progress]`` line."""

    step: int
    total: int | None
    ranks_reporting: int
    ranks: int
    rate_per_s: float | None
    eta: str | None  # as written, e.g. ``3m05s``
    quiet: str | None  # as written, e.g. ``r5 (n1) 45s``
    nodes: int | None = None  # of the round
    standbys: int | None = None  # nodes standing by (None: the job never had one)


_LINE = re.compile(
    re.escape(LINE_PREFIX) + r"(?P<step>\d+)/(?P<total>\d+|\?)(?: \([\d.]+%\))?"
    r" of (?P<reporting>\d+)/(?P<ranks>\d+) ranks on \d+/(?P<nodes>\d+) nodes"
    r"(?:, (?P<standbys>\d+) " + STANDBY + ")?"
    r"(?:.*?, (?P<rate>[\d.e+-]+) steps/s)?"
    r"(?:.*?, ETA (?P<eta>[\dhms]+))?"
    r"(?:.*?, quiet: (?P<quiet>.*))?\s*$"
)


def parse_line(line: str) -> LineFigures | None:
    """The figures of a ``[job progress]`` line (anywhere in ``line``, e.g. after a log
    prefix or a timestamp); None when ``line`` is not one."""
    match = _LINE.search(line)
    if match is None:
        return None
    rate, total = match["rate"], match["total"]
    try:
        rate_per_s = None if rate is None else float(rate)
    except ValueError:
        rate_per_s = None
    return LineFigures(
        step=int(match["step"]),
        total=None if total == "?" else int(total),
        ranks_reporting=int(match["reporting"]),
        ranks=int(match["ranks"]),
        rate_per_s=rate_per_s,
        eta=match["eta"],
        quiet=match["quiet"],
        nodes=int(match["nodes"]),
        standbys=None if match["standbys"] is None else int(match["standbys"]),
    )


_NODES_LINE = re.compile(
    re.escape(NODES_LINE_PREFIX)
    + r"(?P<nodes>\d+) training, (?P<standbys>\d+) "
    + STANDBY
    + r"\s*$"
)


def parse_nodes_line(line: str) -> NodeCounts | None:
    """The counts of a ``[job progress] nodes: ...`` line (anywhere in ``line``, as
    :func:`parse_line`); None when ``line`` is not one. Its time is unknown (0)."""
    match = _NODES_LINE.search(line)
    if match is None:
        return None
    return NodeCounts(nodes=int(match["nodes"]), standbys=int(match["standbys"]))
