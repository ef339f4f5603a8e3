"""The terminal the workers see, where the agent's output reaches a person's terminal.

Under torchrun a worker inherits the terminal. Here its output passes through the agent (to
be prefixed, kept in files and drawn above the job's bar), so where the agent draws on a
terminal, or local_cwd draws the agent's output on one
(:data:`~torchx_elastic.contract.terminal_size.TERMINAL_SIZE_ENV`), each worker's stdout and
stderr are pseudo-terminals of that terminal's size (``processes.py``): ``isatty()`` is true,
``os.get_terminal_size()`` answers, and a resize reaches the workers (their pseudo-terminals
are resized and they get ``SIGWINCH``). :class:`WorkerTerminal` follows the size.

Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import termios
import threading
from collections.abc import Callable

from torchx_elastic.contract.terminal_size import TERMINAL_SIZE_ENV, read_size

# how often the terminal's size is looked at
POLL_S = 0.25
Size = tuple[int, int]  # columns, lines; 0 0: a terminal that reports no size


def own_size(fd: int) -> Callable[[], Size]:
    """The size of the terminal ``fd`` is (0 0 when it reports none)."""

    def read() -> Size:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            return 0, 0
        return size.columns, size.lines

    return read


def told_size(path: str) -> Callable[[], Size]:
    """The size local_cwd keeps in ``path`` (0 0 until it is there)."""
    return lambda: read_size(path) or (0, 0)


class WorkerTerminal:
    """The size the workers' pseudo-terminals have, followed while the agent runs."""

    def __init__(self, read_size: Callable[[], Size], poll_s: float = POLL_S) -> None:
        self._read_size = read_size
        self.size = read_size()
        self._listeners: list[Callable[[Size], None]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, args=(poll_s,), name="torchx-elastic-terminal", daemon=True
        )
        self._thread.start()

    def open(self) -> tuple[int, int]:
        """A pseudo-terminal for one worker stream, of the current size: (ours, the worker's).

        The worker's end passes bytes through as a pipe does (no ``\\n`` to ``\\r\\n``, no
        echo)."""
        ours, theirs = pty.openpty()
        attrs = termios.tcgetattr(theirs)
        attrs[1] &= ~termios.OPOST
        attrs[3] &= ~(termios.ECHO | termios.ICANON)
        termios.tcsetattr(theirs, termios.TCSANOW, attrs)
        resize(ours, self.size)
        return ours, theirs

    def listen(self, listener: Callable[[Size], None]) -> Callable[[], None]:
        """Call ``listener`` with each new size; returns what stops it."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return stop

    def _follow(self, poll_s: float) -> None:
        while not self._closed.wait(poll_s):
            size = self._read_size()
            if size == self.size:
                continue
            self.size = size
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                listener(size)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2.0)


def resize(fd: int, size: Size) -> None:
    """Give the pseudo-terminal ``fd`` (either end) the size ``size``."""
    columns, lines = size
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    except OSError:  # closed meanwhile
        pass


def workers_terminal(agent_is_on_terminal: bool, stdout_fd: int) -> WorkerTerminal | None:
    """The workers' terminal: the agent's own when it draws on one, local_cwd's when local_cwd
    draws the agent's output on one; None otherwise (pipes, as before)."""
    if agent_is_on_terminal:
        return WorkerTerminal(own_size(stdout_fd))
    path = os.environ.get(TERMINAL_SIZE_ENV)
    return WorkerTerminal(told_size(path)) if path else None
