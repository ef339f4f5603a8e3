"""Whole lines of log files that are still being written (local_cwd's ``torchx log``).

torchx's local scheduler reads a replica's log file in 64 kB chunks and hands out what it
read, so a line whose writer is half way through comes out in two pieces (and the CLI prints
each piece as a line). Here a line is handed out only once its newline is in the file; the
unfinished rest of a file is held back until more arrives or the job has ended.

Several files (a replica's stdout and stderr) are followed together: each file's lines
stay whole and in order, and lines of different files come out in the order they were read.
"""

from __future__ import annotations

import codecs
import os
import time
from typing import BinaryIO, Callable, Iterator, List, Optional, Sequence

READ_BYTES = 64 * 1024
POLL_S = 0.1


class _FileLines:
    """One file's complete lines, as they are completed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Optional[BinaryIO] = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def read(self) -> Optional[List[str]]:
        """The lines completed by the next bytes of the file; ``None``: no new bytes."""
        if self._file is None:
            if not os.path.isfile(self.path):
                return None
            self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        data = self._file.read(READ_BYTES)
        if not data:
            return None
        self._pending += self._decoder.decode(data)
        *lines, self._pending = self._pending.split("\n")
        return [line + "\n" for line in lines]

    def rest(self) -> List[str]:
        """What is left after the writer is gone: a last line without a newline gets one."""
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return [rest + "\n"] if rest else []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def follow_lines(
    paths: Sequence[str], finished: Callable[[], bool], poll_s: float = POLL_S
) -> Iterator[str]:
    """Whole lines of ``paths`` until ``finished()`` and every byte of them is read.

    ``finished`` is asked before each round of reads, so whatever was written before the
    job ended is read and handed out before the iterator stops.
    """
    files = [_FileLines(path) for path in paths]
    try:
        while True:
            done = finished()
            progressed = False
            for f in files:
                while (lines := f.read()) is not None:
                    progressed = True
                    yield from lines
            if done and not progressed:
                for f in files:
                    yield from f.rest()
                return
            if not progressed:
                time.sleep(poll_s)
    finally:
        for f in files:
            f.close()


def tail_lines(path: str, max_bytes: int = READ_BYTES) -> List[str]:
    """The whole lines among the last ``max_bytes`` of a file; none when it cannot be read."""
    try:
        with open(path, "rb") as file:
            start = max(0, os.path.getsize(path) - max_bytes)
            file.seek(start)
            data = file.read(max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if start else lines  # the first is cut
