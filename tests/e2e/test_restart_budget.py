"""One restart budget for the job (real agents, c10d on this machine): a node that joins late
learns how many restarts the job has spent, whichever node failed, and every node's workers
see the same ``TORCHELASTIC_RESTART_COUNT`` (torchrun's late node says 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.agents import free_port, start_agent, wait_for_text

pytestmark = pytest.mark.slow

# alone: the first attempt fails (a restart spent), the second waits for the second node;
# together at restart count 1: rank 1 fails (the second restart); at 2: both succeed
SCRIPT = """\
import os, sys, time
count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
print(f"rank {rank} world {world} restart count {count}", flush=True)
if world == 1:
    if count == 0:
        sys.exit(3)
    time.sleep(300)
elif count == 1 and rank == 1:
    sys.exit(4)
elif count == 1:
    time.sleep(300)
"""


def test_a_late_node_counts_the_restarts_the_job_spent_before_it_came(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    port = free_port()
    flags = (
        "--nnodes", "1:2", "--max-restarts", "3", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "budget",
        "--rdzv-conf", "last_call_timeout=1", "train.py",
    )  # fmt: skip
    first_log, late_log = tmp_path / "first.log", tmp_path / "late.log"
    first = start_agent(*flags, cwd=tmp_path, log=first_log)
    late = None
    try:
        wait_for_text(first_log, "rank 0 world 1 restart count 1")
        late = start_agent(*flags, cwd=tmp_path, log=late_log)
        assert first.wait(timeout=240) == 0, first_log.read_text()
        assert late.wait(timeout=60) == 0, late_log.read_text()
    finally:
        for agent in (first, late):
            if agent is not None and agent.poll() is None:
                agent.kill()
    both = first_log.read_text() + late_log.read_text()
    # the late node's worker starts at the job's count, not at 0
    for rank in (0, 1):
        assert f"rank {rank} world 2 restart count 1\n" in both, both
        assert f"rank {rank} world 2 restart count 2\n" in both, both
    assert "world 2 restart count 0" not in both
    # the second failure is the job's second restart on whichever node said it
    assert both.count("; restarting every node: attempt 3 of 4 (1 restart left)") == 1, both
