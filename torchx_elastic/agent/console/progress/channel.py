"""The agent's end of the worker -> agent channel: a Unix datagram socket.

Workers send tiny text datagrams (see :mod:`torchx_elastic.worker`):
``p STEP TOTAL LOCAL_RANK ATTEMPT`` (progress, TOTAL -1 when unknown) and
``h LOCAL_RANK ATTEMPT`` (heartbeat), ``b LOCAL_RANK ATTEMPT`` (the script is done: sent at
exit by a worker that reported anything). :class:`RankActivity` keeps, per local rank, the latest
step/total and the monotonic time of the last message; the progress bar and the hang
watchdog both read it.

Only the agent's own workers are heard. On Linux the socket is in the abstract namespace
(no file permissions: any local process can send to it), so the kernel attaches each
sender's credentials (``SO_PASSCRED``) and a datagram counts only when its sender runs as the
agent's user and is one of the workers it started (:meth:`ActivityChannel.expect`) or
descends from the agent (one warning per other sender). Elsewhere the socket is a file in a
private (0700) directory.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torchx_elastic.contract import CHANNEL_ENV
from torchx_elastic.worker import socket_address

log = logging.getLogger(__name__)

RATE_WINDOW_S = 30.0
_MAX_DATAGRAM_BYTES = 512
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
REFUSED_SENDER = (
    "refused messages on the worker channel from pid %s (uid %s): not a worker of this agent"
)


@dataclass(frozen=True)
class RankProgress:
    """What one rank last reported."""

    local_rank: int
    step: int | None
    total: int | None
    last_seen_s: float
    rate_per_s: float | None
    stepped_s: float | None = None  # monotonic time of the message that said ``step``


class _RankRecord:
    def __init__(self, now_s: float) -> None:
        self.step: int | None = None
        self.total: int | None = None
        self.last_seen_s = now_s
        self.finished = False
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def stepped_s(self) -> float | None:
        return self.samples[-1][0] if self.samples else None

    def rate_per_s(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


class RankActivity:
    """Latest progress and last-seen time per local rank, for the current attempt (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._attempt = 0
        self._ranks: dict[int, _RankRecord] = {}

    def new_attempt(self, attempt: int) -> None:
        """Forget what the workers of earlier attempts said."""
        with self._lock:
            self._attempt = attempt
            self._ranks.clear()

    def _current(self, attempt: int) -> bool:
        """Whether a message of ``attempt`` counts; a later attempt's first message starts it."""
        if attempt > self._attempt:
            self._attempt = attempt
            self._ranks.clear()
        return attempt == self._attempt

    def heartbeat(self, local_rank: int, attempt: int) -> None:
        with self._lock:
            if self._current(attempt):
                self._record(local_rank)

    def finish(self, local_rank: int, attempt: int) -> None:
        """The rank's script is done (it is exiting): nothing more to watch."""
        with self._lock:
            if self._current(attempt):
                self._record(local_rank).finished = True

    def is_finished(self, local_rank: int) -> bool:
        with self._lock:
            record = self._ranks.get(local_rank)
            return record is not None and record.finished

    def progress(self, local_rank: int, attempt: int, step: int, total: int | None) -> None:
        with self._lock:
            if not self._current(attempt):
                return
            record = self._record(local_rank)
            if record.step is not None and step < record.step:
                record.samples.clear()  # the rank went back (a new epoch, a reload)
            record.step, record.total = step, total
            record.samples.append((record.last_seen_s, step))
            while record.samples and record.samples[0][0] < record.last_seen_s - RATE_WINDOW_S:
                record.samples.popleft()

    def _record(self, local_rank: int) -> _RankRecord:
        now_s = self._clock()
        record = self._ranks.get(local_rank)
        if record is None:
            record = self._ranks[local_rank] = _RankRecord(now_s)
        record.last_seen_s = now_s
        return record

    def last_seen_s(self, local_rank: int) -> float | None:
        """Monotonic time of the rank's last message in this attempt, None if it sent none."""
        with self._lock:
            record = self._ranks.get(local_rank)
            return None if record is None else record.last_seen_s

    def snapshot(self) -> dict[int, RankProgress]:
        with self._lock:
            return {
                local_rank: RankProgress(
                    local_rank, r.step, r.total, r.last_seen_s, r.rate_per_s(), r.stepped_s()
                )
                for local_rank, r in self._ranks.items()
            }

    def handle(self, datagram: bytes) -> None:
        """Apply one datagram from a worker; malformed ones are ignored."""
        parts = datagram.split()
        try:
            if parts[:1] == [b"p"] and len(parts) == 5:
                total = int(parts[2])
                self.progress(
                    int(parts[3]), int(parts[4]), int(parts[1]), None if total < 0 else total
                )
            elif parts[:1] == [b"h"] and len(parts) == 3:
                self.heartbeat(int(parts[1]), int(parts[2]))
            elif parts[:1] == [b"b"] and len(parts) == 3:
                self.finish(int(parts[1]), int(parts[2]))
        except ValueError:
            pass


def _descends_from(pid: int, ancestor: int) -> bool:
    """``pid`` is ``ancestor``'s child, grandchild, ... (by parent links in /proc)."""
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                pid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


class ActivityChannel:
    """Owns the socket the workers write to and a thread that feeds :class:`RankActivity`."""

    def __init__(self, activity: RankActivity, abstract: bool | None = None) -> None:
        self.activity = activity
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._dir: str | None = None
        if abstract if abstract is not None else sys.platform.startswith("linux"):
            # Linux's abstract namespace: nothing on disk, gone with the agent (even SIGKILLed)
            self.path = f"@torchx-elastic-{os.getpid()}-{secrets.token_hex(8)}"
        else:
            # a short private directory: socket paths are limited to ~100 bytes
            self._dir = tempfile.mkdtemp(prefix="txe-")
            self.path = os.path.join(self._dir, "channel")
        self._socket.bind(socket_address(self.path))
        self._check_senders = self._dir is None
        if self._check_senders:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._senders: dict[int, bool] = {}  # pid -> a worker of this agent
        self._socket.settimeout(0.5)
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name="torchx-elastic-channel", daemon=True
        )
        self._thread.start()

    def env(self) -> dict[str, str]:
        """What each worker's environment needs to reach this channel."""
        return {CHANNEL_ENV: self.path}

    def expect(self, pids: Iterable[int]) -> None:
        """The workers the agent just started: heard without a look at their ancestry, which
        is gone once a worker has exited and been reaped (a short script's messages, its last
        step among them, may be read only then)."""
        self._senders.update(dict.fromkeys(pids, True))

    def _serve(self) -> None:
        space = socket.CMSG_SPACE(_UCRED.size) if self._check_senders else 0
        while not self._closed.is_set():
            try:
                datagram, ancdata, _, _ = self._socket.recvmsg(_MAX_DATAGRAM_BYTES, space)
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._check_senders or self._from_worker(ancdata):
                self.activity.handle(datagram)

    def _from_worker(self, ancdata: list[tuple[int, int, bytes]]) -> bool:
        pid = uid = None
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, uid, _ = _UCRED.unpack(data[: _UCRED.size])
        if pid is None or pid == os.getpid():  # close()'s wake-up call comes from here
            return pid is not None
        known = self._senders.get(pid)
        if known is None:
            known = uid == os.getuid() and _descends_from(pid, os.getpid())
            if len(self._senders) > 4096:
                self._senders.clear()
            self._senders[pid] = known
            if not known:
                log.warning(REFUSED_SENDER, pid, uid)
        return known

    def close(self) -> None:
        self._closed.set()
        with (
            contextlib.suppress(OSError),
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as waker,
        ):
            waker.sendto(b"", socket_address(self.path))  # wake the reader now
        self._thread.join(timeout=2.0)
        self._socket.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
