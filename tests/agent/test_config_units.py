"""The command line -> AgentConfig, as torchrun's get_args_parser -> config_from_args."""

from __future__ import annotations

import argparse
import os
import sys

import pytest
from torch.distributed.elastic.multiprocessing.api import Std

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import (
    AgentConfig,
    UsageError,
    WorkerCommand,
    apply_process_environment,
    config_from_args,
)
from torchx_elastic.agent.console.output.sinks import format_prefix
from torchx_elastic.agent.workers import bootstrap
from torchx_elastic.contract import PREFIX_TEMPLATE_ENV, RANK0_ENV, SHUTDOWN_TIMEOUT_ENV
from torchx_elastic.contract.agent_args import FORK_SERVER


def config(*argv: str) -> AgentConfig:
    return config_from_args(build_parser().parse_args([*argv, "train.py", "--lr", "1"]))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PET_") or name in (
            "OMP_NUM_THREADS",
            PREFIX_TEMPLATE_ENV,
            SHUTDOWN_TIMEOUT_ENV,
            "PYTHON_EXEC",
        ):
            monkeypatch.delenv(name)


def test_defaults_are_torchruns_one_node_on_a_free_port() -> None:
    c = config()
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node) == (1, 1, 1)
    if compat.torchrun_defaults()["master_port"] is None:  # torchrun from torch 2.5 on
        assert (c.rdzv_backend, str(c.rdzv_endpoint)) == ("c10d", "localhost:0")
        assert c.run_id != "none"  # a fresh id, as torchrun's
    else:  # torch 2.4's torchrun: --master-port 29500, static rendezvous, run id "none"
        assert (c.rdzv_backend, str(c.rdzv_endpoint), c.run_id) == (
            "static",
            "127.0.0.1:29500",
            "none",
        )
    assert c.worker == bootstrap_command("train.py", "--lr", "1")


def bootstrap_command(*target: str) -> WorkerCommand:
    return WorkerCommand(target)  # through the bootstrap, in the agent's own interpreter


def test_a_worker_runs_the_bootstrap_in_the_agents_interpreter_or_python_exec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = config()
    assert c.worker.entrypoint == sys.executable
    assert bootstrap.command_args(c.worker.python_exec) == ("-m", bootstrap.__name__)
    monkeypatch.setenv("PYTHON_EXEC", "/usr/bin/python3")
    c = config()
    assert (c.worker.entrypoint, c.worker.target) == ("/usr/bin/python3", ("train.py", "--lr", "1"))
    run_bootstrap = bootstrap.command_args(c.worker.python_exec)
    assert run_bootstrap[0] == "-c" and run_bootstrap[2] == bootstrap.PACKAGE_FOLDER


def test_both_spellings_and_short_flags() -> None:
    rdzv = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29500")
    a = config(*rdzv, "--nproc-per-node", "2", "--max-restarts", "3", "-r", "3", "-t", "1")
    b = config(
        *rdzv, "--nproc_per_node", "2", "--max_restarts", "3", "--redirects", "3", "--tee", "1"
    )
    assert a == b  # every field, not a few: one spelling must not lose what the other keeps
    assert (a.nproc_per_node, a.max_restarts, a.max_nodes) == (2, 3, 2)
    assert a.console.streams == Std.OUT


def test_every_flag_reads_its_pet_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    monkeypatch.setenv("PET_NO_PYTHON", "1")
    monkeypatch.setenv("PET_STANDALONE", "1")
    c = config("--rdzv-backend", "static", "--rdzv-endpoint", "node0:1")
    assert (c.nproc_per_node, c.max_restarts) == (3, 2)
    assert c.worker.target[:2] == ("--exec", "train.py")  # a .sh runs as itself
    assert c.rdzv_backend == "c10d" and str(c.rdzv_endpoint) == "localhost:0"


def test_pet_module_and_flag_beats_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_MODULE", "1")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    c = config("--nproc-per-node", "2")
    assert c.worker.target[:2] == ("-m", "train.py")
    assert c.nproc_per_node == 2


def test_pet_switch_that_is_not_0_or_1_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_STANDALONE", "yes")
    with pytest.raises(ValueError, match=r"PET_STANDALONE='yes' is not 0 or 1"):
        build_parser()


def test_static_rendezvous_from_node_rank_master_addr_and_port() -> None:
    c = config(
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0", "--master-port", "1234"
    )
    assert c.rdzv_backend == "static"
    assert str(c.rdzv_endpoint) == "node0:1234"
    assert c.rdzv_configs["rank"] == 1  # an int: torch's static handler compares it with 0
    assert (c.master_addr, c.master_port) == ("node0", 1234)


