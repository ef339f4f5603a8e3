"""One live progress bar of the whole job at the bottom of the user's terminal (local_cwd).

``torchx run -s local_cwd`` tails every replica's log file on threads of its own and prints
each line, prefixed ``role/N``, to its stderr: the agents never see the terminal. While the
job's logs are followed and stderr is a terminal, :class:`TerminalBar` takes the
terminal's place: stdout and stderr (file descriptors 1 and 2, so every writer of this
process is caught: torchx's log threads, its logger, warnings) become pipes whose lines a
thread prints through ``rich`` above one live bar, redrawn 4 times a second from the
``job_progress.json`` that the job's rank-0 agent rewrites
(``torchx_elastic.contract.job_progress``). Above the bar, one row per rank that is
redrawing a line with carriage returns (its own progress bar), as the agent draws them on a
terminal: the agents keep those lines in a file per replica
(``torchx_elastic.contract.live_rows``). A terminal that reports no size (a bare pty) is
drawn on as one of 80 columns.
:meth:`TerminalBar.stop` gives the terminal back, the bar's last state left on screen.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import logging
import os
import selectors
import struct
import sys
import termios
import threading
import time
from typing import (
    IO,
    TYPE_CHECKING,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

from torchx_elastic.contract.job_progress import LINE_PREFIX, JobSummary, read_file
from torchx_elastic.contract.live_rows import LiveRow, read_rows
from torchx_elastic.contract.log_layout import LocalAppLogs
from torchx_elastic.contract.terminal_size import write_size
from torchx_elastic.rich_job_bar import rich_bar
from torchx_elastic.schedulers import role_status
from torchx_elastic.schedulers.role_status import AppRoleStatus

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

log = logging.getLogger(__name__)

REFRESH_PER_SECOND = 4
DEFAULT_COLUMNS, DEFAULT_LINES = 80, 25  # a terminal that reports no size (rich's fallback)
DRAIN_S = 1.0  # at the bar's end, how long the copier may take to print what is left
_READ_BYTES = 65536


def progress_files(app_log_dir: str) -> List[str]:
    """Where a local_cwd job's rank-0 agents write the job's progress, one per role."""
    return sorted(glob.glob(LocalAppLogs(app_log_dir).agents("*").job_progress))


def terminal_wanted(stream: IO[str]) -> bool:
    """Whether to draw: ``stream`` (torchx prints logs to stderr) is a capable terminal."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


# what the roles' status extensions read (ft.ddp: the Lighthouse's last quorum), read again
# at each drawing of several roles' bars
StatusReader = Callable[[], AppRoleStatus]
# (torchx's label of a replica's lines, ``role/N``, and the file its agent keeps rows in)
RowFiles = Sequence[Tuple[str, str]]
REPLICA_LABEL_STYLE = "green"  # as torchx colours ``role/N`` before a replica's lines


def live_rows(files: RowFiles) -> List[Tuple[str, LiveRow]]:
    """Every replica's ranks' unfinished lines, with the replica's label."""
    return [(label, row) for label, path in files for row in read_rows(path)]


