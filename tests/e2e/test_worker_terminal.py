"""A worker's terminal as under torchrun: where the agent's output reaches a terminal (the
agent alone on one, or ``torchx run -s local_cwd`` on one), each worker's stdout and stderr
are pseudo-terminals of that terminal's size, and what a script draws there with cursor
movement (a Rich ``Progress``, a Rich ``Live`` table, ``tqdm`` bars at two positions) is drawn
live, under the rank's prefix, while it runs; the rank's files keep plain lines (the final
state of the region, no escape sequence). On a sized and an unsized pty."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Optional

import pytest

from tests.conftest import BIN, _env, one_node_port
from tests.pty_output import pty_chunks

pytestmark = [pytest.mark.slow, pytest.mark.torchx_dev]

STEPS = 40
# each script: rank 0 says what its stdout is, then draws STEPS states, 0.1 s apart
HEAD = """
import os, sys, time
size = os.get_terminal_size(sys.stdout.fileno()) if sys.stdout.isatty() else None
drawing = os.environ["RANK"] == "0"
if drawing:
    print(f"stdout is a terminal: {sys.stdout.isatty()}, {size.columns}x{size.lines}" if size
          else "stdout is not a terminal", flush=True)
"""
TAIL = """
print(f"rank {os.environ['RANK']} done", flush=True)
"""
DRAWINGS = {
    "rich-progress": f"""
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
if drawing:
    with Progress(TextColumn("{{task.description}}"), MofNCompleteColumn(), BarColumn()) as bar:
        task = bar.add_task("state", total={STEPS})
        for i in range({STEPS}):
            time.sleep(0.1)
            bar.update(task, advance=1)
""",
    "rich-live-table": f"""
from rich.live import Live
from rich.table import Table
def table(i):
    grid = Table()
    grid.add_column("metric")
    grid.add_column("value")
    grid.add_row("state", f"{{i}}/{STEPS}")
    grid.add_row("loss", f"{{1 / (i + 1):.3f}}")
    return grid
if drawing:
    with Live(table(0), refresh_per_second=10) as live:
        for i in range(1, {STEPS} + 1):
            time.sleep(0.1)
            live.update(table(i))
""",
    "tqdm-positions": f"""
from tqdm import tqdm
if drawing:
    # tqdm draws nothing on a terminal of 0x0 (an unsized pty; under torchrun too)
    shown = dict(bar_format="{{desc}} {{n}}/{{total}}", ncols=80, nrows=20)
    outer = tqdm(total={STEPS}, position=0, desc="outer state", **shown)
    inner = tqdm(total={STEPS}, position=1, desc="inner", **shown)
    for i in range({STEPS}):
        time.sleep(0.1)
        inner.update(1)
        outer.update(1)
    inner.close()
    outer.close()
