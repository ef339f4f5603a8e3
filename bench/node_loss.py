"""13. A lost node: how soon a fixed-size job trains at its size again after one of its
nodes is SIGKILLed (agent and workers at once, on a machine whose kernel still answers).

Two nodes of one worker each on this machine (c10d rendezvous hosted by the first), the
job ``bench/lockstep.py``; once it trains, the second node's processes are killed:

- ``ours_spare``: our agents, ``--nnodes 2`` with a third agent standing by (a spare,
  ``dist.ddp --spares 1``): it takes the lost node's place;
- ``ours``: our agents without a spare: a new agent starts at once in the lost one's place
  (a scheduler that replaces a node instantly: a real one takes seconds to minutes more);
- ``torchrun``: torchrun's agents, the same instant replacement (torchrun has no spares).

The value: from the kill to the first step of world 2 after it. The run counts only when
the job then finishes with exit 0 on every node still running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import procs

REPO = Path(__file__).resolve().parent.parent

LOCKSTEP_SCRIPT = "bench/lockstep.py"
STEPS_BEFORE_LOSS = 20
STANDING_BY = "standing by: the job has its 2 nodes"


def back_at_size_s(records: str, world: int, after_s: float) -> float | None:
    """Seconds from ``after_s`` to the first ``step _ WORLD TIME`` record of ``world`` after
    it (None: none)."""
    for line in records.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "step" and int(fields[2]) == world:
            at = float(fields[3])
            if at > after_s:
                return at - after_s
    return None


def steps_at(records: str, world: int) -> int:
    """The last step recorded in a world of ``world`` ranks (-1: none)."""
    rows = (line.split() for line in records.splitlines())
    steps = [int(f[1]) for f in rows if len(f) == 4 and f[0] == "step" and int(f[2]) == world]
    return max(steps, default=-1)


class Nodes:
    """The agents of one run, each in a session of its own, their output in one file."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.output = run_dir / "output.log"
        self.env = env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, command: Sequence[str]) -> subprocess.Popen[bytes]:
        with open(self.output, "ab") as out:
            proc = subprocess.Popen(
                list(command), cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.started.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        for pid in [proc.pid, *procs.descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                self.kill(proc)


def wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:g}s")
        time.sleep(0.05)


def lost_node(
    agent: list[str], run_dir: Path, env: dict[str, str], *, spare: bool, timeout_s: float
) -> tuple[float | None, str]:
    """One run: (seconds from the kill to world 2 again, or None; what went wrong, or '')."""
    records = run_dir / "records.txt"
    nodes = Nodes(run_dir, env)
    port = agent[agent.index("--rdzv-endpoint") + 1].rpartition(":")[2]
    try:
        host = nodes.start(agent)
        wait_for("rendezvous host", lambda: procs.port_open(int(port)), timeout_s)
        lost = nodes.start(agent)
        wait_for(
            f"step {STEPS_BEFORE_LOSS}",
            lambda: records.exists() and steps_at(records.read_text(), 2) >= STEPS_BEFORE_LOSS,
            timeout_s,
        )
        others = [host]
        if spare:
            others.append(nodes.start(agent))
            wait_for(
                "a spare standing by", lambda: STANDING_BY in nodes.output.read_text(), timeout_s
            )
        kill_s = time.time()
        nodes.kill(lost)
        if not spare:
            others.append(nodes.start(agent))  # the instant replacement
        codes = [p.wait(timeout=timeout_s) for p in others]
    except (TimeoutError, subprocess.TimeoutExpired) as err:
        return None, f"{err}; output: {nodes.output}"
    finally:
        nodes.stop_all()
    back_s = back_at_size_s(records.read_text(), 2, kill_s)
    if back_s is None or any(codes):
        return None, f"back at world 2: {back_s}, exit codes {codes}; output: {nodes.output}"
    return back_s, ""
