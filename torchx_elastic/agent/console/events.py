"""The agent's event log: one JSON object per line in ``<log_dir>/events.jsonl``.

Events: ``rendezvous`` (with the node's ``round``), ``start``, ``hang``, ``failure``,
``restart`` (after a failure: ``failed_rank``, ``failed_node``, ``failure``, ``max_restarts``,
``restarts_left``, ``next_round``), ``progress``, ``exit`` (named, with their fields, in
:mod:`torchx_elastic.event_records`); each has ``time``
(ISO 8601, UTC), ``time_s`` (seconds since the epoch), ``event``, ``host``, ``agent_pid``
and ``node`` (null before the first rendezvous), plus its own fields. Several agents may
share a log directory: each line is written with a single ``O_APPEND`` write.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from torchx_elastic.event_records import EVENTS_FILE

log = logging.getLogger(__name__)

__all__ = ["EVENTS_FILE", "EventLog"]


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
        return cls(os.path.join(log_dir, EVENTS_FILE))

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
