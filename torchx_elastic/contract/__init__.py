"""The contract between the agent, the schedulers and the workers: the one place that names it.

The agent (``torchx_elastic.agent``), the schedulers (``torchx_elastic.schedulers``, ``torchx
status``), the timeline and the tests import it; nothing else spells these names.

- the environment variables the agent, the workers and the schedulers set and read (below);
- the files a node writes in its log directory, with a writer and a reader each:
  :mod:`.events` (``events.jsonl``, and the summary ``summary_node<N>.json``),
  :mod:`.job_progress` (``job_progress.json`` and the ``[job progress]`` log line),
  :mod:`.error_file` (torch's error file, ``TORCHELASTIC_ERROR_FILE``),
  :mod:`.waiting_file` (a node's wait for the others, for ``torchx status``);
- the files a scheduler hands to the agent: :mod:`.env_file` (docker's ``secret_env_file``);
- the store keys the agents of a job exchange over their rendezvous store (below).

Standard library only: the worker bootstrap imports it before the user's first import, and
the schedulers import it without the agent (or ``rich``).
"""

from __future__ import annotations

import os

# --- environment variables ---------------------------------------------------------------
# set by torchx-elastic
LAUNCHER_PID_ENV = "TORCHX_ELASTIC_LAUNCHER_PID"  # a worker dies with this process
AGENT_PID_ENV = "TORCHX_ELASTIC_AGENT_PID"  # the worker's agent
SECRET_ENV = "TORCHX_ELASTIC_RDZV_SECRET"  # the job's rendezvous secret
SECRET_FILE_ENV = "TORCHX_ELASTIC_RDZV_SECRET_FILE"  # ... or a file holding it
RANK0_ENV = "TORCHX_RANK0_HOST"  # rank 0's host, as torchx's components name it
CHANNEL_ENV = "TORCHX_ELASTIC_CHANNEL"  # the agent's socket for progress() and heartbeat()
ROLE_RANK0_ENV = "TORCHX_ELASTIC_ROLE_RANK0_HOST"  # its own role's replica 0 (ft.ddp's groups)
ENV_FILE_ENV = "TORCHX_ELASTIC_ENV_FILE"  # a file of NAME=value lines to export (env_file.py)
# a file the agent appends what it prints to, stdout's and stderr's lines in the order it
# printed them (local_cwd's combined log: two files cannot say which line came first)
CONSOLE_COPY_ENV = "TORCHX_ELASTIC_CONSOLE_COPY"
CONSOLE_COPY_FILE = "console.log"  # its name in a local replica's log directory


def new_secret() -> str:
    """A fresh per-job secret (what the schedulers hand to the nodes in ``SECRET_ENV``)."""
    import secrets  # not on the workers' import path (torchx_elastic.worker)

    return secrets.token_hex(32)


# torch.distributed.elastic's (torchrun's), set by the agent or read by it
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
USE_AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
FILE_TIMER_ENV = "TORCHELASTIC_ENABLE_FILE_TIMER"
TIMER_FILE_ENV = "TORCHELASTIC_TIMER_FILE"
SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
# torch's opt-out of the rendezvous store that its rounds share with the workers (2.5+)
SHARE_STORE_OPT_OUT_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# --- the files of a node's log directory -------------------------------------------------
EVENTS_FILE = "events.jsonl"  # events.py
SUMMARY_PREFIX = "summary_node"  # summary_node<N>.json, the run on node N (events.py)
JOB_PROGRESS_FILE = "job_progress.json"  # the rank-0 node's (job_progress.py)
# <log_dir>/attempt_<k>/rank_<r>/: a rank's output and error file (rank_dir below); torchx's
# local schedulers name a replica's output files the same (<log_dir>/<role>/<replica>/)
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


def attempt_dir(log_dir: str, attempt: int | str) -> str:
    """``<log_dir>/attempt_<attempt>``: the ranks' directories of one attempt."""
    return os.path.join(log_dir, f"{ATTEMPT_DIR_PREFIX}{attempt}")


def rank_dir(log_dir: str, attempt: int | str, rank: int | str) -> str:
    """``<log_dir>/attempt_<attempt>/rank_<rank>``: the files of global rank ``rank``."""
    return os.path.join(attempt_dir(log_dir, attempt), f"{RANK_DIR_PREFIX}{rank}")


def ranks_of_attempt(log_dir: str, attempt: int) -> list[int]:
    """The global ranks that have a directory in ``attempt`` (this node's), sorted."""
    top = attempt_dir(log_dir, attempt)
    names = os.listdir(top) if os.path.isdir(top) else []
    return sorted(
        int(name[len(RANK_DIR_PREFIX) :])
        for name in names
        if name.startswith(RANK_DIR_PREFIX) and name[len(RANK_DIR_PREFIX) :].isdigit()
    )


def agents_log_dir(app_log_dir: str, role: str) -> str:
    """Where a local job's agents of ``role`` write their log directory."""
    return os.path.join(app_log_dir, AGENTS_LOG_SUBDIR, role)


# --- the agent's own line that the schedulers read back (``torchx status``) --------------
# ``torchx-elastic: waiting for nodes: 1 of 2 joined; ...``: its first round's wait
# (rendezvous/waiting.py), and the ``[job progress]`` line of that wait (job_progress.py)
WAITING_FOR_NODES = "waiting for nodes: "


# --- the store keys the agents of a job exchange ------------------------------------------
PROGRESS_KEY_PREFIX = "torchx_elastic/progress/node"  # + node: its NodeReport
PROGRESS_PUBLISHERS_KEY = "torchx_elastic/progress/publishers"  # nodes this round
FAILURE_KEY_PREFIX = "torchx_elastic/failure/attempt"  # + attempt: the first failure
LEFT_KEY = "torchx_elastic/left"  # in a round's store: its nodes done with it (closing.py)
WORKER_STORE_KEY = "torchx_elastic/worker_store/"  # + round: the workers' store
MASTER_KEY = "torchx_elastic/master_addr_port"  # "<addr> <port>" of rank 0
ROLL_CALL_KEY_PREFIX = "torchx_elastic/roll_call/"  # + index, "count": who came (roll_call.py)
# + round "/" rank "/count" and "/" claim: who took which --node-rank (static_ranks.py)
STATIC_RANK_KEY_PREFIX = "torchx_elastic/static_rank/"
# + run id, in a store at the job's original endpoint: "<host> <port>" where the survivors
# moved the rendezvous when its host was lost (rendezvous/failover.py)
MOVED_TO_KEY_PREFIX = "torchx_elastic/rendezvous_moved_to/"