def _row_text(label: str, row: LiveRow) -> RenderableType:
    """A rank's unfinished line, labelled as its finished lines will be: one screen row."""
    from rich.text import Text

    text = Text()
    text.append(label, style=REPLICA_LABEL_STYLE)
    text.append(" " + row.prefix)
    text.append_text(Text.from_ansi(row.text) if "\x1b" in row.text else Text(row.text))
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def terminal_size(fd: int) -> Optional[os.terminal_size]:
    """The terminal's size; None when it cannot be read or is 0x0 (a bare pty)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size if size.columns > 0 and size.lines > 0 else None


class _Bar:
    """The live part, re-rendered by ``rich.live.Live`` at every refresh."""

    def __init__(
        self,
        files: Callable[[], List[str]],
        console: Console,
        term_fd: int,
        status: Optional[StatusReader] = None,
        row_files: RowFiles = (),
        size_file: Optional[str] = None,
    ) -> None:
        self._files = files
        self._status = status
        self._console = console
        self._term_fd = term_fd
        self._cache: Dict[str, tuple[float, Optional[JobSummary]]] = {}
        self._row_files = row_files
        self._size_file = size_file
        self._size_told: Optional[tuple[int, int]] = None
        self.ending = False  # the last drawing: no unfinished line is left on screen

    def summaries(self) -> List[tuple[str, JobSummary]]:
        found = []
        for path in self._files():
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            cached = self._cache.get(path)
            if cached is None or cached[0] != mtime:
                cached = self._cache[path] = (mtime, read_file(path))
            if cached[1] is not None:
                found.append((os.path.basename(os.path.dirname(path)), cached[1]))
        return found

    def __rich__(self) -> RenderableType:
        from rich.console import Group

        size = terminal_size(self._term_fd)  # follow the terminal's size, when it has one
        if size is not None:
            self._console.size = size
        self._tell_size(size)
        rows = [] if self.ending else [_row_text(*item) for item in live_rows(self._row_files)]
        return Group(*rows, *self.rows())

    def _tell_size(self, size: Optional[os.terminal_size]) -> None:
        """The agents give their workers pseudo-terminals of this size (terminal_size.py)."""
        told = (size.columns, size.lines) if size is not None else (0, 0)
        if self._size_file is None or told == self._size_told:
            return
        self._size_told = told
        try:
            write_size(self._size_file, *told)
        except OSError:  # the job's directory is gone: nobody reads it
            pass

    def rows(self) -> List[RenderableType]:
        """One bar per role whose rank-0 agent reported; for ``ft.ddp``, the job's across the
        replica groups first and each group's labelled ``training`` or ``recovering``."""
        summaries = self.summaries()
        if len(summaries) == 1:
            return [rich_bar(summaries[0][1], "job")]
        status = self._status() if self._status is not None else role_status.read(None)
        job = status.job_summary(dict(summaries))
        rows = [] if job is None else [rich_bar(job, "job")]
        return rows + [rich_bar(s, status.bar_label(role)) for role, s in summaries]


