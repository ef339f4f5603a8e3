"""Start, time, sample and clean up the processes of one benchmark run.

Every launched command gets its own session; on a timeout the whole tree (found through
``/proc/<pid>/task/<tid>/children``, because the launchers put their workers in sessions of
their own) is stopped: SIGTERM to the launchers first, so they can stop their workers, then
SIGKILL to everything that is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_POLL_S = 0.02
_TERM_GRACE_S = 5.0


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads'), or none once it is gone."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found.extend(int(child) for child in text.split())
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    found: list[int] = []
    pending = children(pid)
    while pending:
        child = pending.pop(0)
        found.append(child)
        pending.extend(children(child))
    return found


def peak_rss_kb(pid: int) -> int | None:
    """``VmHWM`` (peak resident set size, kB) of a live process, None once it has exited."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None  # a zombie has no memory lines


class PeakRssSampler(threading.Thread):
    """Polls ``VmHWM`` of one process until it exits; ``peak_kb`` is the last (largest) value."""

    def __init__(self, pid: int, interval_s: float = _POLL_S) -> None:
        super().__init__(name=f"rss-{pid}", daemon=True)
        self.pid = pid
        self.peak_kb = 0
        self._interval_s = interval_s
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            value = peak_rss_kb(self.pid)
            if value is None:
                return
            self.peak_kb = max(self.peak_kb, value)
            self._done.wait(self._interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join()


@dataclass(frozen=True)
class Outcome:
    """What became of the processes of one run."""

    wall_s: float
    started_unix_s: float  # wall clock, comparable with the workers' time.time()
    exit_codes: tuple[int | None, ...]  # None: killed at the timeout
    timed_out: bool
    output_path: Path
    peak_rss_kb: tuple[int, ...] = ()  # per command, when sampled

    @property
    def ended_unix_s(self) -> float:
        return self.started_unix_s + self.wall_s

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(code == 0 for code in self.exit_codes)

    def output_tail(self, lines: int = 15) -> str:
        try:
            text = self.output_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def stop_tree(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the launchers, give them a moment, then SIGKILL every process of their trees."""
    tree = [pid for proc in procs for pid in (proc.pid, *descendants(proc.pid))]
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _TERM_GRACE_S
    while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
        time.sleep(_POLL_S)
    tree += [pid for proc in procs for pid in descendants(proc.pid)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def run_together(
    commands: Sequence[Sequence[str]],
    *,
    output_path: Path,
    timeout_s: float,
    cwd: Path,
    envs: Sequence[Mapping[str, str]],
    sample_rss: bool = False,
) -> Outcome:
    """Start ``commands`` at once (stdout and stderr of all into ``output_path``), time them
    from the first start to the last exit, and stop them all after ``timeout_s``."""
    if len(envs) != len(commands):
        raise ValueError(f"{len(commands)} commands but {len(envs)} environments")
    procs: list[subprocess.Popen[bytes]] = []
    samplers: list[PeakRssSampler] = []
    with open(output_path, "ab") as output:
        started_unix_s = time.time()
        start = time.monotonic()
        for command, env in zip(commands, envs, strict=True):
            procs.append(
                subprocess.Popen(
                    list(command),
                    cwd=cwd,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            if sample_rss:
                samplers.append(PeakRssSampler(procs[-1].pid))
                samplers[-1].start()
        deadline = start + timeout_s
        end = start
        timed_out = False
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
                end = max(end, time.monotonic())
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            end = time.monotonic()
            codes = tuple(proc.poll() for proc in procs)
            stop_tree(procs)
        else:
            codes = tuple(proc.returncode for proc in procs)
    for sampler in samplers:
        sampler.stop()
    return Outcome(
        wall_s=end - start,
        started_unix_s=started_unix_s,
        exit_codes=codes,
        timed_out=timed_out,
        output_path=output_path,
        peak_rss_kb=tuple(sampler.peak_kb for sampler in samplers),
    )
