"""Where the agents' files are: a node's log directory and a local job's, as one paths object
each.

- :class:`NodeLogs`: an agent's log directory (its ``--log-dir``): the job's events
  (``events.jsonl``), the run's summary per node (``summary_node<N>.json``), the job's
  progress (``job_progress.json``, the rank-0 node's), and per attempt and global rank the
  rank's output and error file (``attempt_<k>/rank_<r>/{stdout.log,stderr.log,error.json}``)
  beside the lines the console's duplicate filters kept (``attempt_<k>/filtered_<stream>.log``);
- :class:`LocalAppLogs`: the directory torchx's local schedulers give an app
  (``<log_dir>/<session>/<app_id>``): each role's agents' log directory
  (``torchelastic/<role>``, a :class:`NodeLogs`) and each replica's own files
  (``<role>/<replica>/``: its stdout and stderr as torchx names them, the agent's ordered
  copy of both, ``console.log``, and its ranks' unfinished lines, ``live_rows.json``).

``torchx_elastic.contract`` re-exports the file names; the writers and readers of each file
(``events.py``, ``job_progress.py``, ``error_file.py``, ``waiting_file.py``,
``live_rows.py``) say what is in it. ``os`` only: a worker imports the contract before the
user's first import (no ``dataclasses`` here, which costs a training script tens of ms).
"""

from __future__ import annotations

import os

EVENTS_FILE = "events.jsonl"  # events.py
SUMMARY_PREFIX = "summary_node"  # summary_node<N>.json, the run on node N (events.py)
JOB_PROGRESS_FILE = "job_progress.json"  # the rank-0 node's (job_progress.py)
# <log_dir>/attempt_<k>/rank_<r>/: a rank's output and error file; torchx's local schedulers
# name a replica's output files the same (<app log dir>/<role>/<replica>/)
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
RANK_ERROR_FILE = "error.json"  # the TORCHELASTIC_ERROR_FILE the agent gives the rank
# waiting_for_nodes.<host>.<pid>.json while a node waits (waiting_file.py)
WAITING_FILE_PREFIX = "waiting_for_nodes."
# torchx's local schedulers keep a role's agent logs in <app log dir>/torchelastic/<role>
AGENTS_LOG_SUBDIR = "torchelastic"
ATTEMPT_DIR_PREFIX = "attempt_"  # + the attempt (0 for the first start)
RANK_DIR_PREFIX = "rank_"  # + the global rank
# the lines of an attempt's ranks that the console's duplicate filters kept (--filter-*)
FILTERED_FILE = "filtered_{stream}.log"  # stream: stdout or stderr
# the agent's ordered copy of what it prints (CONSOLE_COPY_ENV), in a local replica's directory
CONSOLE_COPY_FILE = "console.log"
# the ranks' unfinished lines, in each local replica's directory while local_cwd draws
LIVE_ROWS_FILE = "live_rows.json"  # live_rows.py
TERMINAL_SIZE_FILE = "terminal_size"  # terminal_size.py
# the agent's log directory when it is given no --log-dir: a new directory of this prefix in
# the temporary directory (tempfile.mkdtemp: /tmp in a container, where the docker timeline
# copies it from)
DEFAULT_LOG_DIR_PREFIX = "torchx_elastic_"
# local_cwd's default log_dir (relative to the working directory), where the timeline looks
# for a local_cwd:// handle's files
LOCAL_LOG_ROOT = "torchx_logs"


class _Directory:
    """A directory's paths: immutable, equal and printed by its ``root`` (a frozen
    dataclass would import ``dataclasses``)."""

    __slots__ = ("_root",)

    def __init__(self, root: str) -> None:
        self._root = root

    @property
    def root(self) -> str:
        return self._root

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.root == self._root

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._root))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._root!r})"