def test_static_rendezvous_rank_from_rdzv_conf_is_an_int() -> None:
    c = config(
        "--nnodes",
        "2",
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        "n0:29500",
        "--rdzv-conf",
        "rank=1",
    )
    assert c.rdzv_configs["rank"] == 1


def test_static_multi_node_defaults_to_torchruns_master() -> None:
    c = config("--nnodes", "2")
    assert (c.rdzv_backend, str(c.rdzv_endpoint)) == ("static", "127.0.0.1:29500")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is not in 0..1"),
        (
            ["--rdzv-backend", "static", "--rdzv-endpoint", "localhost:0"],
            "--rdzv-backend static needs a fixed port",
        ),
        (["--nproc-per-node", "gpu"], "--nproc-per-node gpu: Cuda is not available."),
        (["--nproc-per-node", "many"], "--nproc-per-node 'many' is not a whole number >= 1"),
        (["--max-restarts", "-1"], "--max-restarts -1 is negative"),
        (["--spares", "-1"], "--spares -1 is negative; give 0 or more"),
        (["--local-ranks-filter", "a,b"], "--local_ranks_filter 'a,b': must be a comma"),
        (["-r", "7"], "--redirects '7' is not 0-3 or LOCAL_RANK:0-3"),
        (["--numa-binding", "node"], "--numa-binding node: NUMA binding is not supported"),
    ],
)
def test_bad_values_are_usage_errors(argv: list[str], message: str) -> None:
    if argv == ["--nproc-per-node", "gpu"]:
        import torch

        if torch.cuda.is_available():
            pytest.fail("this test needs a machine without a GPU")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
        config(*argv)


def test_redirects_and_tee_per_local_rank() -> None:
    c = config("--nproc-per-node", "2", "-r", "0:3,1:1", "-t", "0:1")
    assert c.console.streams == {0: Std.OUT, 1: Std.ERR}


def prefix_of(c: AgentConfig, node: int, rank: int, local_rank: int) -> str:
    return format_prefix(c.console.prefix_template, node, rank, local_rank, "trainer", "n7")


def test_torchelastic_log_line_prefix_template(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFIX_TEMPLATE_ENV, "[${role_name}:${rank}:$local_rank@${hostname}]")
    assert prefix_of(config(), 1, 5, 1) == "[trainer:5:1@n7]"
    # the flag wins over the variable (torchrun 2.14+), in either syntax
    assert prefix_of(config("--log-line-prefix-template", "<{rank}> "), 1, 5, 1) == "<5> "
    flag = config("--log-line-prefix-template", "${hostname}:${rank}: ")
    assert prefix_of(flag, 1, 5, 1) == "n7:5: "


def test_torchrun_prefix_template_is_filled_in_as_torchs_string_template() -> None:
    # torch's safe_substitute: unknown fields stay as written, $$ is $
    assert prefix_of(config("--log-line-prefix-template", "${node}$$${rank} "), 0, 3, 1) == (
        "${node}$3 "
    )
    assert prefix_of(config("--log-line-prefix-template", "{hostname}/{node}> "), 2, 3, 1) == (
        "n7/2> "
    )


def test_shutdown_timeout_from_flag_or_torch_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config().shutdown_timeout_s == 30
    monkeypatch.setenv(SHUTDOWN_TIMEOUT_ENV, "7")
    assert config().shutdown_timeout_s == 7
    assert config("--shutdown-timeout", "3").shutdown_timeout_s == 3


def test_omp_num_threads_is_1_with_torchruns_warning_for_several_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warnings: list[str] = []
    apply_process_environment(config("--nproc-per-node", "1"), warnings.append)
    assert "OMP_NUM_THREADS" not in os.environ and warnings == []
    apply_process_environment(config("--nproc-per-node", "2"), warnings.append)
    assert os.environ["OMP_NUM_THREADS"] == "1"
    assert len(warnings) == 1
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in warnings[0]
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    apply_process_environment(config("--nproc-per-node", "2"), warnings.append)
    assert os.environ["OMP_NUM_THREADS"] == "4" and len(warnings) == 1


def test_run_path_wins_over_no_python() -> None:
    c = config("--run-path", "--no-python")
    assert c.worker.target == ("train.py", "--lr", "1")


def test_unknown_start_method_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--start-method", "threads", "x.py"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'threads'" in capsys.readouterr().err


