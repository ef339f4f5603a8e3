"""Start real agents in the background and look at their process trees."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import _env
from tests.waiting import DEADLINE_S, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_agent(
    *args: str, cwd: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``python -m torchx_elastic.agent ARGS`` with stdout+stderr to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "torchx_elastic.agent", *args],
            cwd=cwd,
            env=_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for_text(path: Path, text: str, timeout_s: float = DEADLINE_S, count: int = 1) -> None:
    """Until ``text`` is in ``path`` (``count`` times)."""
    wait_until(
        lambda: path.exists() and path.read_text(errors="replace").count(text) >= count,
        what=f"{text!r} x{count} in {path}",
        timeout_s=timeout_s,
        every_s=0.1,
        detail=lambda: path.read_text(errors="replace") if path.exists() else "(no such file)",
    )


# an agent started with this in its environment writes every thread's stack to its log on
# SIGABRT: what wait_for_exit shows of an agent that does not end
DUMPS_STACKS = {"PYTHONFAULTHANDLER": "1"}


def wait_for_exit(agent: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> int:
    """``agent``'s exit code once it ends; if it has not within ``timeout_s``, an
    AssertionError with its log (its threads' stacks first, where it was started with
    :data:`DUMPS_STACKS`): a hang is shown where it is, not as a bare timeout."""
    try:
        return agent.wait(timeout_s)
    except subprocess.TimeoutExpired:
        agent.send_signal(signal.SIGABRT)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
        raise AssertionError(
            f"agent pid {agent.pid} did not end within {timeout_s:g} s; its log:\n"
            + log.read_text(errors="replace")
        ) from None


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (by parent links in /proc), plus any process in
    a session led by one of them (children that were re-parented stay in their session)."""
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        sessions[int(entry)] = int(fields[3])
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parents.items():
            if parent == current and child not in found:
                found.add(child)
                frontier.append(child)
    found |= {p for p, sid in sessions.items() if sid in found}
    return found


def alive(pids: set[int]) -> set[int]:
    still = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            still.add(pid)
    return still
