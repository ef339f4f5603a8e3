"""The job's progress drawn as one ``rich`` bar: the agent's live console and ``local_cwd``'s
terminal bar draw the same one (``rich`` is imported when a bar is drawn)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchx_elastic.contract.job_progress import JobSummary

if TYPE_CHECKING:
    from rich.console import RenderableType


def rich_bar(summary: JobSummary, label: str = "job") -> RenderableType:
    """``job ━━━━━━━━ 120/200 of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120, ...``"""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        Text(label, style="bold"),
        ProgressBar(total=summary.total, completed=summary.step, width=30),
        Text(f"{summary.step}/{summary.total or '?'}"),
        Text(f"{summary.counts()}, {summary.details()}", style="dim"),
    )
    return grid
