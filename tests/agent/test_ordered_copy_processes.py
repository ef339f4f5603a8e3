"""The agent's stdout and stderr copied, in the order written, into one file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import _env
from torchx_elastic.contract import CONSOLE_COPY_ENV

PROGRAM = textwrap.dedent(
    """
    import logging, sys
    from torchx_elastic.agent.console.output.ordered_copy import copy_console_in_order
    copy_console_in_order()
    logging.basicConfig(format="log %(message)s")
    for i in range(3):
        print(f"err {i}", file=sys.stderr)
        sys.stdout.buffer.write(f"out {i}\\n".encode())
        sys.stdout.flush()
        logging.warning("warning %d", i)
    """
)


def _run(tmp_path: Path, copy: str | None) -> subprocess.CompletedProcess[str]:
    env = _env({CONSOLE_COPY_ENV: copy} if copy else None)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True
    )


def test_both_streams_land_in_the_copy_in_the_order_written(tmp_path: Path) -> None:
    copy = tmp_path / "copy.txt"
    done = _run(tmp_path, str(copy))
    order = [f"{kind} {i}" for i in range(3) for kind in ("err", "out", "log warning")]
    assert copy.read_text().splitlines() == order
    assert done.stdout.splitlines() == ["out 0", "out 1", "out 2"]
    assert [line for line in done.stderr.splitlines()] == [
        line for line in order if not line.startswith("out")
    ]


def test_without_the_variable_nothing_is_copied(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.stdout.splitlines() == ["out 0", "out 1", "out 2"]
    assert not list(tmp_path.iterdir())


def test_a_copy_that_cannot_be_opened_is_said_and_the_streams_work(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "copy.txt"
    done = _run(tmp_path, str(path))
    assert done.stderr.splitlines()[0] == (
        f"torchx-elastic: not copying the console to {path}: [Errno 2] No such file or"
        f" directory: '{path}'"
    )
    assert done.stdout.splitlines() == ["out 0", "out 1", "out 2"]
