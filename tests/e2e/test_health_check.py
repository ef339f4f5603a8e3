"""``--health-check CMD`` (real agents): run before each rendezvous round a node would join;
a node that fails it stays out of the job, says why, and keeps the output; the other nodes
go on without it."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conftest import run_agent, run_torchx
from tests.e2e.agents import free_port, start_agent, wait_for_text
from tests.waiting import wait_until
from torchx_elastic.contract import EVENTS_FILE

pytestmark = pytest.mark.slow

WORKER = """\
import os
print("trained at world", os.environ["WORLD_SIZE"], flush=True)
"""
FAILING = 'echo checking the GPUs; echo "GPU 0: 3 uncorrectable ECC errors" >&2; exit 3'


def _listens(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _events(log_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (log_dir / EVENTS_FILE).read_text().splitlines()]


def test_a_node_that_fails_its_check_starts_no_worker_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(WORKER)
    logs = tmp_path / "logs"
    result = run_agent(
        "--log-dir", str(logs), "--health-check", FAILING, "train.py", cwd=tmp_path
    )  # fmt: skip
    output = logs / "health_check_round1.log"
    assert result.returncode == 1, result.stderr
    assert result.stderr.endswith(
        f"torchx-elastic: error: health check {FAILING!r} failed with exit code 3 before"
        " rendezvous round 1: this node does not join the job; its last line: 'GPU 0: 3"
        f" uncorrectable ECC errors'; its output: {output}\n"
    ), result.stderr
    assert "trained" not in result.stdout + result.stderr
    assert output.read_text() == "checking the GPUs\nGPU 0: 3 uncorrectable ECC errors\n"
    [check] = [e for e in _events(logs) if e["event"] == "health_check"]
    assert (check["round"], check["exit_code"], check["passed"]) == (1, 3, False)


def test_a_node_that_fails_before_a_later_round_leaves_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    """Two nodes, min 1: the job restarts once (rank 1 fails, rank 0 loses its peer); before
    the second round one node's check fails (its first passed): that node exits 1 saying
    so, the other trains alone and succeeds."""
    (tmp_path / "train.py").write_text(
        "import os, sys\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "count, rank = os.environ['TORCHELASTIC_RESTART_COUNT'], dist.get_rank()\n"
        "print(f'rank {rank} world {dist.get_world_size()} restart count {count}', flush=True)\n"
        "dist.all_reduce(torch.ones(1))\n"
        "if count == '0' and rank == 1:\n"
        "    sys.exit(1)\n"
        "dist.all_reduce(torch.ones(1))  # rank 0 loses its peer here\n"
    )
    port = free_port()
    flags = (
        "--nnodes", "1:2", "--max-restarts", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "checked",
        "--rdzv-conf", "last_call_timeout=60",  # round 1 waits for both (done once both came)
    )  # fmt: skip
    once = "test ! -e checked_once && touch checked_once"  # passes the first time only
    healthy_log, failing_log = tmp_path / "healthy.log", tmp_path / "failing.log"
    failing_logs = tmp_path / "failing_logs"
    healthy = start_agent(
        *flags, "--health-check", "true", "train.py", cwd=tmp_path, log=healthy_log
    )
    # the healthy node hosts the store (on one machine the rendezvous cannot move)
    wait_until(lambda: _listens(port), what=f"the store on port {port}", every_s=0.1)
    failing = start_agent(
        *flags, "--health-check", once, "--log-dir", str(failing_logs), "train.py",
        cwd=tmp_path, log=failing_log,
    )  # fmt: skip
    try:
        assert failing.wait(timeout=240) == 1, failing_log.read_text()
        assert healthy.wait(timeout=240) == 0, healthy_log.read_text()
    finally:
        for agent in (healthy, failing):
            if agent.poll() is None:
                agent.kill()
    assert (
        f"torchx-elastic: error: health check {once!r} failed with exit code 1 before"
        f" rendezvous round 2: this node does not join the job; its output:"
        f" {failing_logs / 'health_check_round2.log'}\n"
    ) in failing_log.read_text()
    wait_for_text(healthy_log, "rank 0 world 1 restart count 1")
    checks = [e for e in _events(failing_logs) if e["event"] == "health_check"]
    assert [(e["round"], e["passed"]) for e in checks] == [(1, True), (2, False)]


def test_through_torchx_the_replica_that_fails_its_check_says_why(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(WORKER)
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "1x1", "--health_check", "echo no GPU; exit 7",
        "--script", "train.py", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        "train/0 torchx-elastic: error: health check 'echo no GPU; exit 7' failed with exit code 7"
        " before rendezvous round 1: this node does not join the job; its last line: 'no GPU';"
        " its output: "
    ) in result.stderr, result.stderr[-3000:]
    assert "trained" not in result.stderr
