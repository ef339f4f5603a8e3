"""A job's state from ``sacct --parsable2 -j ID``, as torchx's Slurm scheduler reads it, with
every state sacct may print: ``CANCELLED by 0`` (after ``scancel``) and a truncated
``CANCELLED+`` are ``CANCELLED`` (torchx's development line reads them so too)."""

from __future__ import annotations

import csv
from typing import Dict, Optional

from torchx.schedulers.api import DescribeAppResponse
from torchx.schedulers.slurm_scheduler import SLURM_STATES
from torchx.specs import AppState, ReplicaStatus, Role, RoleStatus

# squeue's columns under sacct's names
SQUEUE_FORMAT = "%i|%j|%T"
SQUEUE_HEADER = "JobID|JobName|State"


def app_state(sacct_state: str) -> AppState:
    """``CANCELLED by 0`` -> ``CANCELLED``; a state torchx does not know is ``UNKNOWN``."""
    words = sacct_state.split()
    return SLURM_STATES.get(words[0].rstrip("+"), AppState.UNKNOWN) if words else AppState.UNKNOWN


def describe_from_sacct(app_id: str, sacct_output: str) -> Optional[DescribeAppResponse]:
    """One replica per hetjob component (``<ID>+<k>``, named ``<role>-<replica>``); steps
    (``<ID>+<k>.0``, ``.batch``) are skipped; the job's state is the last component's."""
    lines = sacct_output.splitlines()
    if len(lines) <= 1:
        return None
    roles: Dict[str, Role] = {}
    statuses: Dict[str, RoleStatus] = {}
    state, msg = AppState.UNKNOWN, ""
    for row in csv.DictReader(lines, delimiter="|"):
        job_id, _, component = row["JobID"].partition("+")
        if job_id != app_id or "." in component or "." in job_id:
            continue
        msg = row["State"]
        state = app_state(msg)
        role, _, replica_id = row["JobName"].rpartition("-")
        if not role or not replica_id.isdigit():
            continue  # sacct may not have the name yet
        if role not in roles:
            roles[role] = Role(name=role, num_replicas=0, image="")
            statuses[role] = RoleStatus(role, [])
        roles[role].num_replicas += 1
        statuses[role].replicas.append(
            ReplicaStatus(id=int(replica_id), role=role, state=state, hostname="")
        )
    return DescribeAppResponse(
        app_id=app_id,
        roles=list(roles.values()),
        roles_statuses=list(statuses.values()),
        state=state,
        msg=msg,
    )
