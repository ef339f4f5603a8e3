"""The agent's console: worker lines as they come, and one progress bar for the node.

- :class:`PlainConsole` (not a terminal: CI, ``kubectl logs``, ``docker logs``, the files
  torchx tails): prefixed lines on the agent's stdout/stderr as the workers wrote them, no
  colour, and every ``status_interval_s`` one plain progress line while the ranks report
  progress (on node rank 0 of a job that has had a standby and whose ranks report none, the
  nodes line, ``[job progress] nodes: 2 training, 1 standby``, every interval). A rank's
  unfinished ``\\r``-rewritten line is not shown there; when local_cwd draws on a terminal
  (:data:`~torchx_elastic.contract.live_rows.LIVE_ROWS_ENV`), it is kept in that file for
  local_cwd to draw (``live_rows.py``).
- :class:`LiveConsole` (a terminal): the same lines, prefixes coloured per rank, scrolling
  above one live progress bar drawn by ``rich`` (imported only here, only then).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from torchx_elastic.agent.console.output.live_rows import LiveRowsFile
from torchx_elastic.agent.console.output.sinks import Stream
from torchx_elastic.agent.console.output.terminal import WorkerTerminal, workers_terminal
from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.agent.console.progress.exchange import JobProgressExchange
from torchx_elastic.agent.console.progress.node_summary import (
    JobProgress,
    details,
    status_line,
    summarize,
)
from torchx_elastic.contract.agent_args import ConsoleMode
from torchx_elastic.contract.job_progress import JobSummary, is_nodes_line
from torchx_elastic.contract.live_rows import LIVE_ROWS_ENV
from torchx_elastic.rich_job_bar import rich_bar

if TYPE_CHECKING:
    from rich.console import RenderableType

DEFAULT_STATUS_INTERVAL_S = 5.0
# set in every task of a batch system's job: there stdout may be a pseudo-terminal (Slurm's
# ``srun --unbuffered``, which torchx's sbatch script asks for with SLURM_UNBUFFEREDIO=1)
# that ends up in a log file, not in front of a person
BATCH_JOB_MARKERS = (
    "SLURM_JOB_ID",  # Slurm
    "SLURM_STEP_ID",
    "PBS_JOBID",  # PBS / Torque
    "LSB_JOBID",  # LSF
    "FLUX_JOB_ID",  # Flux
    "SGE_TASK_ID",  # Grid Engine
    "COBALT_JOBID",  # Cobalt
)
# a person's terminal inside a batch job: Slurm's ``srun --pty`` sets this
INTERACTIVE_BATCH_MARKERS = ("SLURM_PTY_PORT",)
RANK_COLOURS = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "red",
    "bright_cyan",
    "bright_magenta",
)


class _Progress:
    """The node's ranks (updated each attempt) and their activity, summarized on demand;
    with a job exchange, the whole job's summary on the rank-0 node."""

    def __init__(self, activity: RankActivity, job: JobProgressExchange | None = None) -> None:
        self.activity = activity
        self.job = job
        self.node = 0
        self.global_ranks: dict[int, int] = {}
        # the job-wide line while the first rendezvous round waits (agent/rendezvous/waiting.py)
        self.waiting: str | None = None

    def start_attempt(self, node_rank: int, global_ranks: dict[int, int]) -> None:
        self.node, self.global_ranks = node_rank, global_ranks

    def summary(self) -> JobProgress | None:
        return summarize(self.activity.snapshot(), self.global_ranks)

    def job_summary(self) -> JobSummary | None:
        """The whole job's figures: on the rank-0 node of a job that exchanges progress."""
        return self.job.latest() if self.job is not None else None

    def status_line(self) -> str | None:
        """The plain status line: the job's on node rank 0, none on the other nodes (one
        line per job, not per node); the node's own without an exchange. Before the first
        round, the rendezvous host's waiting line."""
        if self.waiting is not None:
            return self.waiting
        if self.job is not None and self.job.joined:
            job = self.job.latest()
            if job is not None:
                return job.line()
            nodes = self.job.latest_nodes()
            return None if nodes is None else nodes.line()
        progress = self.summary()
        return None if progress is None else status_line(progress, self.node)


