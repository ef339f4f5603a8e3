"""``torchx log``'s question to a scheduler (``log_iter``), read once for every scheduler here
as one replica and a :class:`LogQuery`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Optional

from torchx.schedulers.api import Stream


@dataclass(frozen=True)
class LogQuery:
    """Which lines of a replica's log: matching ``regex``, between ``since`` and ``until``,
    of ``streams`` (None: as the scheduler keeps them), ``follow``: until the replica ends."""

    regex: Optional[str] = None
    since: Optional[datetime] = None
    until: Optional[datetime] = None
    follow: bool = False
    streams: Optional[Stream] = None


class ReplicaLogs:
    """torchx's ``log_iter`` for a scheduler that implements :meth:`replica_log`; listed
    before torchx's ``Scheduler`` in the scheduler's bases."""

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
        query = LogQuery(regex=regex, since=since, until=until, follow=should_tail, streams=streams)
        return self.replica_log(app_id, role_name, k, query)

    def replica_log(self, app_id: str, role_name: str, k: int, query: LogQuery) -> Iterable[str]:
        """Replica ``k`` of ``role_name``'s log lines, each ending in ``\\n``."""
        raise NotImplementedError
