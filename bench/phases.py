"""Where a launch's time goes, from the records ``bench/ddp_script.py`` writes.

- ``to_first_worker_s``: from starting the launcher to the first worker process existing
  (the ``torchx`` CLI's own start, the agent's start, the rendezvous);
- ``to_scripts_s``: to the last rank's script running its first line (a spawned worker's
  interpreter start; a forked one is there at once);
- ``to_training_s``: from starting the launcher to the *last* rank entering its training
  loop (interpreters, imports, rendezvous, process group, DDP);
- ``exit_tail_s``: from the last rank being done to the launcher's exit (polling, exit
  barrier, shutdown; for ours through torchx also ``torchx run`` noticing the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EVENTS = ("proc", "script", "start", "done")


@dataclass(frozen=True)
class Phases:
    to_training_s: float
    exit_tail_s: float
    to_first_worker_s: float | None = None  # None: the script did not record these
    to_scripts_s: float | None = None


def worker_pids(text: str) -> set[int]:
    """The pids of the workers that recorded anything."""
    return {int(fields[3]) for fields in _records(text)}


def _records(text: str) -> list[list[str]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if len(fields) != 4 or fields[0] not in EVENTS:
            raise ValueError(
                f"record {number} is not '<{'|'.join(EVENTS)}> RANK TIME PID': {line!r}"
            )
        records.append(fields)
    return records


def parse_phases(
    text: str, world_size: int, started_unix_s: float, ended_unix_s: float
) -> Phases | None:
    """None unless every one of ``world_size`` ranks recorded both its start and its end."""
    times: dict[str, dict[int, float]] = {event: {} for event in EVENTS}
    for fields in _records(text):
        times[fields[0]][int(fields[1])] = float(fields[2])
    starts, dones = times["start"], times["done"]
    if len(starts) != world_size or len(dones) != world_size:
        return None
    procs, scripts = times["proc"], times["script"]
    return Phases(
        to_training_s=max(starts.values()) - started_unix_s,
        exit_tail_s=ended_unix_s - max(dones.values()),
        to_first_worker_s=min(procs.values()) - started_unix_s if procs else None,
        to_scripts_s=max(scripts.values()) - started_unix_s if len(scripts) == world_size else None,
    )


def read_phases(
    path: Path, world_size: int, started_unix_s: float, ended_unix_s: float
) -> Phases | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return parse_phases(text, world_size, started_unix_s, ended_unix_s)
