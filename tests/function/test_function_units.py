"""Function launch without workers: bad input, pickling errors, the config mapping, the
caller's exception. Every user-facing message is read here."""

from __future__ import annotations

import json
import pickle
import sys
import threading
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import torchx_elastic
from tests.function import functions
from torchx_elastic.agent.config.launch import WorkerCommand
from torchx_elastic.agent.function.agent_run import Outcome, agent_config
from torchx_elastic.agent.function.launch import (
    entrypoint_name,
    program_target,
    raise_for_outcome,
)
from torchx_elastic.agent.function.options import AgentOptions
from torchx_elastic.agent.workers import function_call
from torchx_elastic.contract import RANK_ERROR_FILE, RESTART_COUNT_ENV
from torchx_elastic.launcher import (
    CallPicklingError,
    FunctionFailedError,
    LaunchConfig,
    elastic_launch,
    launch,
)


def config(tmp_path: Path, **kwargs: object) -> LaunchConfig:
    settings: dict[str, object] = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": 2,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "localhost:0",
        "logs_specs": DefaultLogsSpecs(log_dir=str(tmp_path)),
    }
    settings.update(kwargs)
    return LaunchConfig(**settings)  # type: ignore[arg-type]


def test_package_attribute_is_the_short_form() -> None:
    assert torchx_elastic.launch is launch


