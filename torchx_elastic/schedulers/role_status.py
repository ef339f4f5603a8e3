"""What ``torchx status`` and local_cwd's live bar say of an app of several roles, on every
scheduler; the one place where a kind of app adds its own (``ft.ddp``'s replica groups).

A scheduler reads, its own way, each role's state (and restarts, details), each role's
latest progress, and the tail of the app's first role's replica-0 log, then calls
:func:`read` on that tail and :meth:`AppRoleStatus.roles_lines` once. Each extension
(:class:`RoleStatusExtension`, listed in :data:`EXTENSIONS`) reads what it needs from the
tail and says, per role, a note for its line, the lines after the roles', and for the bar
the job's summary and each role's label. ``ft_groups.py`` is ft.ddp's, the only module of
the schedulers that imports ``torchx_elastic.ft``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from torchx.specs import AppState

from torchx_elastic.contract.job_progress import JobSummary
from torchx_elastic.schedulers.ft_groups import FT_GROUPS
from torchx_elastic.schedulers.progress_status import Progress
from torchx_elastic.schedulers.role_states import role_line


class RoleStatus(Protocol):
    """What one extension read from an app's first role's log, and what it says of the app."""

    def notes(
        self,
        states: Mapping[str, AppState],
        progress: Mapping[str, Progress],
        now: Optional[datetime],
    ) -> Dict[str, str]:
        """Per role it knows: what to add to the role's line."""
        ...

    def lines(self, progress: Mapping[str, Progress], now: Optional[datetime]) -> List[str]:
        """The lines after the roles' (e.g. the last quorum, the job's progress)."""
        ...

    def job_summary(self, summaries: Mapping[str, JobSummary]) -> Optional[JobSummary]:
        """The job's bar from the roles' summaries (None: it has none to draw)."""
        ...

    def bar_label(self, role: str) -> Optional[str]:
        """A role's label on its bar (None: its name)."""
        ...


class RoleStatusExtension(Protocol):
    def read(self, first_role_log: Sequence[str]) -> RoleStatus:
        """What this extension finds in the tail of the first role's replica-0 log."""
        ...


EXTENSIONS: Tuple[RoleStatusExtension, ...] = (FT_GROUPS,)


@dataclass(frozen=True)
class AppRoleStatus:
    """What every extension read, and the status of the app that it makes."""

    found: Tuple[RoleStatus, ...]

    def roles_lines(
        self,
        states: Mapping[str, AppState],
        progress: Mapping[str, Progress],
        restarts: Optional[Mapping[str, int]] = None,
        details: Optional[Mapping[str, str]] = None,
        now: Optional[datetime] = None,
    ) -> List[str]:
        """``torchx status`` of the app: one line per role (its state, restarts, the
        scheduler's ``details`` and the extensions' notes), then the extensions' lines."""
        notes: Dict[str, List[str]] = {}
        for status in self.found:
            for role, note in status.notes(states, progress, now).items():
                notes.setdefault(role, []).append(note)
        lines = [
            role_line(
                role,
                state,
                (restarts or {}).get(role, 0),
                (details or {}).get(role, ""),
                ", ".join(note for note in notes.get(role, []) if note),
            )
            for role, state in states.items()
        ]
        return lines + [line for status in self.found for line in status.lines(progress, now)]

    def job_summary(self, summaries: Mapping[str, JobSummary]) -> Optional[JobSummary]:
        """The job's bar above the roles' (the first extension's that has one)."""
        found = (status.job_summary(summaries) for status in self.found)
        return next((summary for summary in found if summary is not None), None)

    def bar_label(self, role: str) -> str:
        """A role's label on its bar: the first extension's, or its name."""
        found = (status.bar_label(role) for status in self.found)
        return next((label for label in found if label is not None), role)


def read(first_role_log: Optional[Sequence[str]]) -> AppRoleStatus:
    """What the extensions find in the tail of the app's first role's replica-0 log (None:
    it has no log yet)."""
    lines = first_role_log or []
    return AppRoleStatus(tuple(extension.read(lines) for extension in EXTENSIONS))