class NodeLogs(_Directory):
    """The files of one agent's log directory ``root``."""

    __slots__ = ()

    @property
    def events(self) -> str:
        """``<root>/events.jsonl``: every agent's event records (events.py)."""
        return os.path.join(self.root, EVENTS_FILE)

    def summary(self, node: int) -> str:
        """``<root>/summary_node<node>.json``: the run on node ``node`` (events.py)."""
        return os.path.join(self.root, f"{SUMMARY_PREFIX}{node}.json")

    @property
    def summaries(self) -> str:
        """The glob pattern of every node's summary."""
        return os.path.join(self.root, f"{SUMMARY_PREFIX}*.json")

    @property
    def job_progress(self) -> str:
        """``<root>/job_progress.json``: the job's progress, the rank-0 node's (job_progress.py)."""
        return os.path.join(self.root, JOB_PROGRESS_FILE)

    def attempt_dir(self, attempt: int | str) -> str:
        """``<root>/attempt_<attempt>``: the ranks' directories of one attempt."""
        return os.path.join(self.root, f"{ATTEMPT_DIR_PREFIX}{attempt}")

    def rank_dir(self, attempt: int | str, rank: int | str) -> str:
        """``<root>/attempt_<attempt>/rank_<rank>``: the files of global rank ``rank``."""
        return os.path.join(self.attempt_dir(attempt), f"{RANK_DIR_PREFIX}{rank}")

    def rank_stdout(self, attempt: int | str, rank: int | str) -> str:
        return os.path.join(self.rank_dir(attempt, rank), STDOUT_FILE)

    def rank_stderr(self, attempt: int | str, rank: int | str) -> str:
        return os.path.join(self.rank_dir(attempt, rank), STDERR_FILE)

    def rank_error_file(self, attempt: int | str, rank: int | str) -> str:
        """The ``TORCHELASTIC_ERROR_FILE`` the agent gives the rank (error_file.py)."""
        return os.path.join(self.rank_dir(attempt, rank), RANK_ERROR_FILE)

    def filtered(self, attempt: int | str, stream: str) -> str:
        """``<root>/attempt_<attempt>/filtered_<stream>.log`` (stream: stdout or stderr)."""
        return os.path.join(self.attempt_dir(attempt), FILTERED_FILE.format(stream=stream))

    def ranks_of_attempt(self, attempt: int) -> list[int]:
        """The global ranks that have a directory in ``attempt`` (this node's), sorted."""
        top = self.attempt_dir(attempt)
        names = os.listdir(top) if os.path.isdir(top) else []
        return sorted(
            int(name[len(RANK_DIR_PREFIX) :])
            for name in names
            if name.startswith(RANK_DIR_PREFIX) and name[len(RANK_DIR_PREFIX) :].isdigit()
        )


class LocalAppLogs(_Directory):
    """The files of an app that torchx's local schedulers ran, under its directory ``root``
    (``<log_dir>/<session>/<app_id>``)."""

    __slots__ = ()

    def agents(self, role: str) -> NodeLogs:
        """``<root>/torchelastic/<role>``: the log directory of ``role``'s agents (``*``: a
        glob pattern of every role's)."""
        return NodeLogs(os.path.join(self.root, AGENTS_LOG_SUBDIR, role))

    def replica_dir(self, role: str, replica: int | str) -> str:
        """``<root>/<role>/<replica>``: torchx's directory of one replica's output."""
        return os.path.join(self.root, role, str(replica))

    def replica_stdout(self, role: str, replica: int | str) -> str:
        return os.path.join(self.replica_dir(role, replica), STDOUT_FILE)

    def replica_stderr(self, role: str, replica: int | str) -> str:
        return os.path.join(self.replica_dir(role, replica), STDERR_FILE)

    def console_copy(self, role: str, replica: int | str) -> str:
        """The agent's stdout and stderr in the order it printed them (CONSOLE_COPY_ENV)."""
        return os.path.join(self.replica_dir(role, replica), CONSOLE_COPY_FILE)

    def live_rows(self, role: str, replica: int | str) -> str:
        """Its ranks' unfinished lines, while local_cwd draws on a terminal (live_rows.py)."""
        return os.path.join(self.replica_dir(role, replica), LIVE_ROWS_FILE)

    @property
    def terminal_size(self) -> str:
        """The size of the terminal local_cwd draws on, for the workers' (terminal_size.py)."""
        return os.path.join(self.root, TERMINAL_SIZE_FILE)
