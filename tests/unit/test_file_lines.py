"""follow_lines: whole lines of files that are still being written."""

from __future__ import annotations

import threading
from pathlib import Path

from torchx_elastic.contract import STDERR_FILE, STDOUT_FILE
from torchx_elastic.schedulers.file_lines import follow_lines


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    out, err = tmp_path / STDOUT_FILE, tmp_path / STDERR_FILE
    out.write_bytes(b"one\ntw")
    finished = threading.Event()
    lines = follow_lines([str(out), str(err)], finished.is_set, poll_s=0.01)
    assert next(lines) == "one\n"

    def finish_writing() -> None:
        err.write_text("warn\n")
        with out.open("ab") as f:
            f.write("o \u2713".encode()[:-1])  # a UTF-8 character cut in two
            f.flush()
            f.write("o \u2713".encode()[-1:] + b"\nlast")
        finished.set()

    threading.Timer(0.05, finish_writing).start()
    rest = list(lines)
    assert sorted(rest) == sorted(["warn\n", "two \u2713\n", "last\n"])


def test_files_that_never_appear_end_when_finished(tmp_path: Path) -> None:
    assert list(follow_lines([str(tmp_path / "none.log")], lambda: True)) == []


def test_undecodable_bytes_are_replaced(tmp_path: Path) -> None:
    path = tmp_path / STDOUT_FILE
    path.write_bytes(b"ok \xff\n")
    assert list(follow_lines([str(path)], lambda: True)) == ["ok \ufffd\n"]
