"""The state of an app of several roles whose replicas restart role by role (``ft.ddp``: a
Lighthouse and R replica groups), from each role's own state; kubernetes and docker.

The first role coordinates (``ft.ddp``'s Lighthouse exits 0 once every other role has
ended); the others run and fail on their own: one that failed never stops the rest.

- FAILED: the first role failed, or every other role did, or the first role ended and some
  other role failed;
- SUCCEEDED: every role succeeded;
- RUNNING while any role is past PENDING; else PENDING.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from torchx.specs import AppState, is_terminal


def several_roles_state(states: List[Tuple[str, AppState]]) -> Tuple[AppState, str]:
    """The app's state from its roles' (role name, state), the first role's first, and why."""
    (first_role, first), groups = states[0], states[1:]
    failed = [role for role, state in groups if state == AppState.FAILED]
    if first == AppState.FAILED:
        return AppState.FAILED, f"the {first_role} role failed"
    if groups and len(failed) == len(groups):
        return AppState.FAILED, f"every other role failed ({', '.join(failed)})"
    if first == AppState.SUCCEEDED:
        if failed:
            return AppState.FAILED, f"{', '.join(failed)} failed"
        if all(state == AppState.SUCCEEDED for _, state in groups):
            return AppState.SUCCEEDED, ""
    if any(state != AppState.PENDING for _, state in states):
        return AppState.RUNNING, ""
    return AppState.PENDING, ""


def role_line(
    role: str, state: AppState, restarts: int = 0, detail: str = "", note: str = ""
) -> str:
    """``group1: RUNNING, 1 restart(s) (detail); note``: one role of such an app in
    ``torchx status``."""
    return (
        f"{role}: {state.name}"
        + (f", {restarts} restart(s)" if restarts else "")
        + (f" ({detail})" if detail else "")
        + (f"; {note}" if note else "")
    )


def replicas_state(states: Sequence[AppState]) -> AppState:
    """A role's state from its replicas' (local_cwd): RUNNING while one runs, SUCCEEDED when
    every one did, FAILED when one failed and none runs."""
    if AppState.RUNNING in states:
        return AppState.RUNNING
    if states and all(state == AppState.SUCCEEDED for state in states):
        return AppState.SUCCEEDED
    if AppState.FAILED in states and all(is_terminal(state) for state in states):
        return AppState.FAILED
    return states[0] if states else AppState.UNKNOWN


def with_lost_replicas(returncodes: Sequence[Optional[int]]) -> Optional[AppState]:
    """SUCCEEDED for a role whose replicas (local_cwd: their agents' exit codes) all ended,
    none with an exit code of its own (> 0), at least one with 0, and the others killed by a
    signal: those nodes were lost (a spare, or the job's other nodes, went on without them,
    and the agents that stayed decided the job); None where this does not apply."""
    if not returncodes or any(code is None or code > 0 for code in returncodes):
        return None
    if 0 in returncodes and any(code < 0 for code in returncodes if code is not None):
        return AppState.SUCCEEDED
    return None
