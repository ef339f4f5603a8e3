"""Whole lines through the main command: ``torchx run -s local_cwd`` with partial writes.

Every rank writes each line in two writes; torchx's own local log tail hands out a
half-written last line as a line of its own (``... L0-2957-E`` then ``... ND``). Ours must
show every line whole, once and in order, in ``torchx run``'s output (the log tail that
``torchx log`` uses too).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_torchx

pytestmark = [pytest.mark.slow, pytest.mark.torchx_dev]

LINES_PER_RANK = 3000
SPLIT_WRITES = f"""
import os, sys
rank = os.environ["RANK"]
for i in range({LINES_PER_RANK}):
    sys.stdout.write(f"L{{rank}}-{{i}}-E")
    sys.stdout.flush()
    sys.stdout.write("ND\\n")
    sys.stdout.flush()
"""
_PROBE_LINE = re.compile(r"\[n0 r(\d)\] (L\d+-\d+-E\S*)$")


def _probe_lines(output: str) -> list[str]:
    """The probe lines of torchx's output, each as written by its rank."""
    found: list[str] = []
    for line in output.splitlines():
        if "L" not in line or "[n0 r" not in line:
            continue
        match = _PROBE_LINE.search(line)
        assert match, f"torn or glued line: {line!r}"
        found.append(match[2])
    return found


def _expected() -> list[str]:
    return sorted(f"L{r}-{i}-END" for r in range(4) for i in range(LINES_PER_RANK))


def test_run_output_has_every_line_whole(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text(SPLIT_WRITES)
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "1x4", "--script", "s.py", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = _probe_lines(result.stderr)
    assert sorted(lines) == _expected()
    # and in order per rank
    for rank in range(4):
        of_rank = [line for line in lines if line.startswith(f"L{rank}-")]
        assert of_rank == [f"L{rank}-{i}-END" for i in range(LINES_PER_RANK)]
