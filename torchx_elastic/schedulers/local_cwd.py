"""``local_cwd``: torchx's local scheduler, made right for torchx-elastic's agent.

On top of torchx's own ``local_cwd``:

- every replica gets ``TORCHX_RANK0_HOST`` (the ``rank0_env`` macro) = the loopback address;
- a ``python``/``python3`` entrypoint runs with the interpreter that runs torchx, so the job
  sees the same virtual environment whether or not it is activated;
- logs are kept (``log_dir``, default ``./torchx_logs``) and their directory is printed:
  per replica the agent's console output, per rank the workers' stdout/stderr under
  ``torchelastic/<role>/attempt_<k>/rank_<r>/``;
- ``--max_retries`` of ``dist.ddp`` is honoured: it is the agent's ``--max-restarts`` (in-place
  restarts of the worker group); torchx 0.7's local scheduler ignores role retries;
- the agents stop their workers when the process that runs torchx dies, even by SIGKILL;
- ``torchx run`` returns as soon as the job ends: its status poll (once a second) waits up to
  ``STATUS_WAIT_S`` for the replicas to exit instead of answering "running" at once;
- on a terminal, the followed logs scroll above one live progress bar of the whole job
  (``job_bar.py``, ``progress_bar`` run option).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import datetime
from typing import Any, Dict, Iterable, Optional

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, Stream
from torchx.schedulers.local_scheduler import (
    CWDImageProvider,
    LocalOpts,
    LocalScheduler,
    PopenRequest,
)
from torchx.specs import AppDef, is_terminal, runopts

from torchx_elastic.schedulers.job_bar import (
    SharedBar,
    TerminalBar,
    progress_files,
    terminal_wanted,
)

RANK0_ENV = "TORCHX_RANK0_HOST"
LAUNCHER_PID_ENV = "TORCHX_ELASTIC_LAUNCHER_PID"  # the agent's bootstrap.LAUNCHER_PID_ENV
RANK0_HOST = "127.0.0.1"
DEFAULT_LOG_DIR = "torchx_logs"
_PYTHON_ENTRYPOINTS = frozenset({"python", "python3"})
STATUS_WAIT_S = 0.9
_EXIT_POLL_S = 0.01


class LocalCwdScheduler(LocalScheduler):
    def __init__(self, session_name: str, cache_size: int = 100) -> None:
        super().__init__(session_name, image_provider_class=CWDImageProvider, cache_size=cache_size)
        self._bars: Dict[str, SharedBar] = {}
        self._bar_wanted: Dict[str, bool] = {}

    def _run_opts(self) -> runopts:
        opts = super()._run_opts()
        opts.add(  # replaces torchx's log_dir, whose default is deleted at exit
            "log_dir",
            type_=str,
            default=DEFAULT_LOG_DIR,
            help="directory for the logs of every run, kept after the run (relative to the cwd)",
        )
        opts.add(
            "progress_bar",
            type_=bool,
            default=True,
            help="on a terminal, one live progress bar of the whole job below the followed logs",
        )
        return opts

    def _submit_dryrun(self, app: AppDef, cfg: LocalOpts) -> AppDryRunInfo[PopenRequest]:
        cfg = {**cfg, "log_dir": os.path.abspath(cfg.get("log_dir") or DEFAULT_LOG_DIR)}
        info = super()._submit_dryrun(app, cfg)
        self._bar_wanted[info.request.app_id] = bool(cfg.get("progress_bar", True))
        for replicas in info.request.role_params.values():
            for replica in replicas:
                replica.env[RANK0_ENV] = RANK0_HOST
                # the agent stops its workers when this process dies, even by SIGKILL
                replica.env[LAUNCHER_PID_ENV] = str(os.getpid())
                if os.path.basename(replica.args[0]) in _PYTHON_ENTRYPOINTS:
                    replica.args[0] = sys.executable
        return info

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        app_id: str = super().schedule(dryrun_info)
        print(
            f"torchx-elastic: logs of {app_id} are kept in {dryrun_info.request.log_dir}",
            file=sys.stderr,
        )
        return app_id

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        app = self._apps.get(app_id)
        # only the CLI's status poll (main thread) waits; its log thread must not be held up
        if app is not None and threading.current_thread() is threading.main_thread():
            self._wait_for_exit(app_id, STATUS_WAIT_S)
        return super().describe(app_id)

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        should_tail: bool = False,
        streams: Optional[Stream] = None,
    ) -> Iterable[str]:
        lines: Iterable[str] = super().log_iter(
            app_id, role_name, k, regex, since, until, should_tail, streams
        )
        if not should_tail or not self._bar_wanted.get(app_id, True):
            return lines
        if not terminal_wanted(sys.stderr):
            return lines
        app_log_dir = self._apps[app_id].log_dir
        bar = self._bars.setdefault(
            app_id, SharedBar(TerminalBar(lambda: progress_files(app_log_dir)))
        )
        return bar.lines(lines)

    def _wait_for_exit(self, app_id: str, timeout_s: float) -> None:
        app = self._apps[app_id]
        if is_terminal(app.state):
            return
        procs = [r.proc for replicas in app.role_replicas.values() for r in replicas]
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(_EXIT_POLL_S)


def create_scheduler(session_name: str, cache_size: int = 100, **kwargs: Any) -> LocalCwdScheduler:
    return LocalCwdScheduler(session_name=session_name, cache_size=cache_size)
