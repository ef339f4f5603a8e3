"""One view of a multi-node job's progress: the real ``torchx run -s local_cwd`` on a
terminal (a pty, rendered by ``pyte``) and without one."""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
from pathlib import Path

import pyte
import pytest

from tests.conftest import BIN, REPO, _env, run_torchx
from tests.pty_output import pty_chunks
from torchx_elastic.contract.job_progress import LINE_PREFIX

pytestmark = pytest.mark.slow

COLUMNS, ROWS = 160, 24
STEPS = 200
# "job ━━━━━━━ 120/200 of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120, ..."
BAR = re.compile(r"^job .*━.* (\d+)/200 of (\d+)/4 ranks on (\d+)/2 nodes, slowest r\d \(n\d\)")
JOB_LINE = re.compile(
    r"\[job progress\] (\d+)/200 \([\d.]+%\) of 4/4 ranks on 2/2 nodes,"
    r" slowest r(\d) \(n(\d)\) \d+, fastest r(\d) \(n(\d)\) \d+, [\d.]+ steps/s, ETA \w+"
)
# before node 1's ranks have reported (a busy machine), a line counts those that did:
# "of 2/4 ranks on 1/2 nodes", or "of 2/2 ranks" while node 1 published nothing yet
ANY_LINE = re.compile(
    r"\[job progress\] \d+/200 \([\d.]+%\) of [1-4]/[24] ranks on [12]/2 nodes,"
    r" slowest r\d \(n\d\) \d+, fastest r\d \(n\d\) \d+"
)


def _progress_script(workdir: Path) -> Path:
    script = workdir / "progress.py"
    shutil.copy(REPO / "examples" / "progress.py", script)
    return script


def _rows(screen: pyte.HistoryScreen) -> list[str]:
    """Everything the terminal shows or scrolled away: history first, then the screen."""
    history = [
        "".join(line[x].data for x in range(COLUMNS)).rstrip() for line in screen.history.top
    ]
    return history + [row.rstrip() for row in screen.display]


def _bars(rows: list[str]) -> list[str]:
    return [row for row in rows if BAR.search(row)]


def test_terminal_shows_one_live_bar_of_the_whole_job(tmp_path: Path) -> None:
    script = _progress_script(tmp_path)
    screen = pyte.HistoryScreen(COLUMNS, ROWS, history=10_000)
    stream = pyte.ByteStream(screen)
    main_fd, child_fd = pty.openpty()
    os.set_blocking(main_fd, False)
    env = _env({"TERM": "xterm-256color", "COLUMNS": str(COLUMNS), "LINES": str(ROWS)})
    env.pop("NO_COLOR", None)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        [str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "2x2",
         "--script", str(script), "--", "--steps", str(STEPS), "--step-s", "0.05",
         "--log-every", "10"],
        cwd=tmp_path,
        env=env,
        stdin=child_fd,
        stdout=child_fd,
        stderr=child_fd,
        start_new_session=True,
    )  # fmt: skip
    os.close(child_fd)
    mid_run: list[tuple[list[str], list[str]]] = []  # (bars, screen) while the job runs
    for _, data in pty_chunks(main_fd, proc, 240):
        stream.feed(data)
        display = [row.rstrip() for row in screen.display]
        bars = _bars(display)
        if bars and int(BAR.search(bars[0])[1]) < STEPS:  # type: ignore[index]
            mid_run.append((bars, display))
    assert proc.wait(30) == 0
    rows = _rows(screen)
    transcript = "\n".join(rows)

    # while the job ran: exactly one bar, at the bottom, counting the ranks of both nodes
    assert mid_run, transcript
    for bars, display in mid_run:
        assert len(bars) == 1, "\n".join(display)
        shown = [row for row in display if row]
        assert shown[-1] == bars[0], "\n".join(display)  # the lines scroll above it
    assert any(BAR.search(bars[0]).groups()[1:] == ("4", "2") for bars, _ in mid_run)  # type: ignore[union-attr]

    # log lines of both nodes scrolled above the bar, past the top of the screen
    log_rows = [r for r in rows if re.match(r"progress/[01] \[n[01] r[0-3]\] step \d+/200$", r)]
    assert len(log_rows) == 4 * STEPS // 10, transcript
    assert {r.split()[0] for r in log_rows} == {"progress/0", "progress/1"}
    assert len(screen.history.top) > 0

    # at the end: still one bar (none left behind in the scrollback), at 200/200 of 4 ranks
    bars = _bars(rows)
    assert len(bars) == 1, transcript
    assert BAR.search(bars[0]).groups() == ("200", "4", "2"), bars  # type: ignore[union-attr]
    assert "[job progress]" not in transcript  # the bar replaces the plain lines
    assert "Job finished: SUCCEEDED" in transcript
    print("\n".join(rows[-8:]))  # what the README shows


def test_without_a_terminal_one_job_wide_line_per_interval(tmp_path: Path) -> None:
    script = _progress_script(tmp_path)
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "2x2", "--script", str(script),
        "--", "--steps", str(STEPS), "--step-s", "0.05",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # before the first round, whichever agent waits says so (under load, replica 1 may be
    # up well before replica 0); the training's lines are node 0's
    status = [
        ln
        for ln in result.stderr.splitlines()
        if "[job progress]" in ln and "[job progress] waiting for nodes: " not in ln
    ]
    assert status, result.stderr
    # from the rank-0 node's agent only; the last counts the 4 ranks of both nodes
    for line in status:
        assert line.startswith(f"progress/0 {LINE_PREFIX}"), line
        assert ANY_LINE.search(line), line
    assert JOB_LINE.search(status[-1])[1] == "200", status  # type: ignore[index]
    assert "[n0 progress]" not in result.stderr and "[n1 progress]" not in result.stderr
    assert "\x1b[" not in "".join(status)
    # the figures of both nodes' ranks: slowest and fastest may be on either node
    nodes = {m[3] for m in map(JOB_LINE.search, status) if m} | {
        m[5] for m in map(JOB_LINE.search, status) if m
    }
    assert nodes <= {"0", "1"}