def test_parser_is_read_once_into_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [
        *("--nnodes", "1:3", "--nproc-per-node", "3", "--rdzv-backend", "c10d"),
        *("--rdzv-endpoint", "n0:29501", "--rdzv-id", "job7", "--max-restarts", "2"),
        *("--monitor-interval", "0.5", "--start-method", "spawn", "--role", "trainer"),
        *("--log-dir", "/tmp/logs", "--redirects", "3", "--tee", "2"),
        *("--exit-barrier-timeout", "12"),
        *("--event-log-handler", "console", "--hang-timeout-s", "60", "--console", "plain"),
        *("train.py", "--lr", "1"),
    ]
    args = build_parser().parse_args(argv)

    def parse_again(*_: object, **__: object) -> None:
        raise AssertionError("config_from_args parsed a command line again")

    # below this line nothing sees argparse: the config comes from the namespace alone, and
    # every value given on the command line is in it
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_again)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_again)
    c = config_from_args(args)
    assert not any(isinstance(v, argparse.Namespace) for v in vars(c).values())
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node, c.role) == (1, 3, 3, "trainer")
    assert (c.rdzv_backend, str(c.rdzv_endpoint), c.run_id) == ("c10d", "n0:29501", "job7")
    assert (c.max_restarts, c.monitor_interval_s, c.start_method) == (2, 0.5, "spawn")
    assert (c.log_dir, c.exit_barrier_timeout_s, c.hang_timeout_s) == ("/tmp/logs", 12, 60)
    assert (c.console.mode, c.console.streams, c.event_log_handler) == (
        "plain",
        Std.ERR,
        "console",
    )
    assert c.worker == bootstrap_command("train.py", "--lr", "1")


def test_the_default_start_method_is_the_fork_server_and_torchrun_values_are_kept() -> None:
    assert config().start_method == FORK_SERVER
    for method in ("spawn", "fork", "forkserver"):
        assert config("--start-method", method).start_method == method


def test_every_bad_rdzv_conf_value_is_one_line_naming_key_value_and_what_is_accepted() -> None:
    conf = "join_timeout=abc,read_timeout=0,is_host=maybe,store_type=etcd,last_call_timeout=1.5"
    with pytest.raises(UsageError) as error:
        config(
            "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-conf", conf
        )
    assert str(error.value).splitlines() == [
        "--rdzv-conf join_timeout='abc': join_timeout must be a whole number of seconds > 0"
        " (e.g. join_timeout=600)",
        "--rdzv-conf read_timeout='0': read_timeout must be a whole number of seconds > 0"
        " (e.g. read_timeout=600)",
        "--rdzv-conf is_host='maybe': is_host must be true or false",
        "--rdzv-conf store_type='etcd': store_type must be tcp or file",
        "--rdzv-conf last_call_timeout='1.5': last_call_timeout must be a whole number of"
        " seconds > 0 (e.g. last_call_timeout=600)",
    ]


def test_rdzv_conf_values_torch_accepts_and_unknown_keys_pass_through() -> None:
    conf = "join_timeout=60,is_host=True,store_type=tcp,x=${app_id}"
    c = config(
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-conf", conf
    )
    assert c.rdzv_configs == {
        "join_timeout": "60",
        "is_host": "True",
        "store_type": "tcp",
        "x": "${app_id}",
        "timeout": 900,  # torch's LaunchConfig default, which torchrun's rendezvous gets too
    }


def test_under_torchx_the_omp_warning_waits_for_node_0(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torchx_elastic.agent.config.launch import OMP_WARNING
    from torchx_elastic.agent.supervision.launcher import warn_on_node0

    monkeypatch.setenv(RANK0_ENV, "127.0.0.1")
    warnings: list[str] = []
    deferred = apply_process_environment(config("--nproc-per-node", "2"), warnings.append)
    assert warnings == [] and deferred == OMP_WARNING and os.environ["OMP_NUM_THREADS"] == "1"
    rounds: list[tuple[object, int, int]] = []
    for first_rank, printed in ((0, 1), (1, 0)):
        caplog.clear()
        listener = warn_on_node0(OMP_WARNING, lambda *r: rounds.append(r))
        listener("store", first_rank, 2)
        listener("store", 0, 2)  # a later round: never again
        assert sum(OMP_WARNING in r.getMessage() for r in caplog.records) == printed
    assert len(rounds) == 4


def test_print_completion_prints_shtabs_script_for_the_agent_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--print-completion", "bash"])
    assert done.value.code == 0
    script = capsys.readouterr().out
    assert "_shtab_torchx_elastic_agent" in script  # shtab's names for the command
    assert "--log-line-prefix-template" in script and "--nproc-per-node" in script


def test_print_completion_without_shtab_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "shtab", None)  # as torchrun: exit 1, what to install
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--print_completion", "zsh"])
    assert done.value.code == 1
    assert capsys.readouterr().err == (
        "--print_completion requires the 'shtab' package: pip install shtab\n"
    )
