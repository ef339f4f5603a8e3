"""Where worker output goes: whole lines, prefixed per rank, on the console and in files.

The agent reads every worker's stdout and stderr through pipes (see ``processes.py``) and
feeds the bytes to an :class:`OutputSink`, per local rank and stream. :class:`RankSink` (one
per attempt) writes the raw bytes to the rank's files, assembles whole lines and hands them
to the console (see ``display.py``), which lives for the whole run. Lines are assembled
before they are shown, so partial writes of one rank never tear another rank's line, and a
``\\r``-rewritten line (a worker's own progress bar) is shown as what a terminal would show.
Where the workers have pseudo-terminals (the console's ``terminal``), each stream is played
on a :class:`~torchx_elastic.agent.console.output.screen.Screen` instead: its finished lines
go to the files and the console, plain, and the region it still redraws to the console's
live rows.
"""

from __future__ import annotations

import os
import socket
import string
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Literal, Protocol

from torchx_elastic.agent.console.output.screen import Screen

if TYPE_CHECKING:
    from torchx_elastic.agent.console.output.terminal import WorkerTerminal

Stream = Literal["stdout", "stderr"]
DEFAULT_PREFIX = "[n{node} r{rank}] "
PREFIX_FIELDS = ("node", "rank", "local_rank", "role", "hostname")
# torchrun's template (a ``string.Template``, as torch's agent fills it in)
TORCH_PREFIX_FIELDS = ("role_name", "rank", "local_rank", "hostname")
# a "line" longer than this without a newline is shown in pieces (memory stays bounded)
MAX_LINE_BYTES = 64 * 1024


@dataclass(frozen=True)
class RankOutput:
    """Where one worker's output goes."""

    local_rank: int
    global_rank: int
    node_rank: int
    stdout_path: str
    stderr_path: str


class OutputSink(Protocol):
    # the workers' pseudo-terminals' size (None: their output is on pipes)
    terminal: WorkerTerminal | None

    def feed(self, local_rank: int, stream: Stream, data: bytes) -> None: ...

    def tick(self) -> None:
        """A moment passed (called between reads): a redrawn region may have settled."""

    def end(self, local_rank: int, stream: Stream) -> None: ...

    def close(self) -> None: ...


class Console(Protocol):
    """What a sink shows lines on (see ``display.py``); one per agent run."""

    # where the agent's output reaches a terminal: the one the workers get
    terminal: WorkerTerminal | None

    def start_attempt(self, node_rank: int, global_ranks: dict[int, int]) -> None: ...

    def lines(self, stream: Stream, rank: int, prefix: bytes, lines: list[bytes]) -> None: ...

    def transient(self, rank: int, stream: Stream, prefix: bytes, rows: list[bytes]) -> None:
        """A rank's unfinished rows on ``stream`` are ``rows`` now (none: it has none)."""

    def close(self) -> None: ...


def format_prefix(
    template: str,
    node: int,
    rank: int,
    local_rank: int,
    role: str = "",
    hostname: str | None = None,
) -> str:
    """The template with its fields filled in; a bad template is a ``ValueError`` that says why.

    Two syntaxes: ours, ``str.format`` fields (:data:`PREFIX_FIELDS`, e.g. ``[n{node} r{rank}] ``),
    and torchrun's, recognized by a ``$``: ``${role_name}``, ``${rank}``, ``${local_rank}``,
    ``${hostname}`` filled in as torch does (``string.Template.safe_substitute``: other
    ``${...}`` stay as written, ``$$`` is ``$``). ``hostname``: the short host name, as torch's
    (``socket.gethostname()``)."""
    host = socket.gethostname() if hostname is None else hostname
    if "$" in template:
        return string.Template(template).safe_substitute(
            role_name=role, rank=rank, local_rank=local_rank, hostname=host
        )
    try:
        return template.format(
            node=node, rank=rank, local_rank=local_rank, role=role, hostname=host
        )
    except (KeyError, IndexError, ValueError) as err:
        fields = ", ".join("{" + f + "}" for f in PREFIX_FIELDS)
        torch_fields = ", ".join("${" + f + "}" for f in TORCH_PREFIX_FIELDS)
        raise ValueError(
            f"--log-line-prefix-template {template!r} is not valid ({type(err).__name__}: {err});"
            f" use the fields {fields}, e.g. {DEFAULT_PREFIX!r}, or torchrun's {torch_fields}"
        ) from None


