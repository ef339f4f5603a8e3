"""End to end on a real Slurm (``../shared/slurm/cluster.sh``: Debian's slurm-wlm, two nodes
on this machine): ``torchx run -s slurm`` with our components, through torchx's sbatch hetjob
script (``srun --unbuffered``: the tasks' stdout is a pseudo-terminal) and our thin ``slurm``
scheduler. Each job checks every Slurm output file: no escape code, no agent traceback.

The first test starts the cluster (``cluster.sh up`` installs its packages on a fresh
machine, about 20 s once); the last one stops it. Without root or ``cluster.sh`` the tests
skip with the reason locally and fail in CI (tests/ci.py). The jobs run one at a time: both
Slurm nodes share this machine's ports. sacct may say PENDING or RUNNING for a moment after
a job's end: a job's state is read once sacct has its end (``Job.final_status``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ci import unavailable
from tests.conftest import REPO, run_torchx
from tests.e2e.agents import free_port
from tests.waiting import wait_until
from torchx_elastic.contract import SUMMARY_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(600)]

CLUSTER_SH = REPO.parent / "shared" / "slurm" / "cluster.sh"
CLUSTER_LOCK = "/tmp/slurm.lock"
JOB_TIMEOUT_S = 180.0
SCRIPT = "slurm_e2e_train.py"  # a name no other process on this machine has (see cancel)
ROLE = "slurm_e2e_train"
HOSTS = (socket.gethostname(), socket.gethostname() + "b")  # the nodes of cluster.sh
# a frame of the agent's own code or of torch's launcher: the agent crashed (a worker's
# traceback in the root-cause report names the script's frames)
AGENT_FRAME = re.compile(r'File ".*/(torchx_elastic/agent|torch/distributed/elastic)/')
FINAL_STATE = re.compile(r"State: (SUCCEEDED|FAILED|CANCELLED)\b")

TRAIN = """
import os, sys, time
import torch.distributed as dist
from torchx_elastic import progress

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if rank == 0:
    with open("runs.txt", "a") as runs:
        runs.write(f"attempt {attempt}\\n")
print(f"rank {rank} of {world} on {os.uname().nodename} attempt {attempt}", flush=True)
steps = int(os.environ.get("STEPS", "20"))
for step in range(1, steps + 1):
    time.sleep(0.1)
    progress(step, steps)
    if rank == int(os.environ.get("FAIL_RANK", "-1")) and attempt < int(
        os.environ.get("FAIL_ATTEMPTS", "0")
    ) and step == 3:
        raise RuntimeError(f"rank {rank} failed on purpose")
dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


