"""local_cwd's live region on a terminal (``job_bar.py``): the ranks' unfinished lines above
the job bar, labelled as their lines are, and a terminal that reports no size."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios
from pathlib import Path

from rich.console import Console, Group

from torchx_elastic.contract.live_rows import LiveRow, write_rows
from torchx_elastic.schedulers.job_bar import _row_text, live_rows, terminal_size


def test_a_pty_without_a_size_has_none_and_one_with_a_size_has_it() -> None:
    main_fd, child_fd = pty.openpty()
    try:
        assert terminal_size(child_fd) is None  # 0x0: drawn as rich's 80 columns
        fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        assert terminal_size(child_fd) == os.terminal_size((100, 30))
    finally:
        os.close(main_fd)
        os.close(child_fd)
    read_end, write_end = os.pipe()
    assert terminal_size(read_end) is None  # not a terminal
    os.close(read_end)
    os.close(write_end)


def test_each_replicas_rows_with_its_label(tmp_path: Path) -> None:
    first, second, missing = (str(tmp_path / name) for name in ("a.json", "b.json", "c.json"))
    write_rows(first, [LiveRow(0, "[n0 r0] ", "10%"), LiveRow(1, "[n0 r1] ", "20%")])
    write_rows(second, [LiveRow(2, "[n1 r2] ", "30%")])
    files = [("ddp/0", first), ("ddp/1", second), ("ddp/2", missing)]
    assert live_rows(files) == [
        ("ddp/0", LiveRow(0, "[n0 r0] ", "10%")),
        ("ddp/0", LiveRow(1, "[n0 r1] ", "20%")),
        ("ddp/1", LiveRow(2, "[n1 r2] ", "30%")),
    ]


def test_a_row_is_one_screen_row_in_the_lines_own_form() -> None:
    """As the bar draws them: in a group, each cut to the terminal's width."""
    rows = Group(
        _row_text("ddp/0", LiveRow(0, "[n0 r0] ", "epoch 1: " + "#" * 60)),
        _row_text("ddp/1", LiveRow(1, "[n1 r1] ", "\x1b[31mred\x1b[0m 5/9")),
    )
    out = io.StringIO()
    Console(file=out, width=40, force_terminal=True, color_system="standard").print(rows)
    assert out.getvalue().startswith("\x1b[32mddp/0\x1b[0m [n0 r0] epoch 1: ####")  # torchx's green
    assert "\x1b[31mred\x1b[0m 5/9" in out.getvalue()  # the rank's own colours
    plain = Console(file=io.StringIO(), width=40)
    with plain.capture() as captured:
        plain.print(rows)
    assert captured.get().splitlines() == [
        "ddp/0 [n0 r0] epoch 1: ################…",
        "ddp/1 [n1 r1] red 5/9",
    ]
