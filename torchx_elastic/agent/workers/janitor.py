"""A tiny process that outlives the agent and kills its workers' process groups.

Workers die with the agent through the Linux parent-death signal, but their own children
(data loader workers, shell pipelines, ...) do not. The janitor, a separate process started
once per agent, keeps the list of live worker process groups on its stdin; when the agent
dies without saying goodbye (even by SIGKILL) its stdin reaches end of file and it kills
every group still listed. Protocol, one line each: ``+PGID``, ``-PGID``, ``bye``.

Run as ``python -m torchx_elastic.agent.workers.janitor``; standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading


def serve(lines: list[str] | None = None) -> None:
    groups: set[int] = set()
    for line in lines if lines is not None else sys.stdin:
        word = line.strip()
        if word == "bye":
            return
        if word[:1] in "+-" and word[1:].isdigit():
            (groups.add if word[0] == "+" else groups.discard)(int(word[1:]))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Janitor:
    """The agent's handle on its janitor process."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C in the terminal is for the agent, not for it
            text=True,
        )
        self._lock = threading.Lock()

    def _say(self, line: str) -> None:
        with self._lock:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def watch(self, pgid: int) -> None:
        self._say(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._say(f"-{pgid}")

    def close(self) -> None:
        """Normal exit: the janitor leaves without killing anything (if it is still there:
        a SIGKILL to the whole step may have ended it before the agent)."""
        self._say("bye")
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except (BrokenPipeError, ValueError):  # the janitor is gone: "bye" was unread
                pass
        self._proc.wait()


if __name__ == "__main__":
    # a scheduler signals every process of a node (Slurm: the whole step), the janitor too:
    # it goes on until the agent says goodbye or dies, and then kills what is left
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(_sig, signal.SIG_IGN)
    serve()
