"""Did every line of ``bench/log_heavy.py`` arrive, whole and in order, in the per-rank logs?

The launchers lay their log directories out differently (ours: ``attempt_0/rank_<r>/``,
torchrun: ``<run id>/attempt_0/<local rank>/``), so every ``stdout.log`` under the log
directory is read and lines are attributed to ranks by their own ``rank=<R>`` field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from torchx_elastic.contract import STDOUT_FILE

LINE = re.compile(rb"bench-line rank=(\d+) i=(\d+) x{48}")


@dataclass
class RankLines:
    received: int = 0
    in_order: int = 0  # lines whose index was the one expected next
    next_index: int = 0


@dataclass
class LogCheck:
    expected_per_rank: int
    ranks: dict[int, RankLines] = field(default_factory=dict)
    malformed: int = 0  # lines that start like ours but are torn or mixed

    def feed(self, data: bytes) -> None:
        for line in data.splitlines():
            if b"bench-line" not in line:
                continue
            match = LINE.fullmatch(line)
            if match is None:
                self.malformed += 1
                continue
            rank, index = int(match[1]), int(match[2])
            lines = self.ranks.setdefault(rank, RankLines())
            lines.received += 1
            if index == lines.next_index:
                lines.in_order += 1
            lines.next_index = index + 1

    def complete(self, world_size: int) -> bool:
        return (
            self.malformed == 0
            and sorted(self.ranks) == list(range(world_size))
            and all(r.received == r.in_order == self.expected_per_rank for r in self.ranks.values())
        )

    def summary(self, world_size: int) -> str:
        received = sum(r.received for r in self.ranks.values())
        return f"{received}/{world_size * self.expected_per_rank} lines, {self.malformed} malformed"


def check_log_dir(log_dir: Path, expected_per_rank: int) -> LogCheck:
    check = LogCheck(expected_per_rank)
    for path in sorted(log_dir.rglob(STDOUT_FILE)):
        check.feed(path.read_bytes())
    return check


CONSOLE_LINE = re.compile(rb"bench-line rank=\d+ i=\d+ x{48}")


@dataclass(frozen=True)
class ConsoleCount:
    lines: int  # occurrences of a job's line, whole or not
    whole: int  # console lines holding exactly one whole job line after the prefix


def count_console_lines(path: Path) -> ConsoleCount:
    """The log-heavy job's lines on the console capture (each behind a launcher's prefix)."""
    lines = whole = 0
    with open(path, "rb") as file:
        for line in file:
            found = line.count(b"bench-line rank=")
            lines += found
            if found == 1:
                match = CONSOLE_LINE.search(line)
                whole += match is not None and match.end() == len(line.rstrip(b"\n"))
    return ConsoleCount(lines, whole)
