"""Which failures end the job without a restart (contract/not_retried.py), and what the
report makes of them (report.with_not_retried); the end-to-end runs are
tests/e2e/test_not_retried.py."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator

import pytest

import torchx_elastic
from torchx_elastic.agent.console.failure.first_failure import FirstFailure, not_retried_line
from torchx_elastic.agent.console.failure.report import RankFailure, with_not_retried
from torchx_elastic.components import dist
from torchx_elastic.components.errors import ComponentArgumentError
from torchx_elastic.contract.not_retried import (
    NOT_RETRIED_EXIT_CODE,
    RETRY_ALL,
    NoRetryRule,
    NotRetried,
)


class ConfigProblem(ValueError):
    pass


@pytest.fixture
def mypkg() -> Iterator[type[Exception]]:
    """A package ``mypkg`` whose ``ConfigError`` is defined in ``mypkg.errors``."""
    errors = types.ModuleType("mypkg.errors")

    class ConfigError(Exception):
        pass

    ConfigError.__module__ = "mypkg.errors"
    errors.ConfigError = ConfigError  # type: ignore[attr-defined]
    package = types.ModuleType("mypkg")
    package.ConfigError = ConfigError  # type: ignore[attr-defined]
    sys.modules.update({"mypkg": package, "mypkg.errors": errors})
    yield ConfigError
    del sys.modules["mypkg"], sys.modules["mypkg.errors"]


def test_the_list_reads_classes_and_exit_codes_and_writes_them_back() -> None:
    rule = NoRetryRule.parse(" ValueError, mypkg.ConfigError ,2,64")
    assert rule == NoRetryRule(("ValueError", "mypkg.ConfigError"), frozenset({2, 64}))
    assert NoRetryRule.parse(rule.text()) == rule
    assert NoRetryRule.parse("") == RETRY_ALL and RETRY_ALL.text() == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "Value Error",
            "'Value Error' is neither an exception class (ValueError, mypkg.ConfigError) nor an"
            " exit code (1-255)",
        ),
        ("mypkg.", "'mypkg.' is neither an exception class"),
        ("-1", "'-1' is neither an exception class"),
        ("0", "'0' is not the exit code of a failure (1-255)"),
        ("256", "'256' is not the exit code of a failure (1-255)"),
        ("2,,3", "an empty entry; give exception classes and exit codes, comma-separated"),
    ],
)
def test_a_bad_entry_is_refused_saying_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        NoRetryRule.parse(text)
    assert str(err.value).startswith(message)


def test_exceptions_match_as_except_does(mypkg: type[Exception]) -> None:
    rule = NoRetryRule.parse("ValueError,mypkg.ConfigError")
    assert rule.exception_not_retried(ValueError("x"))
    assert rule.exception_not_retried(ConfigProblem("a subclass"))
    assert rule.exception_not_retried(json.JSONDecodeError("a library's subclass", "", 0))
    assert rule.exception_not_retried(mypkg("re-exported by its package"))
    assert NoRetryRule.parse("mypkg.errors.ConfigError").exception_not_retried(mypkg("x"))
    assert not rule.exception_not_retried(RuntimeError("x"))
    assert not rule.exception_not_retried(KeyError("x"))


def test_not_retried_and_exit_78_need_no_list() -> None:
    class GiveUp(torchx_elastic.NotRetried):
        pass

    assert torchx_elastic.NotRetried is NotRetried
    assert RETRY_ALL.exception_not_retried(NotRetried("x"))
    assert RETRY_ALL.exception_not_retried(GiveUp("x"))
    assert torchx_elastic.NOT_RETRIED_EXIT_CODE == NOT_RETRIED_EXIT_CODE == 78
    assert RETRY_ALL.exit_code_not_retried(78)
    assert not RETRY_ALL.exit_code_not_retried(1)
    assert NoRetryRule.parse("2").exit_code_not_retried(2)


def test_an_error_file_written_by_the_script_is_read_by_class_name() -> None:
    rule = NoRetryRule.parse("mypkg.ConfigError")
    traceback = "Traceback (most recent call last):\n  ...\nmypkg.errors.ConfigError: no lr\n"
    assert rule.message_not_retried("ConfigError: no lr", "")
    assert rule.message_not_retried("", traceback)
    assert RETRY_ALL.message_not_retried("NotRetried: done", "")
    assert not rule.message_not_retried("ValueError: no lr", "")
    assert not rule.message_not_retried("", "")


def _failure(rank: int, exitcode: int, message: str = "", traceback: str = "") -> RankFailure:
    return RankFailure(rank, rank, 0, 100 + rank, exitcode, message=message, traceback=traceback)


def test_the_report_marks_the_failures_not_retried_and_leaves_the_rest() -> None:
    rule = NoRetryRule.parse("ValueError,2")
    failures = [
        _failure(0, 2),  # argparse's usage error, listed
        _failure(1, NOT_RETRIED_EXIT_CODE),
        _failure(2, 1, "ValueError: bad lr"),  # the script's @record wrote the file
        _failure(3, 1, "not retried: ConfigProblem: bad lr"),  # the bootstrap decided
        _failure(4, 1, "RuntimeError: boom"),
        _failure(5, 1, "ValueError: Connection closed by peer"),  # a victim stays one
        _failure(6, -15),
    ]
    marked = [f.message for f in with_not_retried(failures, rule)]
    assert marked == [
        "not retried: exit code 2",
        "not retried: exit code 78",
        "not retried: ValueError: bad lr",
        "not retried: ConfigProblem: bad lr",
        "RuntimeError: boom",
        "ValueError: Connection closed by peer",
        "",
    ]


def test_the_line_and_the_agreed_failure_say_it() -> None:
    failed = FirstFailure(1, 0, "exit code 1", "not retried: ValueError: bad lr")
    assert not failed.retried
    assert FirstFailure(1, 0, "exit code 1", "ValueError: bad lr").retried
    assert FirstFailure.from_json(failed.to_json()) == failed  # as the other nodes read it
    assert not_retried_line(failed, 3) == (
        "torchx-elastic: rank 1 (node 0) failed first: not retried: ValueError: bad lr; the job"
        " ends without a restart (3 restarts left unused)"
    )
    assert not_retried_line(failed, 1).endswith("(1 restart left unused)")


def test_the_components_pass_the_list_to_the_agent_and_refuse_a_bad_one() -> None:
    for component in (dist.ddp, dist.torchrun, dist.spmd):
        args = component(script="train.py", j="2x1", no_retry_on="ValueError,2").roles[0].args
        assert args[args.index("--no-retry-on") + 1] == "ValueError,2"
        assert "--no-retry-on" not in component(script="train.py", j="2x1").roles[0].args
    with pytest.raises(ComponentArgumentError) as err:
        dist.ddp(script="train.py", no_retry_on="ValueError;2")
    assert str(err.value) == (
        "invalid no_retry_on 'ValueError;2': 'ValueError;2' is neither an exception class"
        " (ValueError, mypkg.ConfigError) nor an exit code (1-255)"
    )
