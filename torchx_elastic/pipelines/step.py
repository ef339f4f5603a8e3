"""Submit an app to Kubernetes and wait for it, as one step of a pipeline.

What any pipeline engine needs from a step: every node's lines in the step's own log as
they come, exit status 0 when the job SUCCEEDED and 1 with the root cause at the end of the
log when it did not, and the job cancelled when the step is stopped (SIGTERM: a deleted pod,
a stopped run, Ctrl-C). The job goes through torchx's runner and this package's
``kubernetes`` scheduler, with the pod's service account when run inside a cluster; nothing
here imports a pipeline SDK.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Dict, Mapping, Optional, Sequence, TextIO, Tuple

from torchx.runner import Runner, get_runner
from torchx.specs import AppDef, AppState, CfgVal

from torchx_elastic.pipelines.errors import with_role_hint
from torchx_elastic.pipelines.follow import LogFollower

logger = logging.getLogger(__name__)

SCHEDULER = "kubernetes"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
POLL_S = 2.0
LOG_DRAIN_S = 30.0
EXIT_FAILED = 1
EXIT_STOPPED = 143  # 128 + SIGTERM, as a shell reports a process that SIGTERM ended
PREFIX = "torchx-elastic:"


def in_cluster_cfg(cfg: Mapping[str, CfgVal]) -> Dict[str, CfgVal]:
    """``cfg`` with, inside a pod, the pod's own namespace unless it names one."""
    found = dict(cfg)
    if "namespace" not in found and SERVICE_ACCOUNT_NAMESPACE.is_file():
        found["namespace"] = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return found


class Step:
    """One submit-and-wait run; ``stop()`` (a signal handler calls it) cancels the job."""

    def __init__(self, out: TextIO, runner: Optional[Runner] = None) -> None:
        self._out = out
        self._runner = runner
        self._stop = threading.Event()
        self._done = threading.Event()

    def say(self, text: str) -> None:
        self._out.write(f"{PREFIX} {text}\n")
        self._out.flush()

    def stop(self) -> None:
        self._stop.set()

    def handle_signals(self) -> None:
        """SIGTERM and SIGINT stop the step (and so cancel the job)."""

        def handler(signum: int, frame: Optional[FrameType]) -> None:
            self.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, handler)

    def run(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> int:
        """Submits ``app``, follows it to its end; the exit status of the step."""
        runner = self._runner or get_runner()
        try:
            handle = runner.run(app, SCHEDULER, cfg=in_cluster_cfg(cfg))
        except Exception as e:
            self.say(f"cannot submit {app.name} to Kubernetes: {with_role_hint(e)}")
            return EXIT_FAILED
        self.say(f"submitted {handle}")
        follower = LogFollower(runner, handle, app, self._out, self._done, self.say)
        follower.start()
        state, msg = self._wait(runner, handle)
        self._done.set()
        if not self._stop.is_set():  # stopped: the pod has a grace period, not a log to finish
            follower.join(LOG_DRAIN_S)
        return self._end(handle, state, msg)

    def _wait(self, runner: Runner, handle: str) -> Tuple[Optional[AppState], str]:
        """The job's final state and message; None when it went before it ended."""
        while True:
            if self._stop.is_set():
                try:
                    runner.cancel(handle)
                except Exception as e:
                    why = with_role_hint(e)
                    return AppState.UNKNOWN, f"the step was stopped; cancelling the job: {why}"
                return AppState.CANCELLED, "the step was stopped: the job was cancelled"
            try:
                status = runner.status(handle)
            except Exception as e:
                return AppState.UNKNOWN, f"cannot read the job's status: {with_role_hint(e)}"
            if status is None:
                return None, "the job was deleted before it ended"
            if status.is_terminal():
                return status.state, status.msg
            self._stop.wait(POLL_S)

    def _end(self, handle: str, state: Optional[AppState], msg: str) -> int:
        if state == AppState.SUCCEEDED:
            self.say(f"{handle} SUCCEEDED")
            return 0
        name = state.name if state is not None else "GONE"
        self.say(f"{handle} {name}: {msg}" if msg else f"{handle} {name}")
        return EXIT_STOPPED if self._stop.is_set() else EXIT_FAILED


def write_outputs(outputs: Sequence[Tuple[str, str]]) -> None:
    """Writes each (path, value): the step's outputs, once its job succeeded."""
    for path, value in outputs:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value)
