"""From Docker container states to torchx app, role and replica states, with the root cause.

Pure functions over ``ContainerSnapshot`` (what ``docker inspect`` says about one replica),
so every mapping is tested without an engine.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torchx.specs import AppState, ReplicaStatus, Role, RoleStatus, is_terminal

from torchx_elastic.contract import job_failure_line
from torchx_elastic.contract.error_file import error_data
from torchx_elastic.schedulers.docker.request import (
    LABEL_APP_ID,
    LABEL_MIN_REPLICAS,
    LABEL_NUM_REPLICAS,
    LABEL_REPLICA_ID,
    LABEL_ROLE_INDEX,
    LABEL_ROLE_NAME,
)
from torchx_elastic.schedulers.role_states import several_roles_state

NOT_SET = "<NONE>"  # torchx's "no message" marker

_RUNNING_STATES: Dict[str, AppState] = {
    "created": AppState.SUBMITTED,
    "running": AppState.RUNNING,
    "restarting": AppState.PENDING,  # the engine restarts it (restart policy)
    "paused": AppState.PENDING,
    "removing": AppState.CANCELLED,
    "dead": AppState.FAILED,
}


@dataclass(frozen=True)
class ContainerSnapshot:
    """The parts of ``docker inspect`` that decide a replica's state."""

    name: str
    image: str
    labels: Dict[str, str]
    status: str  # created, running, restarting, paused, removing, exited, dead
    exit_code: int
    oom_killed: bool
    error: str  # the engine's own error, e.g. the entrypoint could not be executed
    finished_at: str  # RFC 3339; "0001-01-01T00:00:00Z" when it never finished
    restart_count: int
    log_tail: str = ""  # last lines of its log, read only for failed replicas

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], log_tail: str = "") -> ContainerSnapshot:
        state = attrs.get("State", {})
        config = attrs.get("Config", {})
        return cls(
            name=str(attrs.get("Name", "")).lstrip("/"),
            image=str(config.get("Image", "")),
            labels=dict(config.get("Labels") or {}),
            status=str(state.get("Status", "dead")),
            exit_code=int(state.get("ExitCode", 0)),
            oom_killed=bool(state.get("OOMKilled", False)),
            error=str(state.get("Error", "")),
            finished_at=str(state.get("FinishedAt", "")),
            restart_count=int(attrs.get("RestartCount", 0)),
            log_tail=log_tail,
        )

    @property
    def app_id(self) -> str:
        return self.labels[LABEL_APP_ID]

    @property
    def role(self) -> str:
        return self.labels[LABEL_ROLE_NAME]

    @property
    def replica_id(self) -> int:
        return int(self.labels[LABEL_REPLICA_ID])

    @property
    def state(self) -> AppState:
        if self.status == "exited":
            return AppState.SUCCEEDED if self.exit_code == 0 else AppState.FAILED
        if self.status == "created" and self.error:
            return AppState.FAILED
        return _RUNNING_STATES.get(self.status, AppState.UNKNOWN)

    @property
    def finished_timestamp_s(self) -> float:
        try:
            # Docker writes nanoseconds; datetime takes microseconds
            text = self.finished_at.rstrip("Z")
            whole, _, fraction = text.partition(".")
            return datetime.fromisoformat(f"{whole}.{fraction[:6] or '0'}+00:00").timestamp()
        except ValueError:
            return 0.0

    def failure_reason(self) -> str:
        """Why this replica failed, in words."""
        if self.error:
            return f"the engine could not run it: {self.error}"
        reason = f"exit code {self.exit_code}"
        if self.oom_killed:
            return reason + " (killed by the kernel's OOM killer: raise memMB)"
        if self.exit_code > 128:
            try:
                name = signal.Signals(self.exit_code - 128).name
            except ValueError:
                name = f"signal {self.exit_code - 128}"
            hint = ", e.g. docker kill or docker stop" if name in ("SIGKILL", "SIGTERM") else ""
            reason += f" (killed by {name}{hint})"
        return reason

    def structured_error_msg(self) -> str:
        """torchx's reply-file JSON, so ``torchx status`` prints exit code and message."""
        message = self.failure_reason()
        first = job_failure_line.find(self.log_tail)
        if first:  # the job's first failure, as every node's agent names it
            message += f": {first}"
        elif self.log_tail:
            message += "; last log lines: " + " | ".join(self.log_tail.strip().splitlines())
        return json.dumps(error_data(message, "", self.finished_timestamp_s, self.exit_code))


