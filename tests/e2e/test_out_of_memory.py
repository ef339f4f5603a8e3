"""A rank that runs out of memory (a real OOM kill under a memory-limited cgroup, as in a
container or pod) is named out of memory by the report, the job line and the summary.

Needs root and a writable cgroup hierarchy (v1 or v2); without them it skips, except in CI
(tests/ci.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.ci import unavailable
from tests.conftest import BIN, _env
from tests.waiting import wait_until
from torchx_elastic.contract import SUMMARY_PREFIX

pytestmark = pytest.mark.slow

LIMIT_BYTES = 1536 << 20
# rank 1 takes memory until the kernel kills it; rank 0 waits in a collective
HOG_SCRIPT = """\
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    chunks = []
    while True:
        chunks.append(bytearray(64 << 20))
        time.sleep(0.01)
dist.all_reduce(torch.ones(1))
"""
OUT_OF_MEMORY = (
    "out of memory: the kernel's OOM killer sent SIGKILL (1 kill during the attempt in this"
    " node's memory cgroup, limit 1.5 GiB); give each node more memory, or use less per process"
    " (a smaller batch, fewer processes per node)"
)


@contextmanager
def memory_limited_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A new memory cgroup with that limit (v2, else v1); yields its ``cgroup.procs``. Its
    processes are killed and it is removed at the end."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/memory")
    cgroup = base / f"torchx-elastic-oom-test-{os.getpid()}"
    try:
        cgroup.mkdir()
        (cgroup / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
    except OSError as err:
        unavailable(f"no memory cgroup can be made here ({err}; root and cgroups needed)")
    try:
        yield cgroup / "cgroup.procs"
    finally:

        def removed() -> bool:  # once its processes are gone
            for pid in (cgroup / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                cgroup.rmdir()
            except OSError:
                return False
            return True

        wait_until(removed, what=f"{cgroup} removed", every_s=0.2)


def test_a_rank_killed_for_memory_is_named_out_of_memory(tmp_path: Path) -> None:
    (tmp_path / "hog.py").write_text(HOG_SCRIPT)
    command = f"{BIN / 'torchx'} run -s local_cwd dist.ddp -j 1x2 --script hog.py"
    with memory_limited_cgroup(LIMIT_BYTES) as procs:
        result = subprocess.run(
            ["sh", "-c", f"echo $$ > {procs} && exec {command}"],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
    output = result.stderr
    assert result.returncode != 0, output
    assert "failed first: signal SIGKILL\n" in output, output
    assert f"  error: {OUT_OF_MEMORY}\n" in output
    assert f"torchx-elastic: job failed: rank 1 (node 0) failed first: {OUT_OF_MEMORY}" in output
    # rank 0, in all_reduce, is a victim either way: stopped by the agent, or (the agent a
    # moment later, under load) failed first on whatever gloo says of the lost connection,
    # which varies with the moment the peer died
    victims = output.split("Victims (failed only because a peer failed):\n", 1)[-1]
    assert re.search(r"^\S* *  rank 0 \(node 0, local rank 0\): \S", victims, re.MULTILINE), output
    [summary] = (tmp_path / "torchx_logs").glob(f"**/{SUMMARY_PREFIX}0.json")
    data = json.loads(summary.read_text())
    assert data["root_cause"]["rank"] == 1 and data["root_cause"]["message"] == OUT_OF_MEMORY
