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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_POLL_S = 0.02
_TERM_GRACE_S = 5.0


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


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


def pss_kb(pid: int) -> int | None:
    """Proportional set size (kB): resident pages, shared ones split among their sharers."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return None


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the command name may hold spaces


def command_line(pid: int, limit: int = 120) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:limit]


@dataclass
class TreeMemory:
    """Memory of a launcher and everything below it, sampled while it ran."""

    root: int
    peak_rss_kb: dict[int, int] = field(default_factory=dict)  # pid -> largest VmHWM seen
    parents: dict[int, int] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)
    pss_ticks: list[dict[int, int]] = field(default_factory=list)  # per sample: pid -> Pss kB

    def below(self, pid: int, ancestors: set[int]) -> bool:
        """Whether ``pid`` is one of ``ancestors`` or a descendant of one."""
        seen: set[int] = set()
        while pid not in seen:
            if pid in ancestors:
                return True
            seen.add(pid)
            parent = self.parents.get(pid)
            if parent is None:
                return False
            pid = parent
        return False

    def helpers(self, workers: set[int]) -> list[int]:
        """Processes of the launcher that are neither the launcher itself nor workers (or
        their children): e.g. a fork server."""
        return sorted(
            pid for pid in self.peak_rss_kb if pid != self.root and not self.below(pid, workers)
        )

    def pss_while_running(self, workers: set[int]) -> tuple[int, int] | None:
        """The largest PSS sums of the samples that saw every one of ``workers``: of the
        whole tree, and of its launcher side (all but the workers and their children);
        None if no sample saw them all."""
        whole, launcher = [], []
        for tick in self.pss_ticks:
            if not workers <= tick.keys():
                continue
            whole.append(sum(tick.values()))
            launcher.append(sum(v for p, v in tick.items() if not self.below(p, workers)))
        return (max(whole), max(launcher)) if whole else None

    def peak_pss_kb(self, pids: set[int]) -> int:
        """Largest sum of the PSS of ``pids`` in one sample."""
        return max(
            (sum(v for p, v in tick.items() if p in pids) for tick in self.pss_ticks), default=0
        )


class TreeSampler(threading.Thread):
    """Samples a launcher and its descendants until the launcher exits."""

    def __init__(self, root: int, interval_s: float = 0.05) -> None:
        super().__init__(name=f"memory-{root}", daemon=True)
        self.memory = TreeMemory(root)
        self._interval_s = interval_s
        self._done = threading.Event()

    def run(self) -> None:
        memory = self.memory
        while not self._done.is_set():
            tick: dict[int, int] = {}
            for pid in (memory.root, *descendants(memory.root)):
                rss = peak_rss_kb(pid)
                if rss is None:
                    if pid == memory.root:
                        return
                    continue
                memory.peak_rss_kb[pid] = max(rss, memory.peak_rss_kb.get(pid, 0))
                if pid not in memory.parents:
                    parent = parent_pid(pid)
                    if parent is not None:
                        memory.parents[pid] = parent
                # read again each tick: a child seen between its fork and its exec still
                # shows its parent's command line
                command = command_line(pid)
                if command not in ("", "?") or pid not in memory.commands:
                    memory.commands[pid] = command
                pss = pss_kb(pid)
                if pss is not None:
                    tick[pid] = pss
            memory.pss_ticks.append(tick)
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
    memory: tuple[TreeMemory, ...] = ()  # per command, when sampled

    @property
    def peak_rss_kb(self) -> tuple[int, ...]:
        """Peak RSS of each launched process itself (not its children)."""
        return tuple(m.peak_rss_kb.get(m.root, 0) for m in self.memory)

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
    started: Callable[[int], None] = lambda pid: None,
) -> Outcome:
    """Start ``commands`` at once (stdout and stderr of all into ``output_path``), time them
    from the first start to the last exit, and stop them all after ``timeout_s``;
    ``started`` gets each one's pid as it starts."""
    if len(envs) != len(commands):
        raise ValueError(f"{len(commands)} commands but {len(envs)} environments")
    procs: list[subprocess.Popen[bytes]] = []
    samplers: list[TreeSampler] = []
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
            started(procs[-1].pid)
            if sample_rss:
                samplers.append(TreeSampler(procs[-1].pid))
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
        memory=tuple(sampler.memory for sampler in samplers),
    )
