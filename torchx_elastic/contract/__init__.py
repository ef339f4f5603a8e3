"""The contract between the agent, the schedulers and the workers: the one place that names it.

The agent (``torchx_elastic.agent``), the schedulers (``torchx_elastic.schedulers``, ``torchx
status``), the timeline and the tests import it; nothing else spells these names.

- the environment variables the agent, the workers and the schedulers set and read (below);
- the files a node writes in its log directory, where each is (:mod:`.log_layout`:
  ``NodeLogs``, and ``LocalAppLogs`` for a local job's; their names are re-exported here),
  with a writer and a reader each:
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

from torchx_elastic.contract.log_layout import AGENTS_LOG_SUBDIR as AGENTS_LOG_SUBDIR
from torchx_elastic.contract.log_layout import ATTEMPT_DIR_PREFIX as ATTEMPT_DIR_PREFIX
from torchx_elastic.contract.log_layout import CONSOLE_COPY_FILE as CONSOLE_COPY_FILE
from torchx_elastic.contract.log_layout import EVENTS_FILE as EVENTS_FILE
from torchx_elastic.contract.log_layout import FILTERED_FILE as FILTERED_FILE
from torchx_elastic.contract.log_layout import JOB_PROGRESS_FILE as JOB_PROGRESS_FILE
from torchx_elastic.contract.log_layout import RANK_DIR_PREFIX as RANK_DIR_PREFIX
from torchx_elastic.contract.log_layout import RANK_ERROR_FILE as RANK_ERROR_FILE
from torchx_elastic.contract.log_layout import STDERR_FILE as STDERR_FILE
from torchx_elastic.contract.log_layout import STDOUT_FILE as STDOUT_FILE
from torchx_elastic.contract.log_layout import SUMMARY_PREFIX as SUMMARY_PREFIX
from torchx_elastic.contract.log_layout import WAITING_FILE_PREFIX as WAITING_FILE_PREFIX

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
# printed them (local_cwd's combined log: two files cannot say which line came first);
# CONSOLE_COPY_FILE (below) is its name in a local replica's log directory
CONSOLE_COPY_ENV = "TORCHX_ELASTIC_CONSOLE_COPY"


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
# + torch's node id: "<addr>:<port>" where the node's agent listens while it runs, or "left"
# once it was stopped by a signal (rendezvous/presence.py)
PRESENCE_KEY_PREFIX = "torchx_elastic/presence/"
MASTER_KEY = "torchx_elastic/master_addr_port"  # "<addr> <port>" of rank 0
ROLL_CALL_KEY_PREFIX = "torchx_elastic/roll_call/"  # + index, "count": who came (roll_call.py)
# + round "/" rank "/count" and "/" claim: who took which --node-rank (static_ranks.py)
STATIC_RANK_KEY_PREFIX = "torchx_elastic/static_rank/"
# + run id, in a store at the job's original endpoint: "<host> <port>" where the survivors
# moved the rendezvous when its host was lost (rendezvous/failover.py)
MOVED_TO_KEY_PREFIX = "torchx_elastic/rendezvous_moved_to/"
# + run id "/beat/" + torch's node id: the node's heartbeat, a counter; + run id "/dead/" + node
# id: "dead" once its watchers dropped it; + run id "/suspects": how many nodes are silent
# now (rendezvous/keyed_liveness.py, the default ``--rdzv-conf liveness=keys``)
LIVENESS_KEY_PREFIX = "torchx_elastic/liveness/"
