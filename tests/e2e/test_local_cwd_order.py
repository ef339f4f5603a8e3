"""A rank's lines keep, through ``torchx run -s local_cwd``, the order in which it wrote
them across stdout and stderr (the agent's two streams land in two files; the followed,
combined log is the agent's ordered copy of both)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_torchx
from torchx_elastic.contract import CONSOLE_COPY_FILE

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    # 0-2 and the listing's own: the copy of the agent's console is not the worker's
    print("descriptors", len(os.listdir("/proc/self/fd")), flush=True)
    for i in range(4):  # a moment apart, even for an agent slowed down by a busy machine
        print(f"to stderr {i}", file=sys.stderr, flush=True)
        time.sleep(0.3)
        print(f"to stdout {i}", flush=True)
        time.sleep(0.3)
    """
)


def test_a_ranks_lines_come_out_in_the_order_it_wrote_them(tmp_path: Path) -> None:
    (tmp_path / "alternate.py").write_text(SCRIPT)
    done = run_torchx(
        "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}",
        "dist.ddp", "-j", "1x2", "--script", "alternate.py",
        cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    expected = ["descriptors 4"]
    expected += [f"to {stream} {i}" for i in range(4) for stream in ("stderr", "stdout")]
    for rank in range(2):
        prefix = f"alternate/0 [n0 r{rank}] "
        lines = [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]
        assert lines == expected, output
    copies = list((tmp_path / "logs").rglob(CONSOLE_COPY_FILE))
    assert len(copies) == 1, copies
    assert "[n0 r1] to stdout 3" in copies[0].read_text()
