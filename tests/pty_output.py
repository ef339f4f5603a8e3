"""What a program started on a pseudo-terminal writes to it, as it writes it."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Iterator


def pty_chunks(
    main_fd: int, proc: subprocess.Popen[bytes], timeout_s: float
) -> Iterator[tuple[float, bytes]]:
    """(when, bytes) of each read of the pty's main side, until every writer of the pty is
    gone, or the program has ended and nothing more comes, or ``timeout_s`` passed; the main
    side is closed then."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main_fd], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    return
                continue
            try:
                data = os.read(main_fd, 65536)
            except OSError:  # EIO: every writer of the pty is gone
                return
            if not data:
                return
            yield time.monotonic(), data
    finally:
        os.close(main_fd)