def visible(line: bytes) -> bytes:
    """What a terminal shows of a line rewritten with ``\\r``: the text after the last one."""
    if line.endswith(b"\r"):
        line = line[:-1]
    return line[line.rfind(b"\r") + 1 :]


class LineAssembler:
    """Bytes of one stream in, whole lines out; the partial tail is held back."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> tuple[list[bytes], bytes | None]:
        """Complete lines (visible text, no newline) and the pending ``\\r`` segment, if any."""
        complete, newline, rest = (self._pending + data).rpartition(b"\n")
        lines = complete.split(b"\n") if newline else []
        if b"\r" in complete:
            lines = [visible(line) for line in lines]
        transient = None
        if b"\r" in rest:
            transient = visible(rest)
            # keep only the segment a terminal would still show (and a trailing "\r"'s text)
            rest = rest[rest.rfind(b"\r", 0, len(rest) - 1) + 1 :]
        if len(rest) > MAX_LINE_BYTES:
            lines.append(visible(rest))
            rest, transient = b"", None
        self._pending = rest
        return lines, transient

    def flush(self) -> bytes | None:
        """The unterminated last line at end of stream, if any."""
        rest, self._pending = self._pending, b""
        return visible(rest) if rest else None


def _streams(tee: int | Mapping[int, int], local_rank: int) -> int:
    return tee if isinstance(tee, int) else tee.get(local_rank, 0)


@dataclass(frozen=True)
class SinkOptions:
    """What of the workers' output reaches the console, and how its lines are labelled.

    ``show_ranks`` (global ranks; None: all), ``show_local_ranks`` (torchrun's
    ``--local-ranks-filter``) and ``tee`` (1 stdout, 2 stderr, 3 both; or per local rank)
    filter the console only; the files always get everything. Lines containing one of
    ``duplicate_filters[stream]`` are also copied to a file of their own (torchrun's
    ``--duplicate-stdout-filters``).
    """

    prefix_template: str = DEFAULT_PREFIX
    tee: int | Mapping[int, int] = 3
    show_ranks: Collection[int] | None = None
    role: str = ""
    show_local_ranks: Collection[int] | None = None
    duplicate_filters: Mapping[Stream, Sequence[str]] = field(default_factory=dict)


DEFAULT_SINK_OPTIONS = SinkOptions()


class RankSink:
    """One attempt's output: raw bytes to per-rank files, whole lines to the console
    (filtered and labelled as ``options`` say); the lines ``options.duplicate_filters``
    pick are copied to ``duplicate_paths[stream]``."""

    def __init__(
        self,
        ranks: list[RankOutput],
        console: Console,
        options: SinkOptions = DEFAULT_SINK_OPTIONS,
        duplicate_paths: Mapping[Stream, str] | None = None,
    ) -> None:
        prefix_template, tee, role = options.prefix_template, options.tee, options.role
        show_ranks, show_local_ranks = options.show_ranks, options.show_local_ranks
        self._console = console
        self.outputs = list(ranks)
        self._global = {r.local_rank: r.global_rank for r in ranks}
        self._prefixes = {
            r.local_rank: format_prefix(
                prefix_template, r.node_rank, r.global_rank, r.local_rank, role
            ).encode()
            for r in ranks
        }
        self._shown = {
            (r.local_rank, stream)
            for r in ranks
            for stream, bit in (("stdout", 1), ("stderr", 2))
            if _streams(tee, r.local_rank) & bit
            and (show_ranks is None or r.global_rank in show_ranks)
            and (show_local_ranks is None or r.local_rank in show_local_ranks)
        }
        self._duplicate_filters = {k: tuple(v) for k, v in options.duplicate_filters.items() if v}
        self._duplicates: dict[Stream, BinaryIO] = {}
        for stream in self._duplicate_filters:
            path = (duplicate_paths or {})[stream]
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._duplicates[stream] = open(path, "ab", buffering=0)  # noqa: SIM115
        streams: tuple[Stream, ...] = ("stdout", "stderr")
        self._assemblers = {(r.local_rank, s): LineAssembler() for r in ranks for s in streams}
        self.terminal = console.terminal
        self._screens: dict[tuple[int, Stream], Screen] = {}
        if self.terminal is not None:
            rows = self.terminal.size[1]
            self._screens = {key: Screen(rows) for key in self._assemblers}
        self._live: dict[tuple[int, Stream], list[bytes]] = {}
        self._files: dict[tuple[int, str], BinaryIO] = {}
        self._open_streams = {r.local_rank: 2 for r in ranks}
        self.ended_at: dict[int, float] = {}
        """Wall time each rank's output ended (both pipes closed): about when it exited."""
        self._lock = threading.Lock()
        for r in ranks:
            for stream, path in (("stdout", r.stdout_path), ("stderr", r.stderr_path)):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._files[(r.local_rank, stream)] = open(path, "ab", buffering=0)  # noqa: SIM115
        node = ranks[0].node_rank if ranks else 0
        console.start_attempt(node, dict(self._global))

    def feed(self, local_rank: int, stream: Stream, data: bytes) -> None:
        key = (local_rank, stream)
        screen = self._screens.get(key)
        if screen is not None:
            if self.terminal is not None:
                screen.rows = self.terminal.size[1]
            self._finished(key, screen.feed(data), screen.live())
            return
        self._files[key].write(data)
        if key not in self._shown and stream not in self._duplicates:
            return
        lines, transient = self._assemblers[key].feed(data)
        self._duplicate(stream, lines)
        if key not in self._shown:
            return
        rank, prefix = self._global[local_rank], self._prefixes[local_rank]
        if lines:
            self._console.lines(stream, rank, prefix, lines)
        if transient is not None:
            self._console.transient(rank, stream, prefix, [transient])
        elif lines:
            self._console.transient(rank, stream, prefix, [])

    def tick(self) -> None:
        if not self._screens:
            return
        now = time.monotonic()
        for key, screen in self._screens.items():
            finished = screen.settled(now)
            if finished:
                self._finished(key, finished, screen.live())

    def _finished(self, key: tuple[int, Stream], lines: list[str], live: list[str]) -> None:
        """A screen's finished lines to the file and the console; its live rows to the
        console when they changed."""
        local_rank, stream = key
        done = [line.encode() for line in lines]
        if done:
            self._files[key].write(b"".join(line + b"\n" for line in done))
            self._duplicate(stream, done)
        if key not in self._shown:
            return
        rank, prefix = self._global[local_rank], self._prefixes[local_rank]
        if done:
            self._console.lines(stream, rank, prefix, done)
        rows = [row.encode() for row in live]
        if rows != self._live.get(key, []):
            self._live[key] = rows
            self._console.transient(rank, stream, prefix, rows)

    def _duplicate(self, stream: Stream, lines: list[bytes]) -> None:
        words = self._duplicate_filters.get(stream)
        if not words or not lines:
            return
        chosen = [line for line in lines if any(w.encode() in line for w in words)]
        if chosen:
            with self._lock:
                self._duplicates[stream].write(b"".join(line + b"\n" for line in chosen))

    def end(self, local_rank: int, stream: Stream) -> None:
        key = (local_rank, stream)
        screen = self._screens.get(key)
        if screen is not None:
            self._finished(key, screen.flush(), [])
            self._stream_ended(local_rank)
            return
        rest = self._assemblers[key].flush()
        if rest is not None:
            self._duplicate(stream, [rest])
        if key in self._shown:
            rank, prefix = self._global[local_rank], self._prefixes[local_rank]
            self._console.transient(rank, stream, prefix, [])
            if rest is not None:
                self._console.lines(stream, rank, prefix, [rest])
        self._stream_ended(local_rank)

    def _stream_ended(self, local_rank: int) -> None:
        with self._lock:
            self._open_streams[local_rank] -= 1
            if self._open_streams[local_rank] == 0:
                self.ended_at[local_rank] = time.time()

    def close(self) -> None:
        for key, screen in self._screens.items():
            self._finished(key, screen.flush(), [])
        for (local_rank, stream), assembler in self._assemblers.items():
            rest = assembler.flush()
            if rest is not None and (local_rank, stream) in self._shown:
                rank, prefix = self._global[local_rank], self._prefixes[local_rank]
                self._console.lines(stream, rank, prefix, [rest])
        for file in [*self._files.values(), *self._duplicates.values()]:
            file.close()
