"""local_cwd: a replica whose agent was killed by a signal is a lost node, not the job's failure
(role_states.with_lost_replicas); the agents that stayed decide the job."""

from __future__ import annotations

from torchx.specs import AppState

from torchx_elastic.schedulers.role_states import with_lost_replicas


def test_a_killed_replica_beside_agents_that_succeeded_leaves_the_job_succeeded() -> None:
    assert with_lost_replicas([0, -9, 0]) == AppState.SUCCEEDED  # a spare took its place
    assert with_lost_replicas([-15, 0]) == AppState.SUCCEEDED


def test_an_exit_code_of_its_own_a_running_replica_or_no_success_decide_nothing() -> None:
    assert with_lost_replicas([0, -9, 1]) is None  # an agent said the job failed
    assert with_lost_replicas([0, -9, None]) is None  # still running
    assert with_lost_replicas([-9]) is None  # nobody went on
    assert with_lost_replicas([-9, -9]) is None
    assert with_lost_replicas([0, 0]) is None  # nothing lost: torchx's own state stands
    assert with_lost_replicas([]) is None
