"""End to end on a real Slurm (``../shared/slurm/cluster.sh``: Debian's slurm-wlm, two nodes
on this machine): ``torchx run -s slurm`` with our components, through torchx's sbatch hetjob
script (``srun --unbuffered``: the tasks' stdout is a pseudo-terminal) and our thin ``slurm``
scheduler. Each job checks every Slurm output file: no escape code, no agent traceback.

The first test starts the cluster (``cluster.sh up`` installs its packages on a fresh
machine, about 20 s once); the last one stops it. Without root or ``cluster.sh`` the tests
skip with the reason locally and fail in CI (``CI=true``). The jobs run one at a time: both
Slurm nodes share this machine's ports.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, run_torchx
from tests.e2e.agents import free_port
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


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_or_fail(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def _cluster_sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), command], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    if not CLUSTER_SH.is_file():
        _skip_or_fail(f"no {CLUSTER_SH}: the Slurm tests need ../shared/slurm beside the repo")
    if os.geteuid() != 0:
        _skip_or_fail("the Slurm cluster (../shared/slurm/cluster.sh) needs root")
    with open(CLUSTER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one cluster per machine
        try:
            up = _cluster_sh("up")
            if up.returncode != 0:
                _skip_or_fail(f"cluster.sh up failed:\n{up.stdout[-2000:]}{up.stderr[-2000:]}")
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
    assert "State: SUCCEEDED" in job.status()
    job.assert_clean_output()
    # no terminal in a batch job: the plain console's job progress lines, on the rank-0 node
    assert "[job progress]" in job.output(0, "out") + job.output(0, "err"), job.everything()
    logs = run_torchx("log", "--streams", "stdout", f"{job.app_handle}/{ROLE}/0", cwd=workdir)
    assert f"rank 0 of {world} on " in logs.stdout, logs.stderr


def test_a_failing_rank_fails_the_job_with_its_root_cause(workdir: Path) -> None:
    job = run_job(workdir, env="FAIL_RANK=3,FAIL_ATTEMPTS=99")
    assert job.run.returncode != 0
    assert "State: FAILED" in job.status()
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
    time.sleep(5)  # torchx's own sbatch script would have requeued the job by now
    assert "State: FAILED" in job.status()
    squeue = subprocess.run(["squeue", "-h", "-j", job.app_id], capture_output=True, text=True)
    assert squeue.stdout.strip() == "", f"the job is back in the queue:\n{squeue.stdout}"
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
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        outs = [workdir / f"slurm-{job.app_id}-{ROLE}-{n}.out" for n in (0, 1)]
        if all(p.exists() and "rank" in p.read_text() for p in outs):
            break
        time.sleep(0.5)
    # sacct may still say PENDING for a moment after the tasks printed
    while "State: RUNNING" not in job.status() and time.monotonic() < deadline:
        time.sleep(1)
    assert "State: RUNNING" in job.status()
    # the whole job's progress, as the rank-0 agent last printed it in its output file
    output_file = f"slurm-{job.app_id}-{ROLE}-0.err"
    progress = re.compile(rf"progress \d+/100000 .*of 4/4 ranks.* {output_file}\)")
    while not progress.search(job.status()) and time.monotonic() < deadline:
        time.sleep(1)
    assert progress.search(job.status()), job.status() + job.everything()
    cancelled = run_torchx("cancel", handle, cwd=workdir)
    assert cancelled.returncode == 0, cancelled.stderr
    deadline = time.monotonic() + 60
    while "State: CANCELLED" not in job.status() and time.monotonic() < deadline:
        time.sleep(1)
    assert "State: CANCELLED" in job.status()
    time.sleep(2)
    left = subprocess.run(["pgrep", "-af", SCRIPT], capture_output=True, text=True)
    assert left.stdout == "", f"processes of the job are left:\n{left.stdout}"
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
