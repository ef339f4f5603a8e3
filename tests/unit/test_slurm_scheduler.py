"""Our ``slurm`` scheduler without a cluster: the sbatch script it writes and the states it
reads from sacct (the real cluster: tests/slurm/test_slurm_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torchx.specs import AppDef, AppState, Role

from torchx_elastic.components.dist import ddp
from torchx_elastic.schedulers.slurm import SlurmScheduler, create_scheduler
from torchx_elastic.schedulers.slurm.status import describe_from_sacct


@pytest.fixture(autouse=True)
def _no_sinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torchx asks sinfo for the partition's memory: no Slurm here (a stopped controller
    would make sinfo retry for seconds)."""
    monkeypatch.setenv("PATH", str(tmp_path))


def test_the_agents_restarts_are_the_jobs_retries_and_no_requeue_follows() -> None:
    scheduler = create_scheduler("test")
    assert isinstance(scheduler, SlurmScheduler)
    app = ddp(script="main.py", j="2x2", max_retries=1)
    script = scheduler.submit_dryrun(app, {}).request.materialize()
    assert "export TORCHX_MAX_RETRIES=0\n" in script  # torchx's script requeues below that
    assert script.count("--max-restarts 1 ") == 2  # one agent per node restarts in place
    assert "--requeue" in script  # a node failure is still Slurm's to requeue


def test_a_role_of_another_component_keeps_torchx_requeues() -> None:
    echo = Role(name="echo", image="", entrypoint="echo", args=["hi"], max_retries=2)
    request = create_scheduler("test").submit_dryrun(AppDef("echo", roles=[echo]), {}).request
    assert "export TORCHX_MAX_RETRIES=2\n" in request.materialize()


SACCT_CANCELLED = """JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode
22+0|train-0|debug|root|2|CANCELLED by 0|0:0
22+0.batch|batch||root|2|CANCELLED|0:15
22+0.0|python3||root|2|CANCELLED|0:15
22+1|train-1|debug|root|2|CANCELLED by 0|0:0
22+1.0|python3||root|2|CANCELLED|0:15
"""


def test_a_cancelled_job_is_cancelled_with_its_replicas() -> None:
    found = describe_from_sacct("22", SACCT_CANCELLED)
    assert found is not None
    assert (found.state, found.msg) == (AppState.CANCELLED, "CANCELLED by 0")
    [role] = found.roles_statuses
    assert (role.role, [r.id for r in role.replicas]) == ("train", [0, 1])
    assert {r.state for r in role.replicas} == {AppState.CANCELLED}


def test_truncated_unknown_and_missing_states() -> None:
    header = "JobID|JobName|State\n"
    truncated = describe_from_sacct("7", header + "7+0|t-0|CANCELLED+\n")
    assert truncated is not None and truncated.state == AppState.CANCELLED
    unknown = describe_from_sacct("7", header + "7+0|t-0|SOMETHING_NEW\n")
    assert unknown is not None and unknown.state == AppState.UNKNOWN
    assert describe_from_sacct("7", header) is None  # sacct does not know the job (yet)


SACCT_RUNNING = "JobID|JobName|State\n31+0|train-0|RUNNING\n31+1|train-1|RUNNING\n"
WAITING = (
    "torchx-elastic: waiting for nodes: 1 of 2 joined; here: n0 (pid 7); missing: 1 node;"
    " hosting the rendezvous at n0:29500, run id 'job'; gives up at 10:00:00 (join timeout 600s)\n"
    "[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node\n"
)
PROGRESS = (
    "[job progress] 120/200 (60.0%) of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120,"
    " fastest r0 (n0) 131, 4.1 steps/s, ETA 29s\n"
)


def running_job(tmp_path: Path, sacct: str = SACCT_RUNNING) -> SlurmScheduler:
    """A scheduler whose ``sacct`` (on PATH, in ``tmp_path``) prints ``sacct``."""
    fake = tmp_path / "sacct"
    fake.write_text(f"#!/bin/sh\nprintf '%s' '{sacct}'\n")  # PATH has no cat
    fake.chmod(0o755)
    scheduler = create_scheduler("test")
    assert isinstance(scheduler, SlurmScheduler)
    return scheduler


def test_status_of_a_running_job_says_what_its_first_round_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no job_dir: the output files are where the job was run
    (tmp_path / "slurm-31-train-0.err").write_text("rank 0 starting\n" + WAITING)
    found = running_job(tmp_path).describe("31")
    assert found is not None and found.state == AppState.RUNNING
    first, second = found.msg.split("\n")
    assert first == "RUNNING"
    assert second.startswith(
        "waiting for nodes: 1 of 2 joined; here: n0 (pid 7); missing: 1 node; hosting the"
    ), second
    assert second.endswith(" ago, slurm-31-train-0.err)"), second


def test_status_of_a_running_job_shows_its_progress_from_its_job_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = tmp_path / "jobs"
    job_dir.mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".torchxslurmjobdirs").write_text(f"31 = {job_dir}\n")
    (job_dir / "slurm-31-train-0.err").write_text(WAITING + PROGRESS + "[0]:step 121\n")
    found = running_job(tmp_path).describe("31")
    assert found is not None
    assert found.msg.split("\n")[1].startswith(
        "progress 120/200 (60.0%) of 4/4 ranks, 4.1 steps/s, ETA 29s (as of "
    ), found.msg


def test_status_of_a_job_without_progress_reports_says_its_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    nodes = "[job progress] nodes: 1 training, 1 standby\n"
    (tmp_path / "slurm-31-train-0.err").write_text(WAITING + nodes + "[0]:step 121\n")
    found = running_job(tmp_path).describe("31")
    assert found is not None
    assert found.msg.split("\n")[1].startswith("nodes: 1 training, 1 standby (as of "), found.msg


def test_status_without_an_output_file_or_of_an_ended_job_is_slurms_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    found = running_job(tmp_path).describe("31")
    assert found is not None and found.msg == "RUNNING"  # not started, or not shared here
    (tmp_path / "slurm-31-train-0.err").write_text(PROGRESS)
    ended = running_job(tmp_path, SACCT_RUNNING.replace("RUNNING", "COMPLETED")).describe("31")
    assert ended is not None and ended.msg == "COMPLETED"
