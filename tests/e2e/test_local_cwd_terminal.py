"""``torchx run -s local_cwd`` on a terminal shows what the script draws: a rank's line that
it redraws with carriage returns (tqdm, Rich, Lightning) moves live above the job bar,
labelled as its lines are, as the agent shows it on its own terminal; on a terminal that
reports no size (a bare pty) every line is shown all the same."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
from pathlib import Path
from typing import Optional

import pytest

from tests.agent.test_console_e2e import _screen
from tests.conftest import BIN, _env
from tests.pty_output import pty_chunks

pytestmark = [pytest.mark.slow, pytest.mark.torchx_dev]

STEPS = 50
DRAWING = f"""
import os, sys, time
from torchx_elastic import progress
rank = os.environ["RANK"]
for i in range({STEPS}):
    sys.stderr.write(f"\\rdrawing {{i + 1:2d}}/{STEPS} " + "#" * (i // 5))
    sys.stderr.flush()
    progress(i + 1, {STEPS})
    time.sleep(0.1)
sys.stderr.write("\\n")
print(f"rank {{rank}} done", flush=True)
"""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run_on_a_pty(
    workdir: Path, size: Optional[tuple[int, int]]
) -> tuple[int, list[tuple[float, str]]]:
    """``torchx run`` of a 1x2 job whose ranks draw, on a pty of ``size`` (rows, columns;
    None: none): its exit code and what it wrote, each piece with when it came."""
    (workdir / "drawing.py").write_text(DRAWING)
    main_fd, child_fd = pty.openpty()
    if size is not None:
        fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    env = _env({"TERM": "xterm-256color"})
    for name in ("COLUMNS", "LINES", "NO_COLOR"):  # the pty's size, or none, decides
        env.pop(name, None)
    argv = ["run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", "drawing.py"]
    proc = subprocess.Popen(
        [str(BIN / "torchx"), *argv],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=child_fd,
        stderr=child_fd,
    )
    os.close(child_fd)
    pieces = [(at, data.decode("utf-8", "replace")) for at, data in pty_chunks(main_fd, proc, 240)]
    return proc.wait(60), pieces


def _moves(pieces: list[tuple[float, str]], rank: int) -> list[tuple[float, int]]:
    """When rank ``rank``'s drawn line changed on screen, with its step then."""
    row = re.compile(rf"drawing/0 \[n0 r{rank}\] drawing +(\d+)/{STEPS}")
    moves: list[tuple[float, int]] = []
    for at, text in pieces:
        for step in row.findall(_ANSI.sub("", text)):
            if not moves or moves[-1][1] != int(step):
                moves.append((at, int(step)))
    return moves


def _assert_moves_live(moves: list[tuple[float, int]]) -> None:
    """Drawn while it runs (in many writes to the terminal, each step further), not once at
    its end; how often it is redrawn is a speed, measured in bench/, not here."""
    assert len(moves) >= 5, moves
    steps = [step for _, step in moves]
    assert steps == sorted(steps) and steps[-1] == STEPS, moves


@pytest.mark.parametrize("size", [(40, 150), None], ids=["sized", "no-size"])
def test_a_ranks_redrawn_line_moves_live_with_its_prefix(
    tmp_path: Path, size: Optional[tuple[int, int]]
) -> None:
    code, pieces = _run_on_a_pty(tmp_path, size)
    output = "".join(text for _, text in pieces)
    assert code == 0, output[-3000:]
    for rank in (0, 1):
        _assert_moves_live(_moves(pieces, rank))
    screen = [_ANSI.sub("", row).rstrip() for row in _screen(output) if row.strip()]
    shown = [row for row in screen if row.startswith("drawing/0 [n0 r")]
    # every line of the job, whole; no unfinished line is left on screen
    assert sorted(shown) == sorted(
        [f"drawing/0 [n0 r{r}] drawing {STEPS}/{STEPS} " + "#" * ((STEPS - 1) // 5) for r in (0, 1)]
        + [f"drawing/0 [n0 r{r}] rank {r} done" for r in (0, 1)]
    ), "\n".join(screen)
    bars = [row for row in screen if "━" in row]
    assert len(bars) == 1, "\n".join(screen)  # the job bar, redrawn in place
    assert re.search(rf"job .*━+ {STEPS}/{STEPS} of 2/2 ranks", bars[0]), bars
