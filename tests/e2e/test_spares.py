"""Spares (real agents): nodes beyond the job's size wait at the rendezvous as standbys (torch's
redundancy list), say so, take a lost node's place at the next round, and end with the job
(exit 0) when no node is lost."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_torchx
from tests.e2e.agents import descendants, free_port, start_agent, wait_for_text

pytestmark = pytest.mark.slow

# each worker names the node it runs on (SPARE_NAME), then steps in lockstep with its peers
SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
name = os.environ.get("SPARE_NAME")
print(f"{name} trains as rank {rank} of world {world} at {count}", flush=True)
for step in range(int(sys.argv[1])):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
print(f"done world {world}", flush=True)
"""
STANDING_BY = "torchx-elastic: standing by: the job has its 2 nodes (3 here); this node takes"


def test_through_torchx_a_spare_stands_by_and_ends_with_the_job(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1", "--spares", "1",
        "--rdzv_port", str(free_port()), "--script", "train.py", "--", "40", cwd=tmp_path,
    )  # fmt: skip
    out = result.stderr
    assert result.returncode == 0, out[-4000:]
    [spare] = re.findall(r"train/(\d) " + re.escape(STANDING_BY), out)[:1]
    assert (
        f"train/{spare} torchx-elastic: the job this node came for has finished: its rendezvous"
        " (run id 'train-"
    ) in out
    assert (
        "is closed while this node stood by as a spare, so this node exits without training" in out
    )
    assert out.count(" trains as rank ") == 2  # the spare never trained
    assert f"train/{spare} [n" not in out


def test_a_spare_takes_the_place_of_a_lost_node(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    port = free_port()
    flags = (
        "--nnodes", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "spares", "train.py", "300",
    )  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in ("host", "lost", "spare")}

    def start(name: str) -> subprocess.Popen[bytes]:
        return start_agent(*flags, cwd=tmp_path, log=logs[name], env={"SPARE_NAME": name})

    agents = {"host": start("host")}  # the store's host: on one machine it cannot move
    try:
        wait_for_text(logs["host"], "hosting the rendezvous")
        agents["lost"] = start("lost")
        wait_for_text(logs["lost"], "lost trains as rank")
        agents["spare"] = start("spare")
        wait_for_text(logs["spare"], STANDING_BY)
        lost = agents["lost"]
        for pid in [lost.pid, *descendants(lost.pid)]:
            os.kill(pid, signal.SIGKILL)
        for name in ("host", "spare"):
            assert agents[name].wait(timeout=240) == 0, logs[name].read_text()
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.kill()
    spare = logs["spare"].read_text()
    # in the lost node's place, at the job's next attempt, in a world of 2: never alone
    assert re.search(r"spare trains as rank [01] of world 2 at 1\n", spare), spare
    assert "done world 2" in logs["host"].read_text() + spare
    assert " of world 1 " not in spare
