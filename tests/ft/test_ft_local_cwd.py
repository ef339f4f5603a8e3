"""ft.ddp on local_cwd, for real: 2 replica groups x (1x2) of examples/ft_ddp.py (torchft,
gloo, CPU); a worker of group 1 is SIGKILLed mid-run.

Group 0 must keep training (its step counter never goes back, never restarts, and advances
while group 1 is down), group 1 must restart alone and rejoin the quorum, and the job must
SUCCEED with both groups at the final step and the Lighthouse role stopped by their ends.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pytest

from tests.conftest import BIN, _env

pytestmark = pytest.mark.slow

STEPS = 200
STEP_S = 0.1  # group 0 trains on for about STEPS * STEP_S s: longer than group 1's restart
# group 1 is killed once it has trained this many steps in a quorum of both groups
KILL_AFTER_JOINT_STEPS = 5
HEARTBEAT_TIMEOUT_MS = 1000
STEP_LINE = re.compile(r"group (\d) step (\d+) quorum (\d+) loss \S+ t ([0-9.]+)")
START_LINE = re.compile(r"group (\d) rank (\d) pid (\d+) attempt (\d+)")


@dataclass(frozen=True)
class Step:
    group: int
    step: int
    quorum: int
    t: float


def _free_port_pair() -> int:
    """A port P with P and P + 1 free (the Lighthouse and the groups' registry)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


class Console:
    """The lines of ``torchx run`` (it follows every replica's log on its stderr)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: List[str] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = pattern.search(line)
                if match:
                    return match
            time.sleep(0.05)
        raise AssertionError(f"no {pattern.pattern!r} within {timeout_s} s:\n{self.text()}")

    def wait_for_steps(self, group: int, quorum: int, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sum(s.quorum == quorum for s in self.steps(group)) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(
            f"group {group}: not {count} steps in a quorum of {quorum} within {timeout_s} s:\n"
            f"{self.text()}"
        )

    def join(self) -> None:
        self._thread.join(timeout=30)

    def text(self) -> str:
        return "".join(self.lines)

    def steps(self, group: int) -> List[Step]:
        found = [STEP_LINE.search(line) for line in self.lines]
        steps = [Step(int(m[1]), int(m[2]), int(m[3]), float(m[4])) for m in found if m]
        return [s for s in steps if s.group == group]


# issue 27: on a loaded 2-core CI machine group 0 restarted too (1 run in 2 of the clean-clone CI)
@pytest.mark.known_failing
def test_a_killed_group_restarts_alone_while_the_other_keeps_training(tmp_path: Path) -> None:
    (tmp_path / "ft_ddp.py").write_text(
        (Path(__file__).parents[2] / "examples/ft_ddp.py").read_text()
    )
    proc = subprocess.Popen(
        [
            str(BIN / "torchx"),
            "run",
            "-s",
            "local_cwd",
            "ft.ddp",
            "--replica_groups",
            "2",
            "-j",
            "1x2",
            "--max_retries",
            "2",
            "--lighthouse_port",
            str(_free_port_pair()),
            "--join_timeout_ms",
            "1000",
            "--heartbeat_timeout_ms",
            str(HEARTBEAT_TIMEOUT_MS),
            # spawn: a restarted worker imports torch again (seconds, as under torchrun), so
            # group 1 is down longer than the Lighthouse takes to drop it from the quorum
            "--start_method",
            "spawn",
            "--script",
            "ft_ddp.py",
            "--",
            "--steps",
            str(STEPS),
            "--step-s",
            str(STEP_S),
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    console = Console(proc)
    try:
        victim = console.wait_for(re.compile(r"group 1 rank 1 pid (\d+) attempt 0"), 120)
        console.wait_for_steps(1, quorum=2, count=KILL_AFTER_JOINT_STEPS, timeout_s=120)
        killed_at = time.time()
        os.kill(int(victim[1]), signal.SIGKILL)
        assert proc.wait(timeout=150) == 0, console.text()
    finally:
        if proc.poll() is None:
            proc.kill()
        console.join()
        (tmp_path / "console.txt").write_text(console.text())
    text = console.text()
    assert "Job finished: SUCCEEDED" in text, text
    assert (
        "every replica group has ended (group0 succeeded, group1 succeeded):"
        " stopping the Lighthouse" in text
    ), text

    # the Lighthouse role logs the quorums it sees (it polls the Lighthouse): both groups,
    # then both again after a quorum without group 1 (logged as "1 of 2" unless group 1 came
    # back within one poll: then the quorum id shows that one was formed in between)
    quorums = re.findall(r"lighthouse/0 .*quorum (\d+) at step \d+: (\d) of 2 replica groups", text)
    ids = [int(q) for q, _ in quorums]
    sizes = "".join(n for _, n in quorums)
    assert sizes.startswith("2") and sizes.endswith("2"), text
    assert "212" in sizes or (ids == sorted(ids) and ids[-1] >= ids[0] + 2), text

    # group 0 never restarted and its step counter went up by one to STEPS, never back (it
    # starts at 1, or later when group 1 was first: then it joined with group 1's weights)
    starts = [START_LINE.search(line) for line in console.lines]
    attempts = {(int(m[1]), m[4]) for m in starts if m}
    assert attempts == {(0, "0"), (1, "0"), (1, "1")}, text
    group0 = console.steps(0)
    first = group0[0].step
    assert [s.step for s in group0] == list(range(first, STEPS + 1)), text
    assert group0[0].t < killed_at, text

    # group 1 restarted alone and came back: its first committed step after the kill (it
    # took the weights and the step from group 0 first) and then steps in a quorum of both
    group1 = console.steps(1)
    assert group1[-1].step == STEPS, text
    rejoined = next(s for s in group1 if s.t > killed_at)
    assert any(s.quorum == 2 for s in group1 if s.t > rejoined.t), text
    # group 0 trained on alone (quorum 1) while group 1 was down, and never stopped for
    # longer than the Lighthouse takes to drop a silent group (plus this busy machine's slack)
    while_down = [s for s in group0 if killed_at < s.t < rejoined.t]
    assert sum(s.quorum == 1 for s in while_down) >= 3, text
    after_kill = [s for s in group0 if s.t > killed_at]
    longest_pause_s = max(b.t - a.t for a, b in zip(after_kill, after_kill[1:], strict=False))
    assert longest_pause_s < HEARTBEAT_TIMEOUT_MS / 1000 + 4, text
    print(
        f"group 1 recovered in {rejoined.t - killed_at:.2f} s (kill to its first committed step"
        f" after its restart); group 0 meanwhile committed {len(while_down)} steps, longest pause"
        f" {longest_pause_s:.2f} s"
    )
