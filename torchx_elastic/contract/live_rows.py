"""A node's unfinished ``\\r``-rewritten lines, for a launcher that draws them (local_cwd).

A rank that redraws one line with carriage returns (tqdm, Rich, Lightning's bars) writes no
newline until the bar ends. On a terminal the agent shows that line live, one row per rank
(``agent/console/output/display.py``); through ``torchx run -s local_cwd`` its output goes to
a file that torchx follows line by line, so the bar would show once, at its end. When
local_cwd draws on a terminal it names a file per replica in :data:`LIVE_ROWS_ENV`; the
agent keeps there, a few times a second, each rank's current unfinished line with the rank's
prefix (:func:`write_rows`), and local_cwd draws them above its job bar (:func:`read_rows`).
The logs themselves are untouched: whole lines, as without a terminal.

Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

# local_cwd's name for it, in each replica's log directory
from torchx_elastic.contract.log_layout import LIVE_ROWS_FILE as LIVE_ROWS_FILE

# the file (a JSON list of rows) the agent keeps its ranks' unfinished lines in
LIVE_ROWS_ENV = "TORCHX_ELASTIC_LIVE_ROWS_FILE"


@dataclass(frozen=True)
class LiveRow:
    """A rank's unfinished line as a terminal shows it: its prefix and the visible text."""

    rank: int
    prefix: str
    text: str


def write_rows(path: str, rows: list[LiveRow]) -> None:
    """Replace ``path`` with ``rows`` at once (a reader never sees half a file)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump([[row.rank, row.prefix, row.text] for row in rows], file)
    os.replace(temporary, path)


def read_rows(path: str) -> list[LiveRow]:
    """The rows in ``path``; none when it does not exist (yet, or any more) or is not ours."""
    try:
        with open(path, encoding="utf-8") as file:
            items = json.load(file)
        return [LiveRow(int(rank), str(prefix), str(text)) for rank, prefix, text in items]
    except (OSError, ValueError, TypeError):
        return []
