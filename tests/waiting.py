"""Waiting for an event: poll a condition until it holds, or fail naming what was awaited.

A test never decides on wall-clock time. A fixed sleep that hopes something happened meanwhile,
or an upper bound on how long something took, fails on a busy two-core machine; a test waits
for the event itself, under a deadline that only bounds a hang (generous: a slow machine takes
longer, never fails), and checks the order of events where the order is what it means. What
measures speed belongs in ``bench/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# a bound on a hang, not a speed: what a test awaits takes seconds, on a busy machine a minute
DEADLINE_S = 120.0
POLL_S = 0.05


def wait_until(
    condition: Callable[[], T],
    *,
    what: str,
    timeout_s: float = DEADLINE_S,
    every_s: float = POLL_S,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call ``condition`` every ``every_s`` until it returns a true value, and return that
    value; after ``timeout_s`` raise AssertionError naming ``what`` was awaited (and
    ``detail()``, e.g. a log, when given)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = f"{what}: not within {timeout_s:g} s"
            raise AssertionError(said if detail is None else f"{said}\n{detail()}")
        time.sleep(every_s)
