"""local_cwd's stop of a job (``local_stop.py``), in this process: the workers' grace as the
agent reads it, the bound and its line, the log followers' drain (the stop of real process
groups: tests/e2e/test_local_stop_replicas.py)."""

from __future__ import annotations

import threading
import time

import pytest

from torchx_elastic.schedulers.local_stop import (
    AGENTS_MARGIN_S,
    DEFAULT_GRACE_S,
    Followers,
    stop_bound_s,
    stopping_line,
    workers_grace_s,
)

JOIN_S = 60.0  # a bound on a hang, not a speed


@pytest.mark.parametrize(
    ("args", "env", "grace_s"),
    [
        ([], {}, DEFAULT_GRACE_S),
        (["--term-timeout-s", "45", "main.py"], {}, 45.0),
        (["--term-timeout-s=5"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 5.0),
        (["main.py"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 90.0),
        (["--term-timeout-s", "soon"], {}, DEFAULT_GRACE_S),
    ],
)
def test_the_workers_grace_is_the_agents(
    args: list[str], env: dict[str, str], grace_s: float
) -> None:
    assert workers_grace_s(args, env) == grace_s


def test_the_bound_is_the_grace_and_the_agents_margin() -> None:
    assert AGENTS_MARGIN_S == 30.0
    assert stop_bound_s(30.0) == 60.0
    assert stopping_line(30.0, 60.0) == (
        "torchx-elastic: stopping the job: its workers get SIGTERM and 30s to finish, its"
        " agents up to 60s in all; Ctrl-C again stops it at once"
    )


def test_followers_are_waited_for_until_they_end() -> None:
    followers = Followers()
    lines = followers.follow(iter(["a\n", "b\n"]))
    assert next(lines) == "a\n"
    started = time.monotonic()
    followers.wait_done(timeout_s=0.2)  # one still reads: the wait runs out
    assert time.monotonic() - started >= 0.2
    assert list(lines) == ["b\n"]
    # every follower ended: the wait returns at once, not at its timeout (a bound on a hang)
    drained = threading.Thread(target=followers.wait_done, args=(3600.0,), daemon=True)
    drained.start()
    drained.join(JOIN_S)
    assert not drained.is_alive()