def test_lambda_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    with pytest.raises(CallPicklingError) as caught:
        elastic_launch(config(tmp_path), lambda: 1)()
    message = str(caught.value)
    assert message.startswith(
        "the function test_lambda_is_refused_before_any_worker_starts.<locals>.<lambda>"
        " (function object) cannot be pickled to send it to the workers:"
    )
    assert message.endswith(
        "A worker gets the function and its arguments by pickle: use a function defined at"
        " the top level of a module or script (not a lambda or a nested function) and"
        " arguments that pickle (no open files, locks, generators, sockets)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_unpicklable_argument_names_its_position_and_type(tmp_path: Path) -> None:
    with pytest.raises(
        CallPicklingError,
        match=r"^argument 1 of raise_on_rank_1 \(_thread\.lock"
        r" object\) cannot be pickled to send it to the workers: cannot pickle",
    ):
        elastic_launch(config(tmp_path), functions.raise_on_rank_1)("x", threading.Lock())


def test_result_file_of_an_unpicklable_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(CallPicklingError) as caught:
        function_call._write_result(str(tmp_path / "r.pkl"), (i for i in range(2)))
    assert str(caught.value) == (
        "the return value of rank 3 (generator object) cannot be pickled to send it back to"
        " the caller: cannot pickle 'generator' object; return a value that pickles (numbers,"
        " strings, lists, dicts, tensors, ...)"
    )


def test_call_file_round_trip_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call_file = tmp_path / "call.pkl"
    function_call.write_call(function_call.make_call(divmod, (17, 5)), str(call_file))
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv(RESTART_COUNT_ENV, "2")
    function_call.run_call_file(str(call_file))
    assert function_call.read_results(str(call_file), 2) == {4: (3, 2)}
    assert function_call.read_results(str(call_file), 1) == {}


def test_a_call_that_does_not_unpickle_in_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = function_call.Call({}, b"cnowhere\nf\n.")  # pickle of nowhere.f
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(CallPicklingError) as caught:
        function_call._unpickle_call(call)
    assert str(caught.value) == (
        "rank 1 cannot unpickle the function or its arguments: ModuleNotFoundError: No module"
        " named 'nowhere'. A worker started by spawn imports them by name, as multiprocessing"
        " does: define them in a module the workers can import, or in the main script (its"
        ' launch under `if __name__ == "__main__":`); what a notebook or the REPL defines'
        " cannot be imported"
    )


def test_a_launch_while_a_worker_imports_the_main_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(function_call, "importing_main", True)
    with pytest.raises(RuntimeError) as caught:
        function_call.make_call(divmod, (1, 2))
    assert str(caught.value) == (
        "a function launch was started while a worker was importing the caller's main"
        ' script; start the launch under `if __name__ == "__main__":` in that script (as'
        " with multiprocessing's spawn)"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nproc_per_node": 0}, "nproc_per_node=0 is not a whole number >= 1"),
        (
            {"nnodes": "3:2"},
            "nnodes='3:2': MIN nodes (3) is above MAX nodes (2) (N or MIN:MAX, e.g. 2 or 1:4)",
        ),
        ({"nnodes": "x"}, "nnodes='x': not a number of nodes (N or MIN:MAX, e.g. 2 or 1:4)"),
        (
            {"nnodes": "0:2"},
            "nnodes='0:2': MIN nodes must be at least 1 (N or MIN:MAX, e.g. 2 or 1:4)",
        ),
        (
            {"start_method": "thread"},
            "start_method='thread' is not a start method: fork-server (ours, with a hyphen:"
            " workers forked from a process that imported torch once) or torchrun's spawn,"
            " fork, forkserver (as torchrun means them)",
        ),
        ({"console": "fancy"}, "console='fancy' is not one of auto, plain, live"),
    ],
)
def test_short_form_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        launch(divmod, 1, 2, **kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_short_form_nproc_must_be_an_int() -> None:
    with pytest.raises(TypeError, match=r"^nproc_per_node='2' is not a whole number >= 1$"):
        launch(divmod, 1, 2, nproc_per_node="2")  # type: ignore[arg-type]


def test_tee_option() -> None:
    with pytest.raises(ValueError) as caught:
        AgentOptions(tee=5)
    assert str(caught.value) == (
        "tee=5 is not 0 (no worker output on the console), 1 (stdout), 2 (stderr) or 3 (both)"
    )


def test_entrypoint_must_be_a_function_or_a_program(tmp_path: Path) -> None:
    with pytest.raises(TypeError) as caught:
        elastic_launch(config(tmp_path), 42)()  # type: ignore[arg-type]
    assert str(caught.value) == "entrypoint 42 is neither a function nor a program name (str)"


def test_empty_endpoint_is_localhost_as_torchs(tmp_path: Path) -> None:
    agent = agent_config(
        config(tmp_path, rdzv_endpoint=""), AgentOptions(), WorkerCommand(()), "/l", "r"
    )
    assert str(agent.rdzv_endpoint) == "localhost:29400"


def test_entrypoint_names_and_program_targets() -> None:
    assert entrypoint_name(functions.exit_early, ()) == "exit_early"
    assert entrypoint_name(sys.executable, ["-u", "train.py"]) == "train.py"
    assert entrypoint_name("echo", ["hi"]) == "echo"
    assert program_target(sys.executable, ["train.py", 1]).target == ("train.py", "1")
    assert program_target(sys.executable, ["-m", "pkg.mod", "x"]).target == (
        "-m",
        "pkg.mod",
        "x",
    )
    assert program_target("echo", ["hi"]).target == ("--exec", "echo", "hi")


def test_launch_config_maps_onto_the_agent_config(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        max_restarts=2,
        role="trainer",
        log_line_prefix_template="[${role_name}${rank}]: ",
        monitor_interval=0.5,
        shutdown_timeout=7,
    )
    agent = agent_config(
        cfg, AgentOptions(hang_timeout_s=60), WorkerCommand(("--call", "c.pkl")), "/logs", "r1"
    )
    assert (agent.min_nodes, agent.max_nodes, agent.nproc_per_node) == (1, 1, 2)
    assert (agent.run_id, agent.role, agent.rdzv_backend) == ("r1", "trainer", "c10d")
    assert str(agent.rdzv_endpoint) == "localhost:0"
    assert agent.rdzv_configs == {"timeout": 900}
    assert agent.worker.entrypoint == sys.executable
    assert agent.worker == WorkerCommand(("--call", "c.pkl"))  # in the agent's interpreter
    assert (agent.max_restarts, agent.monitor_interval_s, agent.shutdown_timeout_s) == (2, 0.5, 7.0)
    assert agent.console.prefix_template == "[${role_name}${rank}]: "  # torch's syntax, as given
    assert (agent.hang_timeout_s, agent.log_dir) == (60, "/logs")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"rdzv_endpoint": "localhost:99999"},
            "rendezvous endpoint 'localhost:99999' has an invalid port '99999'; expected a"
            " number from 0 to 65535 (0 picks a free port, single node only)"
            " (LaunchConfig.rdzv_endpoint; for one node: rdzv_backend='c10d',"
            " rdzv_endpoint='localhost:0')",
        ),
        (
            {"max_nodes": 2},
            "rdzv_endpoint 'localhost:0': port 0 (a free port) only works for a single node,"
            " but max_nodes is 2; give the rank-0 node's port",
        ),
        (
            {"rdzv_backend": "static", "rdzv_endpoint": "localhost:0"},
            "rdzv_endpoint 'localhost:0': the static backend needs a fixed port",
        ),
        (
            {"rdzv_backend": "static", "rdzv_endpoint": "localhost:29511"},
            "rdzv_backend 'static' needs this node's rank in rdzv_configs['rank']",
        ),
    ],
)
def test_bad_launch_configs(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        agent_config(config(tmp_path, **kwargs), AgentOptions(), WorkerCommand(()), "/l", "r")
    assert str(caught.value) == message


def test_failed_run_becomes_one_child_failed_error(tmp_path: Path) -> None:
    error_file = tmp_path / RANK_ERROR_FILE
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "KeyError: 'lr'",
                    "extraInfo": {
                        "py_callstack": "Traceback ...\nKeyError: 'lr'\n",
                        "timestamp": "1700000000",
                    },
                }
            }
        )
    )
    root = {
        "rank": 3,
        "node": 1,
        "local_rank": 1,
        "pid": 77,
        "exitcode": 1,
        "how": "exit code 1",
        "message": "KeyError: 'lr'",
        "traceback": "Traceback ...\nKeyError: 'lr'\n",
        "error_path": str(error_file),
    }
    victim = {
        **root,
        "rank": 2,
        "local_rank": 0,
        "pid": 76,
        "exitcode": -15,
        "how": "signal SIGTERM",
        "message": "",
        "traceback": "",
        "error_path": "",
    }
    outcome = Outcome(1, {"state": "FAILED", "root_cause": root, "victims": [victim]})
    with pytest.raises(FunctionFailedError) as caught:
        raise_for_outcome(outcome, "train", "/logs/run")
    error = caught.value
    assert isinstance(error, ChildFailedError)
    assert (error.rank, error.node, error.exception) == (3, 1, "KeyError: 'lr'")
    assert str(error) == (
        "train failed on rank 3 (node 1, local rank 1, pid 77): KeyError: 'lr'\n"
        "Traceback ...\n"
        "KeyError: 'lr'\n"
        "also failed (see the root-cause report above): ranks 2\n"
        "logs of every rank: /logs/run"
    )
    assert sorted(error.failures) == [2, 3]
    assert error.failures[3].exitcode == 1 and error.failures[2].exitcode == -15
    assert error.get_first_failure()[0] == 3
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.rank, sorted(copy.failures)) == (str(error), 3, [2, 3])


