"""Hang watchdog: a rank that sends no progress or heartbeat for ``hang_timeout_s``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from torchx_elastic.agent.console.progress.channel import RankActivity

HANG_MESSAGE_PREFIX = "hang:"


class HangWatchdog:
    """Finds stalled ranks of the current attempt.

    A rank's clock starts when its attempt starts and is reset by every ``progress()`` or
    ``heartbeat()`` it sends (``torchx_elastic.worker``); a rank that never reports counts as
    silent from the start, so the watchdog is for scripts that report. A rank whose script
    is done (the worker API says so at exit) is not watched while its process winds down.
    """

    def __init__(
        self, activity: RankActivity, timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout_s = timeout_s
        self._activity = activity
        self._clock = clock
        self._attempt_started_s = clock()

    def attempt_started(self, attempt: int) -> None:
        self._activity.new_attempt(attempt)
        self._attempt_started_s = self._clock()

    def stalled(self, local_ranks: Iterable[int]) -> list[int]:
        now_s = self._clock()
        return [
            local_rank
            for local_rank in local_ranks
            if not self._activity.is_finished(local_rank)
            and now_s - (self._activity.last_seen_s(local_rank) or self._attempt_started_s)
            > self.timeout_s
        ]

    def hang_message(self, rank: int) -> str:
        return (
            f"{HANG_MESSAGE_PREFIX} rank {rank} sent no progress or heartbeat for"
            f" {self.timeout_s:g}s (--hang-timeout-s); every rank's Python stack was dumped"
            " to its stderr log"
        )
