"""The agent's stdout and stderr, also copied in order into one file.

A scheduler that keeps a node's stdout and stderr in two files (torchx's local schedulers)
cannot tell, reading them, which line came first: a worker's line on stdout written after
one on stderr would come out before it. With ``CONSOLE_COPY_ENV`` set, everything the
agent's Python code writes to either stream (its workers' lines, its own messages, its log
records) is also appended to that file, under one lock, in the order it was written; the
scheduler's combined log reads that file.
"""

from __future__ import annotations

import io
import os
import sys
import threading

from torchx_elastic.contract import CONSOLE_COPY_ENV


class _CopiedFd(io.RawIOBase):
    """Writes go to ``fd`` and, in the same order for every stream, to ``copy``."""

    def __init__(self, fd: int, copy: int, lock: threading.Lock) -> None:
        super().__init__()
        self._fd, self._copy, self._lock = fd, copy, lock

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: bytes) -> int:  # type: ignore[override]
        with self._lock:
            written = os.write(self._fd, data)
            try:
                os.write(self._copy, bytes(memoryview(data)[:written]))
            except OSError:
                pass  # the copy is a convenience: the streams themselves are what counts
            return written


def _copied(stream: io.TextIOWrapper, copy: int, lock: threading.Lock) -> io.TextIOWrapper:
    raw = _CopiedFd(stream.fileno(), copy, lock)
    return io.TextIOWrapper(
        io.BufferedWriter(raw),  # type: ignore[type-var]
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=True,
        write_through=stream.write_through,
    )


def copy_console_in_order() -> int | None:
    """With ``CONSOLE_COPY_ENV`` set: ``sys.stdout`` and ``sys.stderr`` from now on also
    append to that file (before anything keeps a reference to them: logging's handler).
    The copy's descriptor, which a process forked from here keeps to go on copying (the
    fork server: its own errors); None without a copy."""
    path = os.environ.get(CONSOLE_COPY_ENV)
    streams = (sys.stdout, sys.stderr)
    if not path or not all(isinstance(s, io.TextIOWrapper) for s in streams):
        return None
    try:
        copy = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError as err:
        print(f"torchx-elastic: not copying the console to {path}: {err}", file=sys.stderr)
        return None
    lock = threading.Lock()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout = _copied(sys.stdout, copy, lock)  # type: ignore[arg-type]
    sys.stderr = _copied(sys.stderr, copy, lock)  # type: ignore[arg-type]
    return copy