class PlainConsole:
    """Prefixed lines on two byte streams; a plain progress line every few seconds."""

    def __init__(
        self,
        activity: RankActivity,
        out: BinaryIO | None = None,
        err: BinaryIO | None = None,
        status_interval_s: float = DEFAULT_STATUS_INTERVAL_S,
        job: JobProgressExchange | None = None,
        live_rows: LiveRowsFile | None = None,
        terminal: WorkerTerminal | None = None,
    ) -> None:
        self._progress = _Progress(activity, job)
        self._live_rows = live_rows
        self.terminal = terminal
        self._streams = {"stdout": out or sys.stdout.buffer, "stderr": err or sys.stderr.buffer}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._status_interval_s = status_interval_s
        self._last_status: str | None = None
        self._thread: threading.Thread | None = None
        if status_interval_s > 0:
            self._thread = threading.Thread(
                target=self._status_loop, name="torchx-elastic-status", daemon=True
            )
            self._thread.start()

    def start_attempt(self, node_rank: int, global_ranks: dict[int, int]) -> None:
        self._progress.start_attempt(node_rank, global_ranks)

    def lines(self, stream: Stream, rank: int, prefix: bytes, lines: list[bytes]) -> None:
        text = prefix + (b"\n" + prefix).join(lines) + b"\n"
        with self._lock:
            out = self._streams[stream]
            out.write(text)
            out.flush()

    def transient(self, rank: int, stream: Stream, prefix: bytes, rows: list[bytes]) -> None:
        """Not shown: a rewritten line appears once, in its final form, when it ends (and
        meanwhile in the live rows file, if local_cwd draws it)."""
        if self._live_rows is not None:
            self._live_rows.set(rank, stream, prefix, rows)

    def waiting_for_nodes(self, line: str | None) -> None:
        """The progress line says what the first round waits for (printed when it changes)."""
        self._progress.waiting = line
        if line is not None:
            self.print_status()

    def print_status(self, again: bool = False) -> None:
        """Print the progress line now if the ranks moved since the last one; the nodes line
        ``again`` though it did not change (its time tells ``torchx status`` how fresh it is)."""
        text = self._progress.status_line()
        if text is None or (text == self._last_status and not (again and is_nodes_line(text))):
            return
        self._last_status = text
        line = text.encode() + b"\n"
        with self._lock:
            out = self._streams["stderr"]
            out.write(line)
            out.flush()

    def _status_loop(self) -> None:
        while not self._closed.wait(self._status_interval_s):
            self.print_status(again=True)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._live_rows is not None:
            self._live_rows.close()
        if self.terminal is not None:
            self.terminal.close()
        self.print_status()