def app_state(replicas: Sequence[ContainerSnapshot], cancelled: bool = False) -> AppState:
    """The job's state: FAILED as soon as too few replicas are left to meet ``min_replicas``.

    A job stopped by ``torchx cancel`` is CANCELLED once none of its replicas runs.
    """
    states = [r.state for r in replicas]
    if not states:
        return AppState.UNKNOWN
    if cancelled and all(is_terminal(s) for s in states):
        return AppState.CANCELLED
    if all(s == AppState.SUCCEEDED for s in states):
        return AppState.SUCCEEDED
    if all(is_terminal(s) for s in states):
        return AppState.CANCELLED if AppState.CANCELLED in states else AppState.FAILED
    for role in {r.role for r in replicas}:
        of_role = [r for r in replicas if r.role == role]
        failed = sum(1 for r in of_role if r.state == AppState.FAILED)
        min_replicas = int(of_role[0].labels.get(LABEL_MIN_REPLICAS, len(of_role)))
        num_replicas = int(of_role[0].labels.get(LABEL_NUM_REPLICAS, len(of_role)))
        if failed and num_replicas - failed < min_replicas:
            return AppState.FAILED
    for state in (AppState.RUNNING, AppState.PENDING, AppState.SUBMITTED):
        if state in states:
            return state
    return AppState.UNKNOWN


def by_role(replicas: Sequence[ContainerSnapshot]) -> Dict[str, List[ContainerSnapshot]]:
    """An app of several roles (ft.ddp)'s replicas per role, the roles in the app's order;
    empty for an app of one role."""
    if not replicas or LABEL_ROLE_INDEX not in replicas[0].labels:
        return {}
    roles: Dict[str, List[ContainerSnapshot]] = {}
    for replica in sorted(replicas, key=lambda r: (int(r.labels[LABEL_ROLE_INDEX]), r.replica_id)):
        roles.setdefault(replica.role, []).append(replica)
    return roles


def role_states(
    roles: Mapping[str, Sequence[ContainerSnapshot]], cancelled: bool = False
) -> Dict[str, AppState]:
    """Each role's state, as :func:`app_state` gives it for an app of that role alone."""
    return {role: app_state(replicas, cancelled) for role, replicas in roles.items()}


def several_roles_app_state(
    states: Mapping[str, AppState], cancelled: bool = False
) -> tuple[AppState, str]:
    """The state of an app of several roles whose roles fail alone (``role_states.py``) and why;
    CANCELLED once ``torchx cancel`` stopped all of it."""
    if cancelled and all(is_terminal(s) for s in states.values()):
        return AppState.CANCELLED, ""
    return several_roles_state(list(states.items()))


def root_cause(replicas: Sequence[ContainerSnapshot]) -> Optional[ContainerSnapshot]:
    """The replica that failed first (by the engine's finish time), if any failed."""
    failed = [r for r in replicas if r.state == AppState.FAILED]
    if not failed:
        return None
    return min(failed, key=lambda r: (r.finished_timestamp_s or float("inf"), r.replica_id))


def app_message(replicas: Sequence[ContainerSnapshot], session_name: str) -> str:
    first = root_cause(replicas)
    if first is None:
        return NOT_SET
    reason = first.failure_reason()
    job_first = job_failure_line.find(first.log_tail)  # the job's, as every agent names it
    if job_first:
        reason += f": {job_first}"
    return (
        f"{first.role}[{first.replica_id}] (container {first.name}) failed first:"
        f" {reason}; its log: torchx log docker://"
        f"{session_name}/{first.app_id}/{first.role}/{first.replica_id}"
    )


def roles_and_statuses(
    replicas: Sequence[ContainerSnapshot],
) -> tuple[List[Role], List[RoleStatus]]:
    roles: Dict[str, Role] = {}
    statuses: Dict[str, RoleStatus] = {}
    for replica in sorted(replicas, key=lambda r: (r.role, r.replica_id)):
        if replica.role not in roles:
            roles[replica.role] = Role(name=replica.role, image=replica.image, num_replicas=0)
            statuses[replica.role] = RoleStatus(replica.role, [])
        roles[replica.role].num_replicas += 1
        failed = replica.state == AppState.FAILED
        statuses[replica.role].replicas.append(
            ReplicaStatus(
                id=replica.replica_id,
                role=replica.role,
                state=replica.state,
                hostname=replica.name,
                structured_error_msg=replica.structured_error_msg() if failed else NOT_SET,
            )
        )
    return list(roles.values()), list(statuses.values())
