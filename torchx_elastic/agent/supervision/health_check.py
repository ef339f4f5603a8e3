"""``--health-check CMD``: a node that fails it does not join the job.

The agent runs CMD (through ``sh -c``, in its working directory and environment) before
each rendezvous round it would join: the first, and each after a restart or a membership
change. Exit code 0 admits the node; anything else, or no exit within :data:`TIMEOUT_S`,
keeps it out: its workers are stopped already, it leaves without closing the rendezvous
(the other nodes go on without it, or wait for a replacement, as for a lost node) and exits
1, saying which check failed, how, and where its output is. Every run's output is kept in
the log directory (``health_check_round<N>.log``), and each run is an event (``health_check``:
round, exit_code, passed, output, seconds).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

TIMEOUT_S = 120.0
_LAST_LINE_CHARS = 200


class HealthCheckFailed(Exception):
    """This node failed its health check: the message says which, how, and where its output
    is."""


@dataclass(frozen=True)
class HealthCheckRun:
    round: int  # the rendezvous round it was run before (1: the first)
    exit_code: int | None  # None: it did not exit within TIMEOUT_S (killed)
    output: str  # the file that holds its stdout and stderr
    seconds: float

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def facts(self) -> dict[str, object]:
        """The ``health_check`` event's fields."""
        return {
            "round": self.round,
            "exit_code": self.exit_code,
            "passed": self.passed,
            "output": self.output,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class HealthCheck:
    command: str
    log_dir: str
    timeout_s: float = TIMEOUT_S

    def run(self, round_number: int) -> HealthCheckRun:
        output = os.path.join(self.log_dir, f"health_check_round{round_number}.log")
        started_s = time.monotonic()
        with open(output, "wb") as out:
            try:
                code: int | None = subprocess.run(
                    ["sh", "-c", self.command],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.timeout_s,
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
        return HealthCheckRun(round_number, code, output, time.monotonic() - started_s)

    def failure(self, run: HealthCheckRun) -> HealthCheckFailed:
        """What the node says when ``run`` failed."""
        how = (
            f"did not exit within {self.timeout_s:g}s (killed)"
            if run.exit_code is None
            else f"failed with {_exit_text(run.exit_code)}"
        )
        last = _last_line(run.output)
        said = f"; its last line: {last!r}" if last else ""
        return HealthCheckFailed(
            f"health check {self.command!r} {how} before rendezvous round {run.round}: this"
            f" node does not join the job{said}; its output: {run.output}"
        )


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(max(0, os.path.getsize(path) - 4096))
            lines = file.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    last = lines[-1].strip() if lines else ""
    return last if len(last) <= _LAST_LINE_CHARS else last[: _LAST_LINE_CHARS - 3] + "..."
