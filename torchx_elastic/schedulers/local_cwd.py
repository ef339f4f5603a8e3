"""``local_cwd``: torchx's local scheduler, made right for torchx-elastic's agent.

On top of torchx's own ``local_cwd``:

- every replica gets ``TORCHX_RANK0_HOST`` (the ``rank0_env`` macro) = the loopback address,
  and so does ``TORCHX_ELASTIC_ROLE_RANK0_HOST`` (its own role's replica 0) in apps of
  several roles;
- a ``python``/``python3`` entrypoint runs with the interpreter that runs torchx, so the job
  sees the same virtual environment whether or not it is activated;
- logs are kept (``log_dir``, default ``./torchx_logs``) and their directory is printed:
  per replica the agent's console output, per rank the workers' stdout/stderr under
  ``torchelastic/<role>/attempt_<k>/rank_<r>/``;
- ``--max_retries`` of ``dist.ddp`` is honoured: it is the agent's ``--max-restarts`` (in-place
  restarts of the worker group); torchx 0.7's local scheduler ignores role retries;
- the agents stop their workers when the process that runs torchx dies, even by SIGKILL;
- ``torchx run`` returns as soon as the job ends: asked by torchx's ``Runner.wait`` (the
  CLI's wait for the job), the status waits for the replicas to exit instead of answering
  "running" and being asked again after a second's sleep; any other status call from the
  main thread waits up to ``STATUS_WAIT_S``;
- ``torchx log`` and the log tail of ``torchx run`` hand out whole lines only: a line that is
  half written when the log is read waits for its end (torchx's own tail splits it);
- on a terminal, the followed logs scroll above one live progress bar of the whole job
  (``job_bar.py``, ``progress_bar`` run option), and a rank's line that it redraws with
  carriage returns (its own progress bar) is live above it, as on the agent's own terminal
  (the agents keep those lines in ``live_rows.json`` of each replica's log directory);
- the combined log (``torchx run``'s followed lines, ``torchx log`` without ``--streams``)
  is the agent's ordered copy of its stdout and stderr (``console.log``), so a rank's lines
  keep the order it wrote them in across the two (torchx reads two files, which cannot);
- ``torchx run`` stopped by SIGTERM or Ctrl-C gives the job's workers torchrun's grace and its
  agents the time to record the stop, 30 s beyond the workers' grace at most; Ctrl-C again
  kills it at once (``local_stop.py``);
- every job gets a secret of its own (``TORCHX_ELASTIC_RDZV_SECRET`` in its replicas'
  environment, not in the dry run) that authenticates its rendezvous (docs/security.md), and
  its log directory is private to its user (0700), as torchrun's;
- while a node waits for the others, its status message is the rendezvous' waiting state
  (``waiting for nodes: 1 of 2 joined; ...``, agent/rendezvous/waiting_file.py);
- when a job that restarted or failed ends, one line names the command that draws its
  timeline (``torchx-elastic timeline <dir>``);
- a rendezvous port that another program (another job) has is replaced by a free one, said
  in one line (``local_ports.py``).

Run options: torchx's local ones (``log_dir``, ``prepend_cwd``, ``auto_set_cuda_visible_devices``)
with the same meaning, declared once in :class:`LocalCwdOptions`.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Mapping, Optional

from torchx.schedulers.api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    Stream,
    filter_regex,
)
from torchx.schedulers.local_scheduler import (
    CWDImageProvider,
    ImageProvider,
    LocalScheduler,
    PopenRequest,
    ReplicaParam,
)
from torchx.specs import NONE, AppDef, AppState, CfgVal, is_terminal, runopts

from torchx_elastic.components.agent_command import AGENT_MODULE
from torchx_elastic.contract import (
    CONSOLE_COPY_ENV,
    LAUNCHER_PID_ENV,
    RANK0_ENV,
    ROLE_RANK0_ENV,
    SECRET_ENV,
    new_secret,
    waiting_file,
)
from torchx_elastic.contract.events import restarted_or_failed
from torchx_elastic.contract.job_progress import read_file, read_nodes_file
from torchx_elastic.contract.live_rows import LIVE_ROWS_ENV
from torchx_elastic.contract.log_layout import (
    CONSOLE_COPY_FILE,
    LOCAL_LOG_ROOT,
    STDERR_FILE,
    STDOUT_FILE,
    LocalAppLogs,
)
from torchx_elastic.contract.terminal_size import TERMINAL_SIZE_ENV, write_size
from torchx_elastic.contract.timeline_command import command_for
from torchx_elastic.schedulers import role_status
from torchx_elastic.schedulers.compat import (
    as_torchx_cfg,
    asked_by_runner_wait,
    local_app,
    local_replicas,
    local_roles,
)
from torchx_elastic.schedulers.errors import UserError
from torchx_elastic.schedulers.file_lines import follow_lines, tail_lines
from torchx_elastic.schedulers.job_bar import (
    SharedBar,
    TerminalBar,
    progress_files,
    terminal_size,
    terminal_wanted,
)
from torchx_elastic.schedulers.local_ports import move_taken_ports
from torchx_elastic.schedulers.local_stop import Followers, stop_replicas, workers_grace_s
from torchx_elastic.schedulers.options import RunOptions, option
from torchx_elastic.schedulers.progress_status import (
    JobLine,
    Progress,
    job_line_text,
    join_message,
)
from torchx_elastic.schedulers.replica_logs import LogQuery, ReplicaLogs
from torchx_elastic.schedulers.role_states import replicas_state, with_lost_replicas

RANK0_HOST = "127.0.0.1"
RANK0_AGENT = "its rank-0 agent"  # where a status line's figures come from
_PYTHON_ENTRYPOINTS = frozenset({"python", "python3"})
STATUS_WAIT_S = 0.9
# the files torchx's local scheduler writes per replica (``<log_dir>/<role>/<replica>/``)
_STREAM_FILES = {
    Stream.STDOUT: (STDOUT_FILE,),
    Stream.STDERR: (STDERR_FILE,),
    Stream.COMBINED: (STDOUT_FILE, STDERR_FILE),
}


def _process_state(returncode: Optional[int]) -> AppState:
    if returncode is None:
        return AppState.RUNNING
    return AppState.SUCCEEDED if returncode == 0 else AppState.FAILED


def _runs_the_agent(replica: ReplicaParam) -> bool:
    return AGENT_MODULE in replica.args[:3]


def _first_role_log(app_log_dir: str, role: str) -> str:
    """The stderr of the app's first role's replica 0 (``ft.ddp``'s Lighthouse)."""
    return LocalAppLogs(app_log_dir).replica_stderr(role, 0)


@dataclass(frozen=True)
class LocalCwdOptions(RunOptions):
    """torchx's ``local_cwd`` run options; only ``log_dir``'s default differs."""

    SCHEDULER: ClassVar[str] = "local_cwd"

    log_dir: str = option(  # torchx's default is a temporary directory deleted at exit
        LOCAL_LOG_ROOT,
        type_=str,
        help="directory for the logs of every run, kept after the run (relative to the cwd)",
    )
    prepend_cwd: bool = option(
        False,
        type_=bool,
        help="if set, prepends CWD to replica's PATH env var"
        " making any binaries in CWD take precedence over those in PATH",
    )
    auto_set_cuda_visible_devices: bool = option(
        False,
        type_=bool,
        help="sets CUDA_VISIBLE_DEVICES for roles that request GPUs: each replica gets"
        " its own GPUs (nothing is set when there are fewer GPUs than asked for)",
    )
    progress_bar: bool = option(
        True,
        type_=bool,
        help="on a terminal, one live progress bar of the whole job below the followed logs",
    )


class LocalCwdScheduler(ReplicaLogs, LocalScheduler):
    def __init__(
        self,
        session_name: str,
        cache_size: int = 100,
        extra_paths: Optional[List[str]] = None,
        image_provider_class: Callable[[Mapping[str, CfgVal]], ImageProvider] = CWDImageProvider,
    ) -> None:
        super().__init__(
            session_name,
            image_provider_class=image_provider_class,
            cache_size=cache_size,
            extra_paths=extra_paths,
        )
        self._bars: Dict[str, SharedBar] = {}
        self._bar_wanted: Dict[str, bool] = {}
        self._timeline_told: set[str] = set()
        self._console_copied: set[tuple[str, str]] = set()  # (app id, role)
        self._workers_grace_s: Dict[str, float] = {}  # app id -> its workers' grace on a stop
        self._followers = Followers()

    def _run_opts(self) -> runopts:
        return LocalCwdOptions.runopts()

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[PopenRequest]:
        options = LocalCwdOptions.from_cfg(cfg)
        resolved = {**asdict(options), "log_dir": os.path.abspath(options.log_dir)}
        info = super()._submit_dryrun(app, as_torchx_cfg(cfg, resolved))
        self._bar_wanted[info.request.app_id] = options.progress_bar
        for replica in local_replicas(info.request):
            replica.env[RANK0_ENV] = RANK0_HOST
            if len(app.roles) > 1:  # each role's own replica 0 (ft.ddp's groups)
                replica.env[ROLE_RANK0_ENV] = RANK0_HOST
            # the agent stops its workers when this process dies, even by SIGKILL
            replica.env[LAUNCHER_PID_ENV] = str(os.getpid())
            if os.path.basename(replica.args[0]) in _PYTHON_ENTRYPOINTS:
                replica.args[0] = sys.executable
        return info

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        request = dryrun_info.request
        secret = new_secret()
        for replica in local_replicas(request):
            replica.env[SECRET_ENV] = secret
        move_taken_ports(local_roles(request))
        drawn = self._bar_wanted.get(request.app_id, True) and terminal_wanted(sys.stderr)
        logs = LocalAppLogs(request.log_dir)
        for role, replicas in local_roles(request).items():
            for k, replica in enumerate(replicas):
                if not _runs_the_agent(replica):
                    continue
                if drawn:  # the ranks' unfinished lines, drawn; their terminal's size
                    replica.env[LIVE_ROWS_ENV] = logs.live_rows(role, k)
                    replica.env[TERMINAL_SIZE_ENV] = logs.terminal_size
                # the combined log: a rank's stdout and stderr lines in the order it wrote them
                replica.env[CONSOLE_COPY_ENV] = logs.console_copy(role, k)
                self._console_copied.add((request.app_id, role))
        self._workers_grace_s[request.app_id] = max(
            workers_grace_s(r.args, r.env) for r in local_replicas(request)
        )
        # the job's logs are its user's only: torchx makes the job's directory (it must not
        # exist yet) in the session's, which is private before anything is written
        session_dir = os.path.dirname(request.log_dir)
        os.makedirs(session_dir, mode=0o700, exist_ok=True)
        os.chmod(session_dir, 0o700)
        app_id: str = super().schedule(dryrun_info)
        os.chmod(request.log_dir, 0o700)
        if drawn:  # before the agents start their workers (they import torch first)
            size = terminal_size(sys.stderr.fileno())
            write_size(logs.terminal_size, *((size.columns, size.lines) if size else (0, 0)))
        print(
            f"torchx-elastic: logs of {app_id} are kept in {dryrun_info.request.log_dir}",
            file=sys.stderr,
        )
        return app_id

    def replica_log(self, app_id: str, role_name: str, k: int, query: LogQuery) -> Iterable[str]:
        """Whole lines of a replica's log, followed until the job ends (as torchx does).

        Local log lines carry no times: ``since``/``until`` are ignored with a warning, as
        torchx does.
        """
        if query.since or query.until:
            warnings.warn(
                "since/until are ignored by local_cwd's logs (its lines carry no times);"
                " all lines are returned",
                stacklevel=3,
            )
        app = local_app(self, app_id)
        if app is None:
            raise ValueError(f"unknown app {app_id!r} in this torchx session")
        logs = LocalAppLogs(app.log_dir)
        replica_dir = logs.replica_dir(role_name, k)
        names = _STREAM_FILES[query.streams or Stream.COMBINED]
        if names == _STREAM_FILES[Stream.COMBINED] and (
            (app_id, role_name) in self._console_copied
            or os.path.exists(logs.console_copy(role_name, k))
        ):
            names = (CONSOLE_COPY_FILE,)  # two files cannot say which line came first
        lines = follow_lines(
            [os.path.join(replica_dir, name) for name in names],
            finished=lambda: self._finished(app_id),
        )
        if query.regex:
            lines = filter_regex(query.regex, lines)
        if query.follow and self._bar_wanted.get(app_id, True) and terminal_wanted(sys.stderr):
            app_log_dir = app.log_dir
            first = _first_role_log(app_log_dir, next(iter(app.role_replicas)))
            bar = self._bars.setdefault(
                app_id,
                SharedBar(
                    TerminalBar(
                        lambda: progress_files(app_log_dir),
                        lambda: role_status.read(tail_lines(first)),
                        row_files=[
                            (f"{role}/{k}", logs.live_rows(role, k))
                            for role, replicas in app.role_replicas.items()
                            for k in range(len(replicas))
                        ],
                        size_file=logs.terminal_size,
                    )
                ),
            )
            lines = bar.lines(lines)
        return self._followers.follow(lines) if query.follow else lines

    def close(self) -> None:
        """torchx's, after the job's agents had the time to stop (``local_stop.py``): the
        runner closes the scheduler when ``torchx run`` is stopped by SIGTERM or Ctrl-C."""
        try:
            for app_id, grace_s in self._workers_grace_s.items():
                app = local_app(self, app_id)
                if app is not None:
                    procs = [r.proc for replicas in app.role_replicas.values() for r in replicas]
                    stop_replicas(procs, grace_s)
            self._followers.wait_done()
        finally:
            super().close()

    def _finished(self, app_id: str) -> bool:
        desc = super().describe(app_id)
        return desc is None or is_terminal(desc.state)

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        app = local_app(self, app_id)
        # only the CLI's status poll (main thread) waits; its log thread must not be held up
        if app is not None and threading.current_thread() is threading.main_thread():
            self._wait_for_exit(app_id, None if asked_by_runner_wait() else STATUS_WAIT_S)
            desc = self._with_lost_replicas(super().describe(app_id))
            if desc is not None and is_terminal(desc.state):
                self._tell_timeline(app_id)
            return self._with_groups(self._with_waiting(self._with_progress(desc)))
        desc = self._with_lost_replicas(super().describe(app_id))
        return self._with_groups(self._with_waiting(self._with_progress(desc)))

    def _with_lost_replicas(
        self, desc: Optional[DescribeAppResponse]
    ) -> Optional[DescribeAppResponse]:
        """torchx fails a local app when any replica did; a replica whose agent was killed by
        a signal is a lost node, and the job is what the agents that stayed made of it
        (``role_states.with_lost_replicas``)."""
        app = local_app(self, desc.app_id) if desc is not None else None
        if desc is None or app is None or desc.state != AppState.FAILED:
            return desc
        replicas = [r for rs in app.role_replicas.values() for r in rs]
        agents = all(AGENT_MODULE in list(r.proc.args)[:3] for r in replicas)
        if agents and with_lost_replicas([r.proc.poll() for r in replicas]) == AppState.SUCCEEDED:
            desc.state = AppState.SUCCEEDED
            app.set_state(AppState.SUCCEEDED)
        return desc

    def list(self, cfg: Optional[Mapping[str, CfgVal]] = None) -> List[ListAppResponse]:
        """torchx's local schedulers keep no record of their jobs beyond the process that ran
        them, and raise a bare ``Exception`` (a traceback): say where the jobs' records are.
        ``cfg``: the run options, which torchx's development line passes."""
        raise UserError(
            "local_cwd keeps no record of its jobs beyond the torchx process that ran them (as"
            " torchx's local schedulers); each job's logs, summary and events stay in its"
            f" log_dir (default ./{LOCAL_LOG_ROOT}/<session>/<app id>), and"
            f" `{command_for('<that directory>')}` shows how it went"
        )

    def _with_waiting(self, desc: Optional[DescribeAppResponse]) -> Optional[DescribeAppResponse]:
        """``desc`` with the rendezvous' waiting state (``waiting for nodes: 1 of 2 joined;
        ...``) as its message while an agent of the job waits for the others."""
        app = local_app(self, desc.app_id) if desc is not None else None
        if desc is None or app is None or is_terminal(desc.state):
            return desc
        dirs = glob.glob(LocalAppLogs(app.log_dir).agents("*").root)
        waiting = waiting_file.newest_message(dirs)
        if waiting is not None:
            desc.msg = waiting
        return desc

    def _with_progress(self, desc: Optional[DescribeAppResponse]) -> Optional[DescribeAppResponse]:
        """An app of one role (``dist.ddp``) that runs: what its rank-0 agent's progress file
        says, the job's progress or, where no rank reports any and the job has had a
        standby, its nodes (``nodes: 2 training, 1 standby (as of 3s ago, its rank-0
        agent)``)."""
        app = local_app(self, desc.app_id) if desc is not None else None
        if desc is None or app is None or len(app.role_replicas) != 1 or is_terminal(desc.state):
            return desc
        path = LocalAppLogs(app.log_dir).agents(next(iter(app.role_replicas))).job_progress
        text = file_progress_text(path)
        if text is not None:
            desc.msg = join_message(desc.msg, text, NONE)
        return desc

    def _with_groups(self, desc: Optional[DescribeAppResponse]) -> Optional[DescribeAppResponse]:
        """An app of several roles (``ft.ddp``): each role's state and, per replica group,
        whether it trains or recovers and its progress; the Lighthouse's last quorum and the
        job's progress across the groups (``role_status.py``, ``ft_groups.py``)."""
        app = local_app(self, desc.app_id) if desc is not None else None
        if desc is None or app is None or len(app.role_replicas) < 2:
            return desc
        states = {
            role: replicas_state([_process_state(r.proc.poll()) for r in replicas])
            for role, replicas in app.role_replicas.items()
        }
        first = _first_role_log(app.log_dir, next(iter(states)))
        progress: Dict[str, Progress] = {}
        for role in states:
            summary = read_file(LocalAppLogs(app.log_dir).agents(role).job_progress)
            if summary is not None:
                at = datetime.fromtimestamp(summary.time_s, timezone.utc)
                progress[role] = (at, summary.figures())
        lines = role_status.read(tail_lines(first)).roles_lines(states, progress)
        desc.msg = join_message(desc.msg, "\n".join(lines), NONE)
        return desc

    def _tell_timeline(self, app_id: str) -> None:
        """Once, when the job restarted or failed: the command that draws its timeline."""
        if app_id in self._timeline_told:
            return
        self._timeline_told.add(app_id)
        app = local_app(self, app_id)
        for role in app.role_replicas:
            agents_dir = LocalAppLogs(app.log_dir).agents(role).root
            if restarted_or_failed(agents_dir):
                print(
                    f"torchx-elastic: {role} restarted or failed; its timeline:"
                    f" {command_for(agents_dir)}",
                    file=sys.stderr,
                )

    def _wait_for_exit(self, app_id: str, timeout_s: float | None) -> None:
        """Until every replica exited, or ``timeout_s`` (None: no limit)."""
        app = local_app(self, app_id)
        if is_terminal(app.state):
            return
        procs = [r.proc for replicas in app.role_replicas.values() for r in replicas]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for proc in procs:  # no limit: blocked in waitpid, no polling beside the job
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                proc.wait(remaining)
            except subprocess.TimeoutExpired:
                return


def file_progress_text(path: str, now: Optional[datetime] = None) -> Optional[str]:
    """The status text of a rank-0 agent's progress file: ``progress 120/200 (60.0%) of 4/4
    ranks, ...`` or ``nodes: 2 training, 1 standby`` with its age; None: it has neither."""
    found: Optional[JobLine] = None
    summary = read_file(path)
    if summary is not None:
        found = (datetime.fromtimestamp(summary.time_s, timezone.utc), summary.figures())
    counts = read_nodes_file(path) if summary is None else None
    if counts is not None:
        found = (datetime.fromtimestamp(counts.time_s, timezone.utc), counts)
    return None if found is None else job_line_text(found, now, RANK0_AGENT)


def create_scheduler(
    session_name: str,
    cache_size: int = 100,
    extra_paths: Optional[List[str]] = None,
    image_provider_class: Callable[[Mapping[str, CfgVal]], ImageProvider] = CWDImageProvider,
    **kwargs: Any,
) -> LocalCwdScheduler:
    """torchx's ``local_cwd`` factory, with every argument of torchx's own."""
    return LocalCwdScheduler(
        session_name=session_name,
        cache_size=cache_size,
        extra_paths=extra_paths,
        image_provider_class=image_provider_class,
    )
