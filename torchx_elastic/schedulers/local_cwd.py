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
  ``STATUS_WAIT_S`` for the replicas to exit instead of answering "running" at once.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Optional

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse
from torchx.schedulers.local_scheduler import (
    CWDImageProvider,
    LocalOpts,
    LocalScheduler,
    PopenRequest,
)
from torchx.specs import AppDef, is_terminal, runopts

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

    def _run_opts(self) -> runopts:
        opts = super()._run_opts()
        opts.add(  # replaces torchx's log_dir, whose default is deleted at exit
            "log_dir",
            type_=str,
            default=DEFAULT_LOG_DIR,
            help="directory for the logs of every run, kept after the run (relative to the cwd)",
        )
        return opts

    def _submit_dryrun(self, app: AppDef, cfg: LocalOpts) -> AppDryRunInfo[PopenRequest]:
        cfg = {**cfg, "log_dir": os.path.abspath(cfg.get("log_dir") or DEFAULT_LOG_DIR)}
        info = super()._submit_dryrun(app, cfg)
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
