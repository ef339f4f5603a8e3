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
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

from tests.conftest import BIN, _env
from tests.ft.ports import free_port_pair
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

STEPS = 200
STEP_S = 0.1  # group 0 trains on for about STEPS * STEP_S s: longer than group 1's restart
# group 1 is killed once it has trained this many steps in a quorum of both groups
KILL_AFTER_JOINT_STEPS = 5
HEARTBEAT_TIMEOUT_MS = 1000
STEP_LINE = re.compile(r"group (\d) step (\d+) quorum (\d+) loss \S+ t ([0-9.]+)")
START_LINE = re.compile(r"group (\d) rank (\d) pid (\d+) attempt (\d+)")
SKIPPED_LINE = re.compile(r"group (\d) step (\d+) not committed \((.*)\) t ([0-9.]+)")
QUORUM_LINE = re.compile(
    r"lighthouse/0 .*quorum (\d+) at step \d+: \d of 2 replica groups \(([^)]*)\)"
)


@dataclass(frozen=True)
class Step:
    group: int
    step: int
    quorum: int
    t: float


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

    def wait_for(self, pattern: re.Pattern[str]) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            return next((m for m in map(pattern.search, list(self.lines)) if m), None)

        return wait_until(found, what=f"{pattern.pattern!r} on the console", detail=self.text)

    def wait_for_steps(self, group: int, quorum: int, count: int) -> None:
        wait_until(
            lambda: sum(s.quorum == quorum for s in self.steps(group)) >= count,
            what=f"group {group}: {count} steps in a quorum of {quorum}",
            detail=self.text,
        )

    def join(self) -> None:
        self._thread.join(timeout=30)

    def text(self) -> str:
        return "".join(self.lines)

    def steps(self, group: int, lines: Optional[List[str]] = None) -> List[Step]:
        found = [STEP_LINE.search(line) for line in (self.lines if lines is None else lines)]
        steps = [Step(int(m[1]), int(m[2]), int(m[3]), float(m[4])) for m in found if m]
        return [s for s in steps if s.group == group]

    def attempts(self) -> Dict[int, Set[str]]:
        """group -> the attempts its workers started in (the example's start lines)."""
        found: Dict[int, Set[str]] = {}
        for match in (START_LINE.search(line) for line in self.lines):
            if match:
                found.setdefault(int(match[1]), set()).add(match[4])
        return found

    def first_step_after_restart(self, group: int) -> Optional[Step]:
        """The group's first committed step printed after its rank 0 started again: rank 0
        prints both lines, in order (a step line stamped after the kill may still be one of
        the killed attempt's)."""
        for i, line in enumerate(self.lines):
            match = START_LINE.search(line)
            if match and int(match[1]) == group and match[2] == "0" and match[4] != "0":
                later = self.steps(group, self.lines[i + 1 :])
                return later[0] if later else None
        return None

    def skipped(self, group: int) -> List[Tuple[int, str, float]]:
        """The steps the group did not commit: (step, reason, time)."""
        found = (SKIPPED_LINE.search(line) for line in self.lines)
        return [(int(m[2]), m[3], float(m[4])) for m in found if m and int(m[1]) == group]

    def quorums(self) -> List[Tuple[int, Tuple[str, ...]]]:
        """The quorums the Lighthouse role logged: (quorum id, members)."""
        found = (QUORUM_LINE.search(line) for line in self.lines)
        return [(int(m[1]), tuple(m[2].split(", "))) for m in found if m]


def _runs(steps: List[Step], killed_at: float) -> str:
    """Consecutive steps of one quorum size as one item: 'steps 10-35 quorum 1 (+0.2..+3.1 s)'
    (times from the kill)."""
    runs: List[List[Step]] = []
    for step in steps:
        if runs and runs[-1][-1].quorum == step.quorum and runs[-1][-1].step + 1 == step.step:
            runs[-1].append(step)
        else:
            runs.append([step])
    return "; ".join(
        f"steps {r[0].step}-{r[-1].step} quorum {r[0].quorum}"
        f" ({r[0].t - killed_at:+.2f}..{r[-1].t - killed_at:+.2f} s)"
        for r in runs
    )


class Checks:
    """Fails with the broken condition first, then what the run did (start lines, quorums,
    each group's steps around the kill), then the whole console."""

    def __init__(self, console: Console, saved: Path, killed_at: float) -> None:
        self._console = console
        self._saved = saved
        self._killed_at = killed_at

    def __call__(self, condition: bool, broken: str) -> None:
        if condition:
            return
        console = self._console
        starts = [m[0] for m in (START_LINE.search(line) for line in console.lines) if m]
        digest = [
            f"FAILED: {broken}",
            f"worker starts: {starts}",
            f"Lighthouse quorums (id, members): {console.quorums()}",
        ]
        for group in (0, 1):
            digest.append(
                f"group {group} steps (s from the kill): "
                f"{_runs(console.steps(group), self._killed_at)}"
            )
            skipped = [
                f"{step} ({t - self._killed_at:+.2f} s: {reason})"
                for step, reason, t in console.skipped(group)
            ]
            digest.append(f"group {group} steps not committed: {skipped}")
        digest.append(f"whole console (also in {self._saved}):")
        raise AssertionError("\n".join(digest) + "\n" + console.text())


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
            str(free_port_pair()),
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
        victim = console.wait_for(re.compile(r"group 1 rank 1 pid (\d+) attempt 0"))
        console.wait_for_steps(1, quorum=2, count=KILL_AFTER_JOINT_STEPS)
        killed_at = time.time()
        os.kill(int(victim[1]), signal.SIGKILL)
        code = proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
        console.join()
        (tmp_path / "console.txt").write_text(console.text())
    print(check_run(console, tmp_path / "console.txt", killed_at, code))


