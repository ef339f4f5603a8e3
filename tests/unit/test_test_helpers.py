"""The tests' own helpers: the wait for an event (tests/waiting.py) and running in CI
(tests/ci.py)."""

from __future__ import annotations

import pytest

from tests import ci
from tests.waiting import wait_until


def test_wait_until_returns_the_conditions_value_once_it_holds() -> None:
    answers = iter([None, 0, "", "found"])
    assert wait_until(lambda: next(answers), what="an answer", every_s=0) == "found"


def test_wait_until_names_what_it_awaited_and_the_detail() -> None:
    with pytest.raises(AssertionError, match=r"^the end of the job: not within 0 s\nits log$"):
        wait_until(lambda: False, what="the end of the job", timeout_s=0, detail=lambda: "its log")


@pytest.mark.parametrize("value", ["true", "1", "YES"])
def test_in_ci_a_missing_backend_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert ci.in_ci()
    with pytest.raises(pytest.fail.Exception, match="^CI=true and no engine here$"):
        ci.unavailable("no engine here")


@pytest.mark.parametrize("value", ["", "false", "0"])
def test_elsewhere_a_missing_backend_skips(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert not ci.in_ci()
    with pytest.raises(pytest.skip.Exception, match="^no engine here$"):
        ci.unavailable("no engine here")
