"""Recovery latency from the records ``bench/crash_once.py`` writes.

Latency: from the crash record of attempt 0 to the moment the *last* rank of the world
entered its training loop again on a later attempt (the first later attempt in which every
rank got back). A run recovered when that attempt exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    event: str
    attempt: int
    rank: int
    time_s: float


def parse_records(text: str) -> list[Record]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if len(fields) != 4 or fields[0] not in ("loop", "crash"):
            raise ValueError(f"record {number} is not '<loop|crash> ATTEMPT RANK TIME': {line!r}")
        records.append(Record(fields[0], int(fields[1]), int(fields[2]), float(fields[3])))
    return records


@dataclass(frozen=True)
class Recovery:
    latency_s: float  # crash to the last rank back in its training loop
    attempt: int  # the attempt in which every rank got back (1: the first restart)


def recovery_latency_s(records: list[Record], world_size: int) -> float | None:
    """Crash to all ``world_size`` ranks back in the loop, or None if they never all were."""
    found = recovery(records, world_size)
    return None if found is None else found.latency_s


def recovery(records: list[Record], world_size: int) -> Recovery | None:
    crashes = [r.time_s for r in records if r.event == "crash"]
    if not crashes:
        return None
    crash_s = min(crashes)
    back: dict[int, dict[int, float]] = {}
    for r in records:
        if r.event == "loop" and r.attempt > 0 and r.time_s >= crash_s:
            ranks = back.setdefault(r.attempt, {})
            ranks[r.rank] = min(r.time_s, ranks.get(r.rank, r.time_s))
    for attempt in sorted(back):
        if len(back[attempt]) == world_size:
            return Recovery(max(back[attempt].values()) - crash_s, attempt)
    return None


def read_recovery(path: Path, world_size: int) -> Recovery | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return recovery(parse_records(text), world_size)
