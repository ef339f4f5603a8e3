"""The ranks' unfinished rows, kept in a file for local_cwd to draw.

See :mod:`torchx_elastic.contract.live_rows`. :class:`LiveRowsFile` takes the plain
console's transient rows (a rank's current ``\\r`` bar, or the region it redraws on its
pseudo-terminal, or none) and rewrites the file at most every ``interval_s`` while they
change; closing it removes the file.
"""

from __future__ import annotations

import contextlib
import os
import threading

from torchx_elastic.contract.live_rows import LiveRow, write_rows

WRITE_INTERVAL_S = 0.1


class LiveRowsFile:
    """Each rank's current unfinished line, rewritten into ``path`` as it changes."""

    def __init__(self, path: str, interval_s: float = WRITE_INTERVAL_S) -> None:
        self.path = path
        self._rows: dict[tuple[int, str], list[LiveRow]] = {}
        self._changed = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._loop, name="torchx-elastic-rows", daemon=True)
        self._thread.start()

    def set(self, rank: int, stream: str, prefix: bytes, rows: list[bytes]) -> None:
        """Rank ``rank``'s unfinished rows on ``stream`` are ``rows`` now (none: it has none)."""
        with self._lock:
            if not rows:
                if self._rows.pop((rank, stream), None) is None:
                    return
            else:
                label = prefix.decode("utf-8", "replace")
                self._rows[(rank, stream)] = [
                    LiveRow(rank, label, row.decode("utf-8", "replace")) for row in rows
                ]
        self._changed.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._changed.wait()
            if self._closed.is_set():
                return
            self._changed.clear()
            with self._lock:
                rows = [row for key in sorted(self._rows) for row in self._rows[key]]
            with contextlib.suppress(OSError):  # the log directory is gone: nobody draws
                write_rows(self.path, rows)
            self._closed.wait(self._interval_s)

    def close(self) -> None:
        """No more rows: the file goes."""
        self._closed.set()
        self._changed.set()
        self._thread.join(timeout=2.0)
        with contextlib.suppress(OSError):
            os.remove(self.path)