def check_run(console: Console, saved: Path, killed_at: float, code: int) -> str:
    """The test's conditions on a finished run (its console, the time of the kill, the exit
    code of ``torchx run``); returns the figures of group 1's recovery."""
    text = console.text()
    check = Checks(console, saved, killed_at)
    check(code == 0, f"torchx run exited {code}, not 0")
    check(
        "Job finished: SUCCEEDED" in text,
        "the job did not SUCCEED (the Lighthouse role's last lines say which group failed)",
    )
    check(
        "every replica group has ended (group0 succeeded, group1 succeeded):"
        " stopping the Lighthouse" in text,
        "the Lighthouse role did not stop after both groups succeeded",
    )

    # group 0 never restarted; group 1 restarted exactly once (the kill)
    attempts = console.attempts()
    check(
        attempts.get(0) == {"0"},
        f"group 0 restarted: its workers started in attempts {sorted(attempts.get(0, []))},"
        " expected only attempt 0",
    )
    check(
        attempts.get(1) == {"0", "1"},
        f"group 1 started in attempts {sorted(attempts.get(1, []))}, expected 0 and 1 (one"
        " restart, after the kill)",
    )

    # group 0's step counter went up by one to STEPS, never back, never skipped (it starts at
    # 1, or later when group 1's Manager formed the first quorum alone: then group 0 joined
    # with group 1's weights and step)
    group0 = console.steps(0)
    check(bool(group0), "group 0 committed no step")
    numbers = [s.step for s in group0]
    broken = [(a, b) for a, b in zip(numbers, numbers[1:], strict=False) if b != a + 1]
    check(
        not broken,
        f"group 0's step counter did not go up by one: (from, to) {broken[:5]} (back, or a"
        " skip: group 0 took another group's weights, so it had dropped out of a quorum)",
    )
    check(numbers[-1] == STEPS, f"group 0 ended at step {numbers[-1]}, not {STEPS}")
    check(group0[0].t < killed_at, "group 0 committed no step before the kill")

    # group 1 restarted alone and came back: its first committed step after its restart
    # (it took the weights and the step from group 0 first), then steps in a quorum of both
    group1 = console.steps(1)
    check(bool(group1) and group1[-1].step == STEPS, f"group 1 did not end at step {STEPS}")
    rejoined = console.first_step_after_restart(1)
    check(rejoined is not None, "group 1 committed no step after its restart")
    assert rejoined is not None
    check(
        any(s.quorum == 2 for s in group1 if s.t > rejoined.t),
        "group 1 never trained in a quorum of both groups again after its restart",
    )

    # group 0 trained on alone (quorum 1) while group 1 was down (how long it paused, the
    # time the Lighthouse takes to drop a silent group, is a speed: printed, bench/)
    while_down = [s for s in group0 if killed_at < s.t < rejoined.t]
    alone = sum(s.quorum == 1 for s in while_down)
    check(
        alone >= 1,
        f"group 0 committed no step alone (quorum 1) while group 1 was down"
        f" ({rejoined.t - killed_at:.2f} s from the kill to group 1's step {rejoined.step})",
    )
    # from group 0's last step before the kill: the kill lands mid-step, and the step group 0
    # was in when its allreduce failed is the one that waits for the Lighthouse
    since_kill = [s for s in group0 if s.t <= killed_at][-1:] + [
        s for s in group0 if s.t > killed_at
    ]
    check(len(since_kill) >= 2, "group 0 committed no step after the kill")
    gaps = [(b.t - a.t, a) for a, b in zip(since_kill, since_kill[1:], strict=False)]
    pause, before_pause = max(gaps, key=lambda gap: gap[0])

    # the Lighthouse role logs the quorums it sees (it polls the Lighthouse once a second):
    # after the first quorum of both groups (the first may hold one group alone: torchft's
    # Lighthouse issues a quorum at once when every group it has heard from has joined), one
    # of group 0 alone (group 1 is down for seconds: its new workers import torch), then both
    # groups again, to the end
    quorums = console.quorums()
    sizes = [len(members) for _, members in quorums]
    joint = sizes.index(2) if 2 in sizes else len(sizes)
    after = quorums[joint:]
    dropped = next((i for i, (_, members) in enumerate(after) if members == ("ft_ddp_0",)), None)
    check(
        dropped is not None and any(len(m) == 2 for _, m in after[dropped:]),
        "the Lighthouse role logged no quorum of both groups, then of group 0 alone, then of"
        " both again",
    )
    check(sizes[-1:] == [2], "the Lighthouse role's last quorum is not of both groups")
    # local_cwd hands every role the job's secret: the groups' reports were signed (the
    # Lighthouse role ended, so it took them)
    check(
        not any("is NOT authenticated" in line for line in console.lines),
        "the Lighthouse role's registry ran without the job's secret on local_cwd",
    )
    # the kill usually lands before group 0's allreduce of that step (the example's --step-s
    # comes first): group 0 skips that step, and its Manager, not a restart, handles the error
    failed = [f"{step} ({reason})" for step, reason, t in console.skipped(0) if t > killed_at]
    return (
        f"group 1 recovered in {rejoined.t - killed_at:.2f} s (kill to its first committed step"
        f" after its restart); group 0 meanwhile committed {len(while_down)} steps, longest pause"
        f" {pause:.2f} s after its step {before_pause.step}; group 0's steps not committed after"
        f" the kill: {failed or 'none'}"
    )
