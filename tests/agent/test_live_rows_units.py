"""The ranks' unfinished ``\\r`` lines kept in a file for local_cwd (``live_rows.py``): the
plain console writes them only when local_cwd names the file, and the file goes at the end."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.waiting import wait_until
from torchx_elastic.agent.console.output.display import PlainConsole, make_console
from torchx_elastic.agent.console.output.live_rows import LiveRowsFile
from torchx_elastic.agent.console.output.sinks import RankOutput, RankSink
from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.contract.live_rows import (
    LIVE_ROWS_ENV,
    LIVE_ROWS_FILE,
    LiveRow,
    read_rows,
    write_rows,
)


def _rows_become(path: Path, expected: list[LiveRow]) -> None:
    wait_until(
        lambda: read_rows(str(path)) == expected,
        what=f"the live rows {expected}",
        detail=lambda: read_rows(str(path)),
    )


def test_rows_round_trip_and_a_missing_or_foreign_file_has_none(tmp_path: Path) -> None:
    path = tmp_path / LIVE_ROWS_FILE
    assert read_rows(str(path)) == []
    rows = [LiveRow(0, "[n0 r0] ", " 45%|####5     | 45/100"), LiveRow(3, "", "é")]
    write_rows(str(path), rows)
    assert read_rows(str(path)) == rows
    assert [p.name for p in tmp_path.iterdir()] == [LIVE_ROWS_FILE]  # no temporary left
    path.write_text('{"not": "rows"}')
    assert read_rows(str(path)) == []


def test_a_ranks_redrawn_line_is_kept_until_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "live_rows.json"
    console = PlainConsole(
        RankActivity(),
        out=io.BytesIO(),
        err=io.BytesIO(),
        status_interval_s=0,
        live_rows=LiveRowsFile(str(path), interval_s=0.01),
    )
    ranks = [
        RankOutput(r, r, 0, str(tmp_path / f"{r}.out"), str(tmp_path / f"{r}.err")) for r in (0, 1)
    ]
    sink = RankSink(ranks, console)
    sink.feed(1, "stderr", b"\r 10%|#")
    sink.feed(1, "stderr", b"\r 20%|##")
    sink.feed(0, "stdout", b"epoch 0\rstep 3")  # no \r at its end: the text a terminal shows
    _rows_become(path, [LiveRow(0, "[n0 r0] ", "step 3"), LiveRow(1, "[n0 r1] ", " 20%|##")])
    sink.feed(1, "stderr", b"\r100%|###\n")  # the bar ends: a line, no more a row
    _rows_become(path, [LiveRow(0, "[n0 r0] ", "step 3")])
    sink.close()
    console.close()
    assert not path.exists()


def test_only_a_named_file_gets_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIVE_ROWS_ENV, raising=False)
    console = make_console("plain", RankActivity(), status_interval_s=0)
    assert isinstance(console, PlainConsole) and console._live_rows is None
    console.close()
    path = tmp_path / "rows.json"
    monkeypatch.setenv(LIVE_ROWS_ENV, str(path))
    console = make_console("plain", RankActivity(), status_interval_s=0)
    console.transient(2, "stdout", b"[n0 r2] ", [b"12/40"])
    _rows_become(path, [LiveRow(2, "[n0 r2] ", "12/40")])
    console.close()
    assert not path.exists()