class TerminalBar:
    """Lines written to stdout/stderr scroll above one live bar of the job's progress."""

    def __init__(
        self,
        files: Callable[[], List[str]],
        status: Optional[StatusReader] = None,
        row_files: RowFiles = (),
        size_file: Optional[str] = None,
    ) -> None:
        self._files = files
        self._status = status
        self._row_files = row_files
        self._size_file = size_file
        self._lock = threading.Lock()
        self._live: Optional[Live] = None
        self._bar: Optional[_Bar] = None
        self._saved: Dict[int, int] = {}  # redirected fd -> a copy of what it was
        self._pipes: Dict[int, int] = {}  # read end -> the fd it replaces
        self._thread: Optional[threading.Thread] = None
        self._console: Optional[Console] = None
        # held by the copier from reading a pipe to printing its lines, and to redraw the bar
        self._copying = threading.Lock()
        self._ended = False  # the bar's last state is drawn: the copier redraws no more

    @property
    def active(self) -> bool:
        return self._live is not None

    def start(self) -> None:
        from rich.console import Console
        from rich.live import Live

        with self._lock:
            if self._live is not None:
                return
            sys.stdout.flush()
            sys.stderr.flush()
            self._ended = False
            term_fd = os.dup(2)
            term = os.fdopen(term_fd, "w", buffering=1, encoding="utf-8", errors="replace")
            # a terminal of no size: rich's own fallback (80 columns), not 0 (nothing shown)
            size = terminal_size(term_fd)
            console = Console(
                file=term,
                force_terminal=True,
                highlight=False,
                emoji=False,
                width=None if size is not None else DEFAULT_COLUMNS,
                height=None if size is not None else DEFAULT_LINES,
            )
            for fd in (1, 2):
                if fd == 2 or os.isatty(fd):
                    read_end, write_end = os.pipe()
                    self._saved[fd] = os.dup(fd)
                    os.dup2(write_end, fd)
                    os.close(write_end)
                    self._pipes[read_end] = fd
            self._console = console
            self._bar = _Bar(
                self._files, console, term_fd, self._status, self._row_files, self._size_file
            )
            # redrawn by the copier's thread only (not rich's own refresh thread): a redraw
            # racing a line's print could erase the bar by its height before the other's
            # and leave a second bar on screen
            self._live = Live(
                self._bar,
                console=console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
            self._thread = threading.Thread(
                target=self._copy_lines, name="torchx-elastic-bar", daemon=True
            )
            self._thread.start()
        atexit.register(self.stop)

    def _copy_lines(self) -> None:
        """Each complete line from the pipes, printed above the bar, and the bar redrawn
        ``REFRESH_PER_SECOND`` times a second: every write to the terminal from this thread
        (:meth:`stop` takes ``_copying`` for its last one)."""
        from rich.text import Text

        assert self._console is not None and self._live is not None
        console, live = self._console, self._live
        pending: Dict[int, bytes] = dict.fromkeys(self._pipes, b"")
        redraw_s = time.monotonic() + 1 / REFRESH_PER_SECOND
        with selectors.DefaultSelector() as selector:
            for read_end in self._pipes:
                selector.register(read_end, selectors.EVENT_READ)
            open_ends = len(self._pipes)
            while open_ends:
                if time.monotonic() >= redraw_s:
                    redraw_s = time.monotonic() + 1 / REFRESH_PER_SECOND
                    with self._copying:
                        if not self._ended:
                            live.refresh()
                for key, _ in selector.select(max(0.0, redraw_s - time.monotonic())):
                    read_end = int(key.fd)
                    with self._copying:
                        data = os.read(read_end, _READ_BYTES)
                        if not data:  # the fd was given back: the last bytes are in
                            selector.unregister(read_end)
                            open_ends -= 1
                            data = b"\n" if pending[read_end] else b""
                        *lines, pending[read_end] = (pending[read_end] + data).split(b"\n")
                        for line in lines:
                            text = line.decode("utf-8", "replace")
                            console.print(
                                Text.from_ansi(text) if "\x1b" in text else Text(text),
                                soft_wrap=True,
                            )

    def stop(self) -> None:
        """Give the terminal back; the bar's last state stays above what comes next.

        The bar stops while stdout and stderr still go through the pipes, once the copier
        has printed what was in them: a line another thread writes meanwhile (torchx's
        ``Job finished``) goes through the copier too, never onto the live bar, which would
        leave a second bar behind.
        """
        with self._lock:
            live, self._live = self._live, None
            if live is None:
                return
            with contextlib.suppress(ValueError, OSError):
                sys.stdout.flush()
                sys.stderr.flush()
            self._wait_for_the_copier()
            with self._copying:  # the copier neither prints nor redraws meanwhile
                self._ended = True
                if self._bar is not None:
                    self._bar.ending = True
                live.refresh()
                live.stop()
            for fd, saved in self._saved.items():
                os.dup2(saved, fd)  # closes the pipe's write end: the copier drains it
                os.close(saved)
            self._saved.clear()
            if self._thread is not None:
                self._thread.join(timeout=5.0)
            for read_end in self._pipes:
                os.close(read_end)
            self._pipes.clear()
            if self._console is not None:
                self._console.file.close()
        atexit.unregister(self.stop)

    def _wait_for_the_copier(self) -> None:
        """Until the copier has printed every complete line written so far (at most
        ``DRAIN_S``): the pipes hold no unread byte while it is not between a read and its
        print."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            with self._copying:
                if not any(_unread(fd) for fd in self._pipes):
                    return
            time.sleep(0.01)


def _unread(fd: int) -> int:
    """Bytes waiting in a pipe."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])
    except OSError:
        return 0


class SharedBar:
    """One :class:`TerminalBar` for the followers of one app's logs (one per replica)."""

    def __init__(self, bar: TerminalBar) -> None:
        self.bar = bar
        self._followers = 0
        self._lock = threading.Lock()

    def follow(self) -> None:
        with self._lock:
            self._followers += 1
            if self._followers == 1:
                self.bar.start()

    def unfollow(self) -> None:
        with self._lock:
            self._followers -= 1
            if self._followers == 0:
                self.bar.stop()

    def lines(self, lines: Iterable[str]) -> Iterator[str]:
        """A replica's followed log lines, drawn above the bar while they last; the rank-0
        agent's ``[job progress]`` lines are left out then (the bar shows them)."""
        self.follow()
        try:
            for line in lines:
                if not (self.bar.active and line.startswith(LINE_PREFIX)):
                    yield line
        finally:
            self.unfollow()
