"""worker_end's parts in one real process each (no agent): flush, keep groups, finish."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_finish_joins_threads_runs_atexit_flushes_unclosed_files_and_exits_with_the_code(
    tmp_path: Path,
) -> None:
    result = _run(
        """
        import atexit, sys, threading, time
        from torchx_elastic.agent.workers import worker_end
        def late_writer():  # still writing when finish() is called (the scenario)
            time.sleep(0.5)
            open("thread.out", "w").write("done")
        threading.Thread(target=late_writer).start()
        text = open("text.out", "w")
        text.write("t" * 100_003)
        raw = open("raw.out", "wb")
        raw.write(b"r" * 5)
        atexit.register(lambda: open("atexit.out", "w").write("ran"))
        sys.stdout.write("no newline")
        worker_end.finish(7)
        """,
        tmp_path,
    )
    assert result.returncode == 7, result.stderr
    assert (tmp_path / "text.out").stat().st_size == 100_003
    assert (tmp_path / "raw.out").read_bytes() == b"r" * 5
    assert (tmp_path / "atexit.out").read_text() == "ran"
    assert (tmp_path / "thread.out").read_text() == "done"
    assert result.stdout == "no newline"


def test_process_groups_are_kept_past_destroy_and_released_at_the_end(tmp_path: Path) -> None:
    result = _run(
        """
        import os, torch.distributed as dist
        from torchx_elastic.agent.workers import worker_end
        worker_end.keep_process_groups()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        world = dist.group.WORLD
        sub = dist.new_group([0])
        # a group made by a creator imported before the worker started (DeviceMesh's own)
        import torch.distributed.device_mesh as device_mesh
        mesh_group = device_mesh.new_group([0])
        dist.destroy_process_group(sub)
        print(len(worker_end._kept_groups), worker_end._kept_groups[0] is sub)
        dist.destroy_process_group()
        kept = worker_end._kept_groups
        print(len(kept), kept[1] is world, kept[2] is mesh_group)
        worker_end.release_process_groups()
        print(len(worker_end._kept_groups))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True", "3", "True", "True", "0"]
