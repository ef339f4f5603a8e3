"""Every node's log lines, into one stream as they come.

One thread per replica follows its log through torchx's runner (``Runner.log_lines`` with
``should_tail``). When the job restarts a node (its count of restarts grows: a retried or
replaced pod), each thread follows its replica again from the time its last stream ended,
so the lines of a replacement pod come too.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from typing import Callable, List, Optional, TextIO

from torchx.runner import Runner
from torchx.specs import AppDef

from torchx_elastic.pipelines.errors import with_role_hint

logger = logging.getLogger(__name__)

AGAIN_S = 2.0


class LogFollower:
    """Writes ``<role>/<replica> <line>`` to ``out`` for every replica of ``app``."""

    def __init__(
        self,
        runner: Runner,
        handle: str,
        app: AppDef,
        out: TextIO,
        done: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        self._runner = runner
        self._handle = handle
        self._out = out
        self._done = done
        self._say = say
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = [
            threading.Thread(target=self._follow, args=(role.name, k), daemon=True)
            for role in app.roles
            for k in range(role.num_replicas)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> None:
        """Waits for the streams to end (the job ended: each pod's log is complete)."""
        for thread in self._threads:
            thread.join(timeout_s)

    def _write(self, prefix: str, line: str) -> None:
        with self._lock:
            self._out.write(f"{prefix} {line}" if line.endswith("\n") else f"{prefix} {line}\n")
            self._out.flush()

    def _follow(self, role: str, k: int) -> None:
        prefix = f"{role}/{k}"
        since: Optional[datetime] = None
        said = ""  # the scheduler's last line about a replica without a log (said once)
        followed = -1  # the job's count of restarts when the last stream started
        while True:
            ended = self._done.is_set()  # the job's end: this pass is the last one
            try:
                restarts = self._restarts()
                if restarts == followed or restarts < 0:
                    if ended:
                        return
                    self._done.wait(AGAIN_S)
                    continue
                followed = restarts
                for line in self._runner.log_lines(
                    self._handle, role, k, since=since, should_tail=True
                ):
                    if line.startswith("torchx-elastic: "):
                        if line == said:
                            continue
                        said = line
                    self._write(prefix, line)
            except Exception as e:  # a forbidden or broken log: say so, the job goes on
                self._say(f"cannot follow the log of {prefix}: {with_role_hint(e)}")
                return
            if ended:
                return
            since = datetime.now(timezone.utc)

    def _restarts(self) -> int:
        status = self._runner.status(self._handle)
        return status.num_restarts if status is not None else -1
