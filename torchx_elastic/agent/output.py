"""Where worker output goes: whole lines, prefixed per rank, on the console and in files.

The agent reads every worker's stdout and stderr through pipes (see ``processes.py``) and
feeds the bytes here, per local rank and stream. Lines are assembled before they are shown,
so partial writes of one rank never tear another rank's line.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import BinaryIO, Literal, Protocol

Stream = Literal["stdout", "stderr"]
DEFAULT_PREFIX = "[n{node} r{rank}] "


@dataclass(frozen=True)
class RankOutput:
    """Where one worker's output goes."""

    local_rank: int
    global_rank: int
    node_rank: int
    stdout_path: str
    stderr_path: str


class OutputSink(Protocol):
    def feed(self, local_rank: int, stream: Stream, data: bytes) -> None: ...

    def end(self, local_rank: int, stream: Stream) -> None: ...

    def close(self) -> None: ...


class PrefixedConsole:
    """Writes each complete line once, prefixed, to the console; raw bytes to per-rank files."""

    def __init__(
        self,
        ranks: list[RankOutput],
        prefix_template: str = DEFAULT_PREFIX,
        tee: int = 3,
        console_out: BinaryIO | None = None,
        console_err: BinaryIO | None = None,
    ) -> None:
        self._ranks = {r.local_rank: r for r in ranks}
        self._prefixes = {
            r.local_rank: prefix_template.format(
                node=r.node_rank, rank=r.global_rank, local_rank=r.local_rank
            ).encode()
            for r in ranks
        }
        self._show = {"stdout": bool(tee & 1), "stderr": bool(tee & 2)}
        self._console = {
            "stdout": console_out or sys.stdout.buffer,
            "stderr": console_err or sys.stderr.buffer,
        }
        self._partial: dict[tuple[int, str], bytes] = {}
        self._files: dict[tuple[int, str], BinaryIO] = {}
        self._lock = threading.Lock()
        for r in ranks:
            for stream, path in (("stdout", r.stdout_path), ("stderr", r.stderr_path)):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self._files[(r.local_rank, stream)] = open(path, "ab", buffering=0)  # noqa: SIM115

    def feed(self, local_rank: int, stream: Stream, data: bytes) -> None:
        key = (local_rank, stream)
        self._files[key].write(data)
        pending = self._partial.get(key, b"") + data
        complete, _, rest = pending.rpartition(b"\n")
        self._partial[key] = rest
        if complete:
            self._show_lines(local_rank, stream, complete.split(b"\n"))

    def end(self, local_rank: int, stream: Stream) -> None:
        rest = self._partial.pop((local_rank, stream), b"")
        if rest:
            self._show_lines(local_rank, stream, [rest])

    def _show_lines(self, local_rank: int, stream: Stream, lines: list[bytes]) -> None:
        if not self._show[stream]:
            return
        prefix = self._prefixes[local_rank]
        text = b"".join(prefix + line + b"\n" for line in lines)
        with self._lock:
            out = self._console[stream]
            out.write(text)
            out.flush()

    def close(self) -> None:
        for local_rank, stream in list(self._partial):
            self.end(local_rank, stream)  # type: ignore[arg-type]
        for file in self._files.values():
            file.close()
