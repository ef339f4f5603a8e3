"""The contract module: each of its names is spelled once, it needs nothing but the standard
library, and each file it names reads back what its writer wrote."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchx_elastic
from torchx_elastic import contract
from torchx_elastic.contract import events
from torchx_elastic.contract.agent_args import (
    FORK_SERVER,
    FORKSERVER,
    START_METHODS,
    StartMethodError,
    check_start_method,
    parse_node_range,
)
from torchx_elastic.contract.error_file import read_error_file, write_error_file

PACKAGE = Path(torchx_elastic.__file__).parent
CONTRACT = PACKAGE / "contract" / "__init__.py"
REPO = PACKAGE.parent


def _literals() -> dict[str, str]:
    literals = {
        name: value
        for name, value in vars(contract).items()
        if name.isupper() and isinstance(value, str)
    }
    return {**literals, "FORK_SERVER": FORK_SERVER}


def _strings(path: Path) -> set[str]:
    """The string constants of a module's code (docstrings aside: they are text, not
    literals the code relies on); the literal parts of f-strings count."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def test_each_contract_literal_is_spelled_once_in_the_package() -> None:
    literals = _literals()
    assert {
        "LAUNCHER_PID_ENV",
        "ERROR_FILE_ENV",
        "JOB_PROGRESS_FILE",
        "PROGRESS_KEY_PREFIX",
    } <= set(literals)
    strings = {
        path: _strings(path)
        for path in PACKAGE.rglob("*.py")
        if CONTRACT.parent not in path.parents
    }
    repeated = {
        f"{path.relative_to(PACKAGE)}: {name} ({value!r})"
        for path, found in strings.items()
        for name, value in literals.items()
        if value in found
    }
    assert repeated == set(), "import these names from torchx_elastic.contract"


RESULTS = REPO / "bench" / "results"  # what bench/run.py writes (git ignores it)


def test_the_tests_and_benchmarks_import_our_names_too() -> None:
    # torch's own variables (TORCHELASTIC_*) stay spelled where a test plays torchrun or a
    # user's script (the torchrun compatibility tests, the workers' scripts, the examples)
    ours = {
        name: value
        for name, value in _literals().items()
        if not value.startswith(("TORCHELASTIC_", "TORCH_ELASTIC_"))
    }
    strings = {
        path: _strings(path)
        for root in (REPO / "tests", REPO / "bench")
        for path in root.rglob("*.py")
        if path != Path(__file__) and RESULTS not in path.parents  # a bench run's copies
    }
    repeated = {
        f"{path.relative_to(REPO)}: {name} ({value!r})"
        for path, found in strings.items()
        for name, value in ours.items()
        if value in found
    }
    assert repeated == set(), "import these names from torchx_elastic.contract"


def test_the_event_log_reads_back_what_it_wrote(tmp_path: Path) -> None:
    log = events.EventLog.in_dir(str(tmp_path))
    log.node = 1
    log.emit(events.START, attempt=0, pids={"0": 12})
    (tmp_path / contract.EVENTS_FILE).open("a").write("half a line\n")
    log.emit(events.EXIT, exit_code=0)
    records = events.read_events(str(tmp_path / contract.EVENTS_FILE))
    assert [(r["event"], r["node"]) for r in records] == [("start", 1), ("exit", 1)]
    assert records[0]["pids"] == {"0": 12}


def test_the_summary_reads_back_the_newest(tmp_path: Path) -> None:
    assert events.read_summary(str(tmp_path)) == {}
    events.write_summary(events.summary_path(str(tmp_path), 0), {"state": "FAILED"})
    newer = events.summary_path(str(tmp_path), 1)
    events.write_summary(newer, {"state": "SUCCEEDED"})
    assert Path(newer).name == f"{contract.SUMMARY_PREFIX}1.json"
    assert events.read_summary(str(tmp_path)) == {"state": "SUCCEEDED"}


def test_the_error_file_reads_back_what_it_wrote(tmp_path: Path) -> None:
    path = str(tmp_path / contract.RANK_ERROR_FILE)
    write_error_file(path, "ValueError: bad", "Traceback ...", timestamp_s=7)
    content = read_error_file(path)
    assert content is not None
    assert (content.message, content.traceback, content.timestamp_s) == (
        "ValueError: bad",
        "Traceback ...",
        7.0,
    )


def test_one_node_range_parser() -> None:
    assert parse_node_range("2") == (2, 2)
    assert parse_node_range("1:4") == (1, 4)
    assert parse_node_range(3) == (3, 3)
    assert parse_node_range("0:2", min_low=0) == (0, 2)
    with pytest.raises(ValueError, match="MIN nodes must be at least 1"):
        parse_node_range("0:2")


def test_each_start_method_has_one_spelling_and_torchruns_are_kept() -> None:
    assert START_METHODS == ("fork-server", "spawn", "fork", "forkserver")
    # the agent's command line takes each, torchrun's as torchrun does, and nothing else
    from torchx_elastic.agent.config.cli import build_parser

    for method in START_METHODS:
        args = build_parser().parse_args(["--start-method", method, "train.py"])
        assert args.start_method == method
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--start-method", "fork_server", "train.py"])


def test_ours_and_torchruns_fork_server_are_both_taken_and_a_near_miss_names_both() -> None:
    assert check_start_method(FORK_SERVER) == FORK_SERVER
    assert check_start_method(FORKSERVER) == FORKSERVER
    with pytest.raises(StartMethodError) as err:
        check_start_method("fork_server")
    assert "fork-server (ours, with a hyphen:" in str(err.value)
    assert "torchrun's spawn, fork, forkserver (as torchrun means them)" in str(err.value)