def test_a_rank_killed_by_a_signal_shows_its_stderr(tmp_path: Path) -> None:
    root = {
        "rank": 0,
        "node": 0,
        "local_rank": 0,
        "pid": 9,
        "exitcode": -9,
        "how": "signal SIGKILL",
        "message": "",
        "traceback": "",
        "error_path": "",
        "stderr_tail": ["loading", "oom?"],
    }
    with pytest.raises(FunctionFailedError) as caught:
        raise_for_outcome(Outcome(1, {"state": "FAILED", "root_cause": root}), "f", "/l")
    assert str(caught.value) == (
        "f failed on rank 0 (node 0, local rank 0, pid 9): signal SIGKILL\n"
        "last lines of rank 0's stderr (signal SIGKILL):\n"
        "  loading\n"
        "  oom?\n"
        "logs of every rank: /l"
    )


def test_a_failure_without_a_failed_worker() -> None:
    with pytest.raises(RuntimeError) as caught:
        raise_for_outcome(Outcome(1, {"state": "FAILED"}), "f", "/l")
    assert str(caught.value) == (
        "the launch of f failed (exit code 1) but no worker did; see the agent's messages"
        " above and the logs in /l"
    )


def test_a_stopped_run_raises_the_signal() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    with pytest.raises(SignalException, match=r"^the launch of f was stopped by SIGTERM$"):
        raise_for_outcome(Outcome(143, {"state": "STOPPED"}), "f", "/l")
    with pytest.raises(KeyboardInterrupt):
        raise_for_outcome(Outcome(130, {"state": "STOPPED"}), "f", "/l")


def test_the_command_line_and_launch_fn_build_the_same_config() -> None:
    """One typed config from either front-end: the same options give the same AgentConfig
    (but what the workers run: a script here, the call of a function there)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    from torchx_elastic.agent.config.cli import build_parser
    from torchx_elastic.agent.config.launch import config_from_args

    flags = [
        *("--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d"),
        *("--rdzv-endpoint", "h:29500", "--rdzv-id", "j", "--max-restarts", "3"),
        *("--start-method", "spawn", "--log-dir", "/l", "--role", "r"),
        *("--monitor-interval", "0.5", "--shutdown-timeout", "7"),
    ]
    from_cli = config_from_args(build_parser().parse_args([*flags, "train.py"]))
    launch_config = LaunchConfig(
        min_nodes=1,
        max_nodes=2,
        nproc_per_node=2,
        rdzv_backend="c10d",
        rdzv_endpoint="h:29500",
        run_id="j",
        max_restarts=3,
        start_method="spawn",
        role="r",
        monitor_interval=0.5,
        shutdown_timeout=7,
    )
    from_function = agent_config(launch_config, AgentOptions(), WorkerCommand(("f",)), "/l", "j")
    assert dataclasses.replace(from_function, worker=from_cli.worker) == from_cli
