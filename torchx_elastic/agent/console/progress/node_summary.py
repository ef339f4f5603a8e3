"""One progress summary for a node's ranks: slowest and fastest rank, rate, ETA.

Pure functions over :class:`~torchx_elastic.agent.console.progress.channel.RankProgress`
snapshots; the console draws the result as a live bar on a terminal or prints :func:`status_line`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torchx_elastic.agent.console.progress.channel import RankProgress
from torchx_elastic.contract.job_progress import pace_parts


@dataclass(frozen=True)
class JobProgress:
    """Where the ranks of one node are (ranks are global ranks)."""

    slowest_rank: int
    slowest_step: int
    fastest_rank: int
    fastest_step: int
    total: int | None
    rate_per_s: float | None
    eta_s: float | None
    ranks_reporting: int

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.slowest_step / self.total)


def summarize(
    snapshot: Mapping[int, RankProgress], global_ranks: Mapping[int, int]
) -> JobProgress | None:
    """Summarize the ranks that reported a step; None before any did."""
    stepping = [p for p in snapshot.values() if p.step is not None]
    if not stepping:
        return None

    def key(p: RankProgress) -> tuple[int, int]:
        return (p.step or 0, global_ranks.get(p.local_rank, p.local_rank))

    slowest, fastest = min(stepping, key=key), max(stepping, key=key)
    totals = [p.total for p in stepping if p.total is not None]
    total = max(totals) if totals else None
    rates = [p.rate_per_s for p in stepping if p.rate_per_s is not None]
    # the job moves at the pace of its slowest rank
    rate = slowest.rate_per_s if slowest.rate_per_s is not None else (min(rates) if rates else None)
    eta_s = None
    if total is not None and rate is not None and rate > 0:
        eta_s = max(0.0, (total - (slowest.step or 0)) / rate)
    return JobProgress(
        slowest_rank=global_ranks.get(slowest.local_rank, slowest.local_rank),
        slowest_step=slowest.step or 0,
        fastest_rank=global_ranks.get(fastest.local_rank, fastest.local_rank),
        fastest_step=fastest.step or 0,
        total=total,
        rate_per_s=rate,
        eta_s=eta_s,
        ranks_reporting=len(stepping),
    )


def details(progress: JobProgress) -> str:
    """``slowest r3 120, fastest r0 130, 4.1 steps/s, ETA 3m05s`` (the part after the bar)."""
    parts = [
        f"slowest r{progress.slowest_rank} {progress.slowest_step}",
        f"fastest r{progress.fastest_rank} {progress.fastest_step}",
    ]
    return ", ".join(parts + pace_parts(progress.rate_per_s, progress.eta_s))


def status_line(progress: JobProgress, node: int) -> str:
    """One plain line for consoles that are not terminals (CI, ``kubectl logs``)."""
    total = "?" if progress.total is None else str(progress.total)
    fraction = progress.fraction
    percent = "" if fraction is None else f" ({100 * fraction:.1f}%)"
    return (
        f"[n{node} progress] {progress.slowest_step}/{total}{percent}"
        f" of {progress.ranks_reporting} ranks, {details(progress)}"
    )
