"""What ``torchx status`` says of ``ft.ddp``'s replica groups (local_cwd, docker, kubernetes):
the extension of ``role_status.py`` for ft.ddp's apps, :data:`FT_GROUPS`.

Each scheduler reads, its own way, the tail of the Lighthouse role's log (the app's first
role), where this module finds the last logged quorum
(:func:`torchx_elastic.ft.lighthouse.last_logged_quorum`), and each group's latest progress
(its rank-0 agent's ``[job progress]``); this module says, per group, whether it trains
(its replica id is in the last quorum) or recovers (it runs but is not: restarting, or
fetching the weights of a healthy group, or not yet joined), and the job's progress across
the groups: torchft gives a group that rejoins the step of the healthy ones, so the job is
where its furthest group is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from torchx.specs import AppState

from torchx_elastic.contract.job_progress import JobSummary
from torchx_elastic.ft.lighthouse import Quorum, last_logged_quorum
from torchx_elastic.ft.protocol import member_group, role_group
from torchx_elastic.schedulers.progress_status import (
    Progress,
    as_of,
    figures_text,
    pace_text,
    step_text,
)

LoggedQuorum = Tuple[Quorum, int]  # the last quorum and the app's number of groups


def activity(role: str, state: AppState, quorum: Optional[Quorum]) -> str:
    """``training (in quorum 5)`` or ``recovering (not in quorum 5)`` for a group that runs or
    waits for its replaced pods; nothing before the first quorum, for a role that is no
    group, or for a group that ended."""
    group = role_group(role)
    if group is None or quorum is None or state not in (AppState.RUNNING, AppState.PENDING):
        return ""
    if group in {member_group(member) for member in quorum.members}:
        return f"training (in quorum {quorum.quorum_id})"
    return f"recovering (not in quorum {quorum.quorum_id})"


def group_notes(
    states: Mapping[str, AppState],
    quorum: Optional[LoggedQuorum],
    progress: Mapping[str, Progress],
    now: Optional[datetime] = None,
) -> Dict[str, str]:
    """Per group role: what it does and its latest progress, e.g. ``training (in quorum 5),
    progress 120/200 (60.0%) of 2/2 ranks, 7.5 steps/s (as of 2s ago, its rank-0 agent)``."""
    notes: Dict[str, str] = {}
    for role, state in states.items():
        if role_group(role) is None:
            continue
        parts = [activity(role, state, None if quorum is None else quorum[0])]
        if role in progress:
            parts.append(figures_text(progress[role], now, "its rank-0 agent"))
        notes[role] = ", ".join(part for part in parts if part)
    return notes


def job_progress_line(
    progress: Mapping[str, Progress],
    quorum: Optional[LoggedQuorum],
    now: Optional[datetime] = None,
) -> Optional[str]:
    """``job progress 120/200 (60.0%), group0 the furthest of 2 groups: 4/4 ranks
    reporting, 7.5 steps/s, ETA 11s (as of 2s ago); 1 of 2 groups in quorum 5``: the
    furthest group of the last quorum (of all groups before the first quorum)."""
    groups = {role: found for role, found in progress.items() if role_group(role) is not None}
    if not groups:
        return None
    # a recovering group's last figures are those of its failed attempt: the job is where
    # the groups of the quorum are
    training = {
        role: found for role, found in groups.items() if role in _quorum_roles(groups, quorum)
    }
    furthest, (at, figures) = max((training or groups).items(), key=lambda item: item[1][1].step)
    text = f"job progress {step_text(figures)}"
    num_groups = quorum[1] if quorum is not None else len(groups)
    reporting = sum(f.ranks_reporting for _, f in (training or groups).values())
    ranks = sum(f.ranks for _, f in groups.values())
    text += f", {furthest} the furthest of {num_groups} groups: {reporting}/{ranks} ranks reporting"
    text += "".join(f", {part}" for part in pace_text(figures))
    text += as_of(at, now, "")
    if quorum is not None:
        text += f"; {len(quorum[0].members)} of {num_groups} groups in quorum {quorum[0].quorum_id}"
    return text


def status_lines(
    quorum: Optional[LoggedQuorum], progress: Mapping[str, Progress], now: Optional[datetime] = None
) -> List[str]:
    """The lines after the roles' in ``torchx status``: the last quorum and the job's progress."""
    lines = [] if quorum is None else [f"last {quorum[0].line(quorum[1])}"]
    job = job_progress_line(progress, quorum, now)
    return lines + ([] if job is None else [job])


def job_summary(
    summaries: Mapping[str, JobSummary], quorum: Optional[LoggedQuorum] = None
) -> Optional[JobSummary]:
    """The job across its replica groups, for the console's bar, as :func:`job_progress_line`
    counts it: the figures of the furthest group of the quorum, the ranks reporting of the
    quorum's groups, out of every group's ranks and nodes; None unless two groups reported."""
    groups = {role: s for role, s in summaries.items() if role_group(role) is not None}
    if len(groups) < 2:
        return None
    training = {role: s for role, s in groups.items() if role in _quorum_roles(groups, quorum)}
    counted = list((training or groups).values())
    return dataclasses.replace(
        max(counted, key=lambda s: s.step),
        ranks_reporting=sum(s.ranks_reporting for s in counted),
        ranks=sum(s.ranks for s in groups.values()),
        nodes_reporting=sum(s.nodes_reporting for s in counted),
        nodes=sum(s.nodes for s in groups.values()),
        quiet=tuple(q for s in counted for q in s.quiet),
    )


def _quorum_roles(roles: Mapping[str, object], quorum: Optional[LoggedQuorum]) -> set[str]:
    """Those of ``roles`` whose group is in ``quorum``."""
    members = set() if quorum is None else {member_group(m) for m in quorum[0].members}
    return {role for role in roles if role_group(role) in members}


def bar_label(role: str, quorum: Optional[LoggedQuorum]) -> str:
    """``group1 recovering``: a group's line in the console's bar (its role name while it
    does not run or before the first quorum)."""
    what = activity(role, AppState.RUNNING, None if quorum is None else quorum[0])
    return f"{role} {what.partition(' ')[0]}" if what else role


@dataclass(frozen=True)
class FtGroupStatus:
    """ft.ddp's replica groups as the Lighthouse's last logged quorum shows them (a
    ``role_status.RoleStatus``)."""

    quorum: Optional[LoggedQuorum]

    def notes(
        self,
        states: Mapping[str, AppState],
        progress: Mapping[str, Progress],
        now: Optional[datetime],
    ) -> Dict[str, str]:
        return group_notes(states, self.quorum, progress, now)

    def lines(self, progress: Mapping[str, Progress], now: Optional[datetime]) -> List[str]:
        return status_lines(self.quorum, progress, now)

    def job_summary(self, summaries: Mapping[str, JobSummary]) -> Optional[JobSummary]:
        return job_summary(summaries, self.quorum)

    def bar_label(self, role: str) -> Optional[str]:
        label = bar_label(role, self.quorum)
        return None if label == role else label


class FtGroups:
    """The extension (a ``role_status.RoleStatusExtension``): the Lighthouse's last quorum
    in the first role's log."""

    def read(self, first_role_log: Sequence[str]) -> FtGroupStatus:
        return FtGroupStatus(last_logged_quorum(list(first_role_log)))


FT_GROUPS = FtGroups()
