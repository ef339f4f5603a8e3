"""The agents' event records: the one place that names them, for the writer and the readers.

Every agent appends one JSON object per line to ``<log_dir>/events.jsonl``
(``agent/console/events.py`` writes them); ``torchx-elastic timeline`` reads them back
(``timeline/``). Every record has ``time`` (ISO 8601, UTC), ``time_s`` (seconds since the
epoch), ``event``, ``host``, ``agent_pid`` and ``node`` (null before the first rendezvous),
plus the fields of its kind below. Readers take what they know and skip the rest: records
and fields are only ever added.

Standard library only: the agent imports it.
"""

from __future__ import annotations

from typing import Final

EVENTS_FILE: Final = "events.jsonl"
SUMMARY_PREFIX: Final = "summary_node"  # summary_node<N>.json, the run on node N

# a rendezvous round completed: attempt, round (this node's count of completed rounds),
# group_world_size, ranks (this node's), master
RENDEZVOUS: Final = "rendezvous"
# the workers of an attempt started: attempt, pids (global rank -> pid)
START: Final = "start"
# the watchdog found ranks stalled (before their failure): attempt, ranks, message
HANG: Final = "hang"
# workers failed: attempt, failures (global rank -> local_rank, pid, exitcode)
FAILURE: Final = "failure"
# the worker group restarts: attempt (the one that starts: +1 after a failure, the same after a
# membership change), reason ("failure" or "membership change"), next_round; after a failure
# also the facts of the restart line: failed_rank, failed_node, failure, max_restarts,
# restarts_left
RESTART: Final = "restart"
# the job's progress as the rank-0 node sums it up when it changed, at most every
# PROGRESS_INTERVAL_S, and at the end of an attempt: step, total, slowest/fastest rank and
# node, fastest_step, rate_per_s, ranks_reporting, ranks
PROGRESS: Final = "progress"
# the agent is done: exit_code, state, attempt, root_cause_rank, summary (its path), and the
# job's first failure as every node names it: job_root_cause_rank, job_root_cause_node
EXIT: Final = "exit"

PROGRESS_INTERVAL_S: Final = 2.0
PROGRESS_FIELDS: Final = (
    "step",
    "total",
    "slowest_rank",
    "slowest_node",
    "fastest_rank",
    "fastest_node",
    "fastest_step",
    "rate_per_s",
    "ranks_reporting",
    "ranks",
)