""",
}
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
PTY_SIZES = {"120x40": (40, 120), "unsized": None}


def _on_a_pty(
    argv: list[str], workdir: Path, size: Optional[tuple[int, int]]
) -> tuple[int, list[str]]:
    """Run ``argv`` on a pty of ``size`` (rows, columns; None: a pty without a size): its exit
    code and each piece it wrote, escape sequences taken out."""
    main_fd, child_fd = pty.openpty()
    if size is not None:
        fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    env = _env({"TERM": "xterm-256color"})
    for name in ("COLUMNS", "LINES", "NO_COLOR"):  # the pty's size, or none, decides
        env.pop(name, None)
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=one_node_port(argv, env),
        stdin=subprocess.DEVNULL,
        stdout=child_fd,
        stderr=child_fd,
    )
    os.close(child_fd)
    pieces = [
        _ESCAPE.sub("", data.decode("utf-8", "replace"))
        for _, data in pty_chunks(main_fd, proc, 240)
    ]
    return proc.wait(60), pieces


def _states_while_drawing(pieces: list[str]) -> set[int]:
    """The states of rank 0's drawing that reached the terminal before rank 0 said it was
    done: drawn live, not once at the end."""
    seen: set[int] = set()
    for piece in pieces:
        if "[n0 r0] rank 0 done" in piece:
            break
        seen.update(int(n) for n in re.findall(rf"\[n0 r0\] [^\n]*state\W*?(\d+)/{STEPS}", piece))
    return seen


def _check(code: int, pieces: list[str], size: Optional[tuple[int, int]], logs: Path) -> None:
    output = "".join(pieces)
    assert code == 0, output[-3000:]
    columns, lines = (size[1], size[0]) if size else (0, 0)
    assert f"[n0 r0] stdout is a terminal: True, {columns}x{lines}" in output
    states = _states_while_drawing(pieces)
    # 40 states over 4 s, drawn a few times a second: many arrive while it runs (today: 1)
    assert len(states) >= 8, sorted(states)
    rank0 = (
        next(logs.rglob("rank_0/stdout.log")).read_text()
        + next(logs.rglob("rank_0/stderr.log")).read_text()
    )
    assert "\x1b" not in rank0 and "\r" not in rank0
    assert f"{STEPS}/{STEPS}" in rank0  # the region's last state, as a plain line
    assert "stdout is a terminal: True" in rank0 and "rank 0 done" in rank0


@pytest.mark.parametrize("size", list(PTY_SIZES.values()), ids=list(PTY_SIZES))
@pytest.mark.parametrize("kind", list(DRAWINGS))
def test_the_agent_on_a_terminal_draws_a_workers_region_live(
    tmp_path: Path, kind: str, size: Optional[tuple[int, int]]
) -> None:
    (tmp_path / "draw.py").write_text(HEAD + DRAWINGS[kind] + TAIL)
    argv = [sys.executable, "-m", "torchx_elastic.agent", "--nproc-per-node", "2"]
    argv += ["--log-dir", str(tmp_path / "logs"), "draw.py"]
    code, pieces = _on_a_pty(argv, tmp_path, size)
    _check(code, pieces, size, tmp_path / "logs")


@pytest.mark.parametrize(
    "kind,size",
    [
        ("rich-progress", PTY_SIZES["120x40"]),
        ("rich-progress", PTY_SIZES["unsized"]),
        ("rich-live-table", PTY_SIZES["120x40"]),
        ("tqdm-positions", PTY_SIZES["unsized"]),
    ],
)
def test_torchx_run_on_a_terminal_draws_a_workers_region_live(
    tmp_path: Path, kind: str, size: Optional[tuple[int, int]]
) -> None:
    (tmp_path / "draw.py").write_text(HEAD + DRAWINGS[kind] + TAIL)
    argv = [str(BIN / "torchx"), "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}"]
    argv += ["dist.ddp", "-j", "1x2", "--script", "draw.py"]
    code, pieces = _on_a_pty(argv, tmp_path, size)
    _check(code, [re.sub(r"draw/0 ", "", piece) for piece in pieces], size, tmp_path / "logs")
    first_screen = "".join(pieces).splitlines()
    # torch's banner under our label, never an empty labelled line
    assert not [line for line in first_screen if re.fullmatch(r".*\[torchx-elastic \w+\]\s*", line)]
    assert any("[torchx-elastic WARNING] Setting OMP_NUM_THREADS" in line for line in first_screen)


def test_without_a_terminal_workers_write_to_pipes(tmp_path: Path) -> None:
    (tmp_path / "draw.py").write_text(HEAD + DRAWINGS["rich-progress"] + TAIL)
    argv = [sys.executable, "-m", "torchx_elastic.agent", "--nproc-per-node", "2"]
    argv += ["--log-dir", str(tmp_path / "logs"), "draw.py"]
    done = subprocess.run(
        argv,
        cwd=tmp_path,
        env=one_node_port(argv, _env()),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "[n0 r0] stdout is not a terminal" in done.stdout