class LiveConsole:
    """Lines scrolling above one live progress bar, on a terminal, drawn with ``rich``."""

    def __init__(
        self,
        activity: RankActivity,
        file: IO[str] | None = None,
        job: JobProgressExchange | None = None,
        terminal: WorkerTerminal | None = None,
    ) -> None:
        from rich.console import Console as RichConsole
        from rich.live import Live

        self._progress = _Progress(activity, job)
        self.terminal = terminal
        self._transients: dict[tuple[int, Stream], tuple[str, list[str]]] = {}
        self._styles: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._console = RichConsole(
            file=file or sys.stdout, force_terminal=True, highlight=False, emoji=False
        )
        self._live = Live(
            _Renderable(self._render),
            console=self._console,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._started = self._closed = False

    def start_attempt(self, node_rank: int, global_ranks: dict[int, int]) -> None:
        self._progress.start_attempt(node_rank, global_ranks)
        with self._lock:
            start = not self._started and not self._closed
            self._started = True
        if start:  # the live display (and its hidden cursor) begins with the first workers
            self._live.start()

    def waiting_for_nodes(self, line: str | None) -> None:
        """Not drawn: the live display starts with the first workers, after the round (the
        agent's own waiting lines are on the terminal)."""

    def _text(self, rank: int, prefix: bytes, line: bytes) -> Any:
        from rich.text import Text

        body = line.decode("utf-8", "replace")
        text = Text(prefix.decode("utf-8", "replace"), style=self._style(rank))
        text.append_text(Text.from_ansi(body) if "\x1b" in body else Text(body))
        return text

    def _style(self, rank: int) -> Any:
        from rich.style import Style

        style = self._styles.get(rank)
        if style is None:
            style = self._styles[rank] = Style(color=RANK_COLOURS[rank % len(RANK_COLOURS)])
        return style

    def lines(self, stream: Stream, rank: int, prefix: bytes, lines: list[bytes]) -> None:
        from rich.segment import Segment, Segments

        # segments, not Text: no re-wrapping or markup work per line (the terminal wraps)
        head = Segment(prefix.decode("utf-8", "replace"), self._style(rank))
        newline = Segment("\n")
        segments: list[Segment] = []
        for line in lines:
            if b"\x1b" in line:  # the worker's own colours: parsed, so no stray codes leak
                segments += self._text(rank, prefix, line).render(self._console)
            else:
                segments += (head, Segment(line.decode("utf-8", "replace")))
            segments.append(newline)
        # no lock of ours here: rich's Live holds its own while it calls _render
        self._console.print(Segments(segments), end="", soft_wrap=True)

    def transient(self, rank: int, stream: Stream, prefix: bytes, rows: list[bytes]) -> None:
        with self._lock:
            if not rows:
                self._transients.pop((rank, stream), None)
            else:
                self._transients[(rank, stream)] = (
                    prefix.decode("utf-8", "replace"),
                    [row.decode("utf-8", "replace") for row in rows],
                )

    def _render(self) -> RenderableType:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        parts: list[RenderableType] = []
        with self._lock:
            transients = sorted(self._transients.items())
        for (rank, _), (prefix, rows) in transients:
            for body in rows:
                text = self._text(rank, prefix.encode(), body.encode())
                text.no_wrap, text.overflow = True, "ellipsis"  # one screen row each, always
                parts.append(text)
        job = self._progress.job_summary()
        progress = None if job is not None else self._progress.summary()
        if job is not None:
            parts.append(rich_bar(job))
        elif progress is not None:
            grid = Table.grid(padding=(0, 1))
            grid.add_row(
                Text(f"n{self._progress.node}", style="bold"),
                ProgressBar(total=progress.total, completed=progress.slowest_step, width=30),
                Text(f"{progress.slowest_step}/{progress.total or '?'}"),
                Text(details(progress), style="dim"),
            )
            parts.append(grid)
        return Group(*parts)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if started:
            self._live.refresh()
            self._live.stop()
        if self.terminal is not None:
            self.terminal.close()


class _Renderable:
    """Re-rendered by ``rich.live.Live`` at every refresh."""

    def __init__(self, render: Callable[[], RenderableType]) -> None:
        self._render = render

    def __rich__(self) -> RenderableType:
        return self._render()


def is_terminal(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def batch_job(environ: Mapping[str, str]) -> str | None:
    """The batch system's variable that says this process is a task of a job, if any, unless
    the task has a person's terminal (``srun --pty``)."""
    if any(environ.get(name) for name in INTERACTIVE_BATCH_MARKERS):
        return None
    return next((name for name in BATCH_JOB_MARKERS if environ.get(name)), None)


def wants_live(
    mode: ConsoleMode, stream: IO[Any], environ: Mapping[str, str] | None = None
) -> bool:
    """``live``; or ``auto`` with a terminal that is not a batch job's log (see
    :data:`BATCH_JOB_MARKERS`)."""
    if mode != "auto":
        return mode == "live"
    return is_terminal(stream) and batch_job(os.environ if environ is None else environ) is None


def make_console(
    mode: ConsoleMode,
    activity: RankActivity,
    status_interval_s: float = DEFAULT_STATUS_INTERVAL_S,
    job: JobProgressExchange | None = None,
) -> PlainConsole | LiveConsole:
    """``auto``: live when the agent's stdout is a person's terminal, plain otherwise (a file,
    a pipe, a batch job's pseudo-terminal); plain, with the ranks' unfinished lines kept in
    the file that local_cwd names when it draws them on its terminal. Either way the workers
    get pseudo-terminals where their output reaches a terminal (``terminal.py``)."""
    live = wants_live(mode, sys.stdout)
    terminal = workers_terminal(live, _fileno(sys.stdout))
    if live:
        return LiveConsole(activity, job=job, terminal=terminal)
    rows_path = os.environ.get(LIVE_ROWS_ENV)
    live_rows = LiveRowsFile(rows_path) if rows_path else None
    return PlainConsole(
        activity,
        status_interval_s=status_interval_s,
        job=job,
        live_rows=live_rows,
        terminal=terminal,
    )


def _fileno(stream: IO[Any]) -> int:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by a test's capture
        return -1


def parse_rank_filter(text: str) -> frozenset[int] | None:
    """``--console-ranks``: ``all`` (or empty), or ranks and ranges, e.g. ``0,2-3``."""
    if text.strip() in ("", "all"):
        return None
    ranks: set[int] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise ValueError(
                f"--console-ranks {text!r}: {item!r} is not a rank or a range LOW-HIGH;"
                " expected e.g. 0 or 0,2-3 or all"
            )
        ranks.update(range(int(low), int(high if dash else low) + 1))
    return frozenset(ranks)