def _cluster_sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    if not CLUSTER_SH.is_file():
        unavailable(f"no {CLUSTER_SH}: the Slurm tests need ../shared/slurm beside the repo")
    if os.geteuid() != 0:
        unavailable("the Slurm cluster (../shared/slurm/cluster.sh) needs root")
    with open(CLUSTER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one cluster per machine
        try:
            up = _cluster_sh("up")
            if up.returncode != 0:
                unavailable(f"cluster.sh up failed:\n{up.stdout[-2000:]}{up.stderr[-2000:]}")
            yield
        finally:
            _cluster_sh("down")


@dataclass
class Job:
    app_handle: str
    workdir: Path
    run: subprocess.CompletedProcess[str]

    @property
    def app_id(self) -> str:
        return self.app_handle.rsplit("/", 1)[1]

    def output_files(self) -> list[Path]:
        files = sorted(self.workdir.glob(f"slurm-{self.app_id}*"))
        assert files, f"no Slurm output file of job {self.app_id} in {self.workdir}"
        return files

    def output(self, node: int, suffix: str) -> str:
        return (self.workdir / f"slurm-{self.app_id}-{ROLE}-{node}.{suffix}").read_text()

    def everything(self) -> str:
        files = self.output_files()
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')}" for p in files)

    def status(self) -> str:
        result = run_torchx("status", self.app_handle, cwd=self.workdir)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def status_once(self, pattern: str | re.Pattern[str], what: str) -> str:
        """``torchx status`` once it matches ``pattern``."""

        def matches() -> str | None:
            text = self.status()
            return text if re.search(pattern, text) else None

        return wait_until(matches, what=what, every_s=1, detail=self.status)

    def final_status(self) -> str:
        """``torchx status`` once sacct has the job's end (it may say PENDING or RUNNING for
        a moment after the job ended)."""
        return self.status_once(FINAL_STATE, f"the end of job {self.app_id} in sacct")

    def processes_left(self) -> str:
        """The processes of the job's script still running on this machine (both nodes)."""
        return subprocess.run(["pgrep", "-af", SCRIPT], capture_output=True, text=True).stdout

    def runs(self) -> list[str]:
        return (self.workdir / "runs.txt").read_text().splitlines()

    def assert_clean_output(self) -> None:
        """No escape code (no live console in a log file) and no traceback of the agent."""
        for path in self.output_files():
            data = path.read_bytes()
            assert b"\x1b" not in data, f"escape code in {path.name}:\n{self.everything()}"
            assert not AGENT_FRAME.search(data.decode(errors="replace")), self.everything()


@pytest.fixture
def workdir(tmp_path: Path, slurm: None) -> Path:
    (tmp_path / SCRIPT).write_text(TRAIN)
    return tmp_path


def run_job(workdir: Path, *args: str, j: str = "2x2", env: str = "") -> Job:
    """``torchx run -s slurm --wait dist.ddp -j J ...`` in ``workdir`` (its own rdzv port)."""
    job_env = f"PET_LOG_DIR={workdir / 'agent_logs'},PET_STATUS_INTERVAL_S=1"
    run = run_torchx(
        "run",
        "-s",
        "slurm",
        "--wait",
        "dist.ddp",
        "-j",
        j,
        "--rdzv_port",
        str(free_port()),
        "--env",
        f"{job_env},{env}" if env else job_env,
        *args,
        "--script",
        SCRIPT,
        cwd=workdir,
        timeout_s=JOB_TIMEOUT_S,
    )
    handles = re.findall(r"^slurm://\S+", run.stdout, re.MULTILINE)
    assert handles, f"no app handle:\n{run.stdout}\n{run.stderr}"
    return Job(handles[0], workdir, run)


@pytest.mark.parametrize(("j", "world"), [("1x2", 2), ("2x1", 2), ("2x2", 4)])
def test_job_succeeds_with_every_rank_on_its_node(workdir: Path, j: str, world: int) -> None:
    job = run_job(workdir, j=j)
    assert job.run.returncode == 0, job.run.stderr + job.everything()
    nodes, nproc = (int(n) for n in j.split("x"))
    for node in range(nodes):
        out = job.output(node, "out")
        for local_rank in range(nproc):
            rank = node * nproc + local_rank
            assert f"[n{node} r{rank}] rank {rank} of {world} on " in out, job.everything()
    assert "State: SUCCEEDED" in job.final_status()
    job.assert_clean_output()
    # no terminal in a batch job: the plain console's job progress lines, on the rank-0 node
    assert "[job progress]" in job.output(0, "out") + job.output(0, "err"), job.everything()
    logs = run_torchx("log", "--streams", "stdout", f"{job.app_handle}/{ROLE}/0", cwd=workdir)
    assert f"rank 0 of {world} on " in logs.stdout, logs.stderr


def test_a_failing_rank_fails_the_job_with_its_root_cause(workdir: Path) -> None:
    job = run_job(workdir, env="FAIL_RANK=3,FAIL_ATTEMPTS=99")
    assert job.run.returncode != 0
    assert "State: FAILED" in job.final_status()
    err = job.output(1, "err")
    assert "RuntimeError: rank 3 failed on purpose" in err, job.everything()
    job.assert_clean_output()


def test_a_retry_restarts_in_place_and_succeeds(workdir: Path) -> None:
    job = run_job(workdir, "--max_retries", "1", env="FAIL_RANK=1,FAIL_ATTEMPTS=1")
    assert job.run.returncode == 0, job.everything()
    assert job.runs() == ["attempt 0", "attempt 1"]
    assert "[n0 r0] rank 0 of 4 on " in job.output(0, "out")
    job.assert_clean_output()


def test_a_retry_budget_that_runs_out_runs_the_job_exactly_twice(workdir: Path) -> None:
    job = run_job(workdir, "--max_retries", "1", env="FAIL_RANK=2,FAIL_ATTEMPTS=99")
    assert job.run.returncode != 0
    # torchx's own sbatch script requeues the job before it ends: ended FAILED, not requeued
    assert "State: FAILED" in job.final_status()
    # a step of it may still be completing (COMPLETING, for a few seconds): not requeued
    squeue = subprocess.run(
        ["squeue", "-h", "-o", "%i %T", "-j", job.app_id], capture_output=True, text=True
    )
    states = {line.split()[-1] for line in squeue.stdout.splitlines() if line.strip()}
    assert states <= {"COMPLETING"}, f"the job is back in the queue:\n{squeue.stdout}"
    # two runs of the job (rank 0's node restarts for its peer's failure, a membership
    # change: its own TORCHELASTIC_RESTART_COUNT stays 0, as torchrun's)
    assert len(job.runs()) == 2, job.runs()
    job.assert_clean_output()


def test_cancel_stops_every_process_and_each_agent_reports(workdir: Path) -> None:
    submitted = run_torchx(
        "run",
        "-s",
        "slurm",
        "dist.ddp",
        "-j",
        "2x2",
        "--rdzv_port",
        str(free_port()),
        "--env",
        f"PET_LOG_DIR={workdir / 'agent_logs'},PET_STATUS_INTERVAL_S=1,STEPS=100000",
        "--script",
        SCRIPT,
        cwd=workdir,
    )
    handle = re.findall(r"^slurm://\S+", submitted.stdout, re.MULTILINE)[0]
    job = Job(handle, workdir, submitted)
    outs = [workdir / f"slurm-{job.app_id}-{ROLE}-{n}.out" for n in (0, 1)]
    wait_until(
        lambda: all(p.exists() and "rank" in p.read_text() for p in outs),
        what="the ranks' first lines on both nodes",
        timeout_s=JOB_TIMEOUT_S,
        every_s=0.5,
    )
    # sacct may still say PENDING for a moment after the tasks printed
    job.status_once("State: RUNNING", "the job RUNNING in sacct")
    # the whole job's progress, as the rank-0 agent last printed it in its output file
    output_file = f"slurm-{job.app_id}-{ROLE}-0.err"
    progress = re.compile(rf"progress \d+/100000 .*of 4/4 ranks.* {output_file}\)")
    job.status_once(progress, "the whole job's progress in torchx status")
    cancelled = run_torchx("cancel", handle, cwd=workdir)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "State: CANCELLED" in job.final_status()
    # the agents stop their workers, write their summaries and exit after the cancel
    wait_until(
        lambda: job.processes_left() == "",
        what="the end of every process of the job",
        detail=job.processes_left,
    )
    job.assert_clean_output()
    # each agent stopped its workers, wrote its summary and exited 128 + SIGTERM
    summaries = [
        json.loads(p.read_text()) for p in workdir.glob(f"agent_logs/**/{SUMMARY_PREFIX}*")
    ]
    ends = sorted(
        (s["node"], s["host"] == HOSTS[s["node"]], s["state"], s["exit_code"]) for s in summaries
    )
    assert ends == [(0, True, "STOPPED", 143), (1, True, "STOPPED", 143)], job.everything()
    batch = (workdir / f"slurm-{job.app_id}.out").read_text()
    for host in HOSTS:
        assert f"srun: error: {host}: task 0: Exited with exit code 143" in batch, batch


def test_a_one_node_job_trains_beside_a_spare_that_stands_by_and_ends_with_it(
    workdir: Path,
) -> None:
    """-j 1x1 --spares 1 --cpu 1 (torchx's Slurm hetjob gives each replica nodes of its own:
    the two 2-CPU nodes here hold one node and a spare, not -j 2x1's three). torchx's Slurm
    scheduler hands the nodes no job secret: the two agents share the rendezvous
    unauthenticated, said once each (before the agent knew of spares, each agent of a
    one-node job made its own secret and refused the other's rendezvous state)."""
    submitted = run_torchx(
        "run", "-s", "slurm", "dist.ddp", "-j", "1x1", "--spares", "1", "--cpu", "1",
        "--rdzv_port", str(free_port()),
        "--env", f"PET_LOG_DIR={workdir / 'agent_logs'},PET_STATUS_INTERVAL_S=1,STEPS=150",
        "--script", SCRIPT,
        cwd=workdir,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = Job(re.findall(r"^slurm://\S+", submitted.stdout, re.MULTILINE)[0], workdir, submitted)
    job.status_once("nodes: 1 training, 1 standby", "the spare in torchx status")
    assert "State: SUCCEEDED" in job.final_status(), job.everything()
    wait_until(
        lambda: job.processes_left() == "",
        what="the end of every process of the job",
        detail=job.processes_left,
    )
    outputs = [job.output(node, "out") + job.output(node, "err") for node in (0, 1)]
    standing_by = "torchx-elastic: standing by: the job has its 1 node ("
    spares = [node for node, text in enumerate(outputs) if standing_by in text]
    assert len(spares) == 1, job.everything()
    trained, spare = outputs[1 - spares[0]], outputs[spares[0]]
    assert "rank 0 of 1 on " in trained and "rank 0 done" in trained, job.everything()
    assert "rank 0 of" not in spare, job.everything()  # it never trained
    assert "stood by as a spare, so this node exits without training" in spare, job.everything()
    for text in outputs:
        assert text.count("this multi-node rendezvous is NOT authenticated") == 1, text
    assert job.runs() == ["attempt 0"]
    job.assert_clean_output()
