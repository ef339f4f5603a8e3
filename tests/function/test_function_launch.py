"""A Python function as the workers: torchx_elastic.launcher.elastic_launch and
torchx_elastic.launch, with real gloo workers (the pytest process is the caller)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher import api as torch_launcher

import torchx_elastic
from tests.function import functions
from torchx_elastic.launcher import (
    AgentOptions,
    FunctionFailedError,
    LaunchConfig,
    elastic_launch,
)

pytestmark = pytest.mark.slow

METHODS = ["spawn", "fork"]


def config(tmp_path: Path, nproc: int = 2, **kwargs: Any) -> LaunchConfig:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        **kwargs,
    )


@pytest.mark.parametrize("method", METHODS)
def test_all_reduce_returns_every_ranks_value(
    tmp_path: Path, method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    handler_before = signal.getsignal(signal.SIGTERM)
    omp_before = os.environ.get("OMP_NUM_THREADS")
    results = elastic_launch(
        config(tmp_path, start_method=method, max_restarts=0), functions.all_reduce_rank
    )(10.0)
    assert results == {0: {"rank": 0.0, "sum": 30.0}, 1: {"rank": 1.0, "sum": 30.0}}
    out = capsys.readouterr().out
    assert "[n0 r0] sum on rank 0: 3.0" in out
    assert "[n0 r1] sum on rank 1: 3.0" in out
    assert signal.getsignal(signal.SIGTERM) == handler_before  # the caller's handler is back
    assert os.environ.get("OMP_NUM_THREADS") == omp_before  # torchrun's setting, not ours


def test_progress_of_a_function_reaches_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = AgentOptions(console="plain", status_interval_s=0.5)
    results = elastic_launch(config(tmp_path), functions.report_progress, options)(20)
    assert results == {0: 20, 1: 20}
    err = capsys.readouterr().err  # the agent's status lines go to stderr
    # the whole job's line once the agents exchanged progress, this node's line before that
    assert (
        "[job progress] 20/20 (100.0%) of 2/2 ranks on 1/1 nodes" in err
        or "[n0 progress] 20/20 (100.0%) of 2 ranks" in err
    ), err


def test_raise_on_rank_1_names_rank_exception_and_traceback(tmp_path: Path) -> None:
    with pytest.raises(FunctionFailedError) as caught:
        elastic_launch(config(tmp_path, max_restarts=0), functions.raise_on_rank_1)("17")
    error = caught.value
    assert isinstance(error, ChildFailedError)  # torch's launcher raises this: still caught
    assert error.rank == 1
    assert error.exception == "ValueError: bad batch 17"
    message = str(error).splitlines()
    assert message[0].startswith("raise_on_rank_1 failed on rank 1 (node 0, local rank 1, pid ")
    assert message[0].endswith("): ValueError: bad batch 17")
    assert message[1] == "Traceback (most recent call last):"
    assert 'in raise_on_rank_1\n    raise ValueError(f"bad batch {text}")' in str(error)
    assert "bootstrap" not in error.traceback  # the user's frames only, as python script.py
    assert set(error.failures) == {0, 1}  # rank 0 was stopped by the agent
    assert error.get_first_failure()[0] == 1
    assert f"logs of every rank: {tmp_path / 'logs'}" in str(error)


@pytest.mark.parametrize("method", METHODS)
def test_crash_with_a_restart_returns_the_second_attempts_results(
    tmp_path: Path, method: str
) -> None:
    results = torchx_elastic.launch(
        functions.crash_in_first_attempt,
        1,
        nproc_per_node=2,
        max_restarts=1,
        start_method=method,
        log_dir=str(tmp_path),
    )
    assert results == {0: (0, 1), 1: (1, 1)}


def test_same_dict_as_torchs_elastic_launch(tmp_path: Path) -> None:
    """The drop-in test: the same code through torch's launcher and through ours."""
    results = {}
    for name, launcher in (("torch", torch_launcher.elastic_launch), ("ours", elastic_launch)):
        cfg = config(tmp_path / name, max_restarts=0)
        results[name] = launcher(cfg, functions.all_reduce_rank)(2.0)
    assert (
        results["ours"]
        == results["torch"]
        == {
            0: {"rank": 0.0, "sum": 6.0},
            1: {"rank": 1.0, "sum": 6.0},
        }
    )


def test_unpicklable_return_value_names_rank_and_type(tmp_path: Path) -> None:
    with pytest.raises(FunctionFailedError) as caught:
        elastic_launch(config(tmp_path, nproc=1), functions.return_a_lock)()
    assert caught.value.exception == (
        "CallPicklingError: the return value of rank 0 (_thread.lock object) cannot be pickled"
        " to send it back to the caller: cannot pickle '_thread.lock' object; return a value"
        " that pickles (numbers, strings, lists, dicts, tensors, ...)"
    )


def test_a_rank_that_exits_early_returns_none(tmp_path: Path) -> None:
    assert elastic_launch(config(tmp_path), functions.exit_early)() == {0: None, 1: None}


def test_launch_from_a_thread_as_a_notebook_would(tmp_path: Path) -> None:
    box: dict[str, Any] = {}

    def run() -> None:
        box["results"] = torchx_elastic.launch(
            functions.all_reduce_rank, 1.0, nproc_per_node=2, log_dir=str(tmp_path)
        )

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=280)
    assert box["results"] == {0: {"rank": 0.0, "sum": 3.0}, 1: {"rank": 1.0, "sum": 3.0}}


def test_program_entrypoint_returns_none_per_rank(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    results = elastic_launch(config(tmp_path), sys.executable)(str(script))
    assert results == {0: None, 1: None}
