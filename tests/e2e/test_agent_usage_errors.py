"""The agent's command-line errors: exit 1 (as torchrun's) with a message that says what is
accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_agent

pytestmark = [pytest.mark.slow, pytest.mark.torch_lines]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--nnodes", "two"],
            "--nnodes 'two': not a number of nodes (N or MIN:MAX, e.g. 2 or 1:4)",
        ),
        (
            ["--nnodes", "3:1"],
            "--nnodes '3:1': MIN nodes (3) is above MAX nodes (1) (N or MIN:MAX, e.g. 2 or 1:4)",
        ),
        (
            ["--nproc-per-node", "x"],
            "--nproc-per-node 'x' is not a whole number >= 1 (or auto, cpu, gpu)",
        ),
        (
            ["--rdzv-conf", "join_timeout"],
            "--rdzv-conf item 'join_timeout' is not KEY=VALUE (e.g. join_timeout=600)",
        ),
        (
            ["--rdzv-conf", "join_timeout=abc"],
            "--rdzv-conf join_timeout='abc': join_timeout must be a whole number of seconds > 0"
            " (e.g. join_timeout=600)",
        ),
        (
            ["--nnodes", "2", "--rdzv-endpoint", "localhost:0"],
            "--rdzv-endpoint 'localhost:0': port 0 (a free port) only works for a single node,"
            " but --nnodes is '2'; give the rank-0 node's port",
        ),
        (
            ["--nnodes", "2", "--rdzv-endpoint", "node0:http"],
            "rendezvous endpoint 'node0:http' has an invalid port 'http'; expected a number"
            " from 0 to 65535 (0 picks a free port, single node only)",
        ),
        (["--no-python", "-m"], "--no-python and -m cannot be used together"),
        (
            ["--no-retry-on", "Value Error"],
            "--no-retry-on 'Value Error': 'Value Error' is neither an exception class"
            " (ValueError, mypkg.ConfigError) nor an exit code (1-255)",
        ),
        (
            ["--no-retry-on", "ValueError,0"],
            "--no-retry-on 'ValueError,0': '0' is not the exit code of a failure (1-255)",
        ),
        (
            ["--no-retry-on", "ValueError,"],
            "--no-retry-on 'ValueError,': an empty entry; give exception classes and exit codes,"
            " comma-separated",
        ),
        (
            ["--event-log-handler", "kafka"],
            "--event-log-handler 'kafka' is not a handler registered in"
            " torch.distributed.elastic.events.handlers (e.g. null, console)",
        ),
    ],
)
def test_bad_flags_exit_1_and_say_what_is_accepted(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_agent(*args, "train.py", cwd=tmp_path)
    assert result.returncode == 1  # torchrun's exit code for a bad flag value
    assert f"torchx-elastic: error: {message}" in result.stderr
