"""The files of a node's run: its event records (``events.jsonl``) and its summary.

Every agent appends one JSON object per line to ``<log_dir>/events.jsonl``
(:class:`EventLog`); ``torchx-elastic timeline`` reads them back (:func:`read_events`).
Every record has ``time`` (ISO 8601, UTC), ``time_s`` (seconds since the epoch), ``event``,
``host``, ``agent_pid`` and ``node`` (null before the first rendezvous), plus the fields of
its kind below. Readers take what they know and skip the rest: records
and fields are only ever added.

At the end of its run every agent writes the run's summary on its node (the root cause,
the other causes, the victims: ``agent/console/failure/report.py``'s :func:`summary`) to
``<log_dir>/summary_node<N>.json`` (:func:`write_summary`); :func:`read_summary` reads it back.

Several agents may share a log directory: each event line is written with a single
``O_APPEND`` write. Standard library only: the agent imports it.
"""

from __future__ import annotations

import datetime
import glob
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from torchx_elastic.contract.log_layout import NodeLogs

log = logging.getLogger(__name__)

# a rendezvous round completed: attempt, round (this node's count of completed rounds),
# group_world_size, ranks (this node's), master
RENDEZVOUS: Final = "rendezvous"
# a re-formed round took nodes in place of lost ones (said by the first node of the round that
# was also in the previous one): round, replaced (a list of {lost, by, back}: the names
# "addr (agent pid N)", back: the new node has the lost one's address, its agent came back)
REPLACED: Final = "replaced"
# the node's --health-check ran before a round it would join: round, exit_code (None: killed
# after its timeout), passed, output (the file of its stdout and stderr), seconds
HEALTH_CHECK: Final = "health_check"
# the workers of an attempt started: attempt, pids (global rank -> pid)
START: Final = "start"
# the watchdog found ranks stalled (before their failure): attempt, ranks, message
HANG: Final = "hang"
# workers failed: attempt, failures (global rank -> local_rank, pid, exitcode)
FAILURE: Final = "failure"
# the worker group restarts: attempt (the one that starts: +1 after a failure, the same after a
# membership change), reason ("failure", "membership change", "peer lost": members of the
# running round stopped answering, named in lost, "dropped": the other nodes dropped this
# one for a late heartbeat and went on, so it joins again, or "rendezvous host lost": the
# rendezvous moved to a survivor, how the loss showed in lost), next_round; after a failure
# also the facts of the restart line: failed_rank, failed_node, failure, max_restarts,
# restarts_left
RESTART: Final = "restart"
RESTART_AFTER_FAILURE: Final = "failure"  # a restart's reason
RESTART_MEMBERSHIP_CHANGE: Final = "membership change"
RESTART_PEER_LOST: Final = "peer lost"
RESTART_DROPPED: Final = "dropped"  # the other nodes dropped this one: it joins again
RESTART_HOST_LOST: Final = "rendezvous host lost"  # the rendezvous moved to a survivor
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


class EventLog:
    """Appends timestamped events; a failure to write is logged once, never raised."""

    def __init__(self, path: str | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.node: int | None = None
        self._clock = clock
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def in_dir(cls, log_dir: str) -> EventLog:
        return cls(NodeLogs(log_dir).events)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        now_s = self._clock()
        record = {
            "time": datetime.datetime.fromtimestamp(now_s, datetime.timezone.utc).isoformat(),
            "time_s": round(now_s, 6),
            "event": event,
            "host": self._host,
            "agent_pid": os.getpid(),
            "node": self.node,
            **fields,
        }
        if self.path is None:
            return record
        line = (json.dumps(record, default=str) + "\n").encode()
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as err:
                if not self._warned:
                    self._warned = True
                    log.warning("cannot write the event log %s: %s", self.path, err)
        return record


def read_events(path: str) -> list[dict[str, Any]]:
    """The records of an ``events.jsonl``; a line that is not a JSON object is skipped (a
    line being written while this reads, or a record of a newer agent)."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def summary_path(log_dir: str, node: int) -> str:
    return NodeLogs(log_dir).summary(node)


def write_summary(path: str, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (readers never see half a file)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as file:
        json.dump(data, file, indent=2)
        file.write("\n")
    os.replace(tmp, path)


def read_summary(log_dir: str) -> dict[str, Any]:
    """The run's summary in ``log_dir`` (the newest, should it hold several nodes'); empty
    when there is none."""
    paths = sorted(glob.glob(NodeLogs(log_dir).summaries), key=os.path.getmtime)
    if not paths:
        return {}
    with open(paths[-1]) as file:
        data: dict[str, Any] = json.load(file)
    return data


def restarted_or_failed(log_dir: str) -> bool:
    """Whether the agents of ``log_dir`` restarted their workers or failed, from their
    events (cheap: no torch); local_cwd then names the command that draws the timeline."""
    try:
        records = read_events(NodeLogs(log_dir).events)
    except OSError:
        return False
    return any(
        r.get("event") in (RESTART, FAILURE, HANG)
        or (r.get("event") == EXIT and r.get("exit_code") not in (0, None))
        for r in records
    )
