"""What a user sees from the real torchx CLI (in this process) when the docker scheduler
cannot do what was asked: one ERROR line saying what to do, exit code 1, no traceback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from docker_fake_engine import FakeClient, FakeEngine
from torchx.cli.argparse_util import ArgOnceAction, torchxconfig
from torchx.cli.main import main as torchx_main
from torchx.runner import api as runner_api

from torchx_elastic.schedulers import docker as docker_scheduler

RUN = ["run", "--workspace", "", "-s", "docker"]
COMPONENT = ["dist.ddp", "-j", "2x1", "--script", "main.py"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .torchxconfig of the checkout
    for action in (ArgOnceAction, torchxconfig):
        monkeypatch.setattr(action, "called_args", set())


def _error(caplog: pytest.LogCaptureFixture, *argv: str) -> str:
    """``torchx *argv`` in this process, as in a fresh one; returns its one ERROR message."""
    ArgOnceAction.called_args.clear()  # torchx's CLI remembers flags across calls
    torchxconfig.called_args.clear()
    caplog.clear()
    with pytest.raises(SystemExit) as exit_:
        torchx_main(list(argv))
    assert exit_.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    return errors[0]


def test_no_engine(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    for argv in (
        [*RUN, *COMPONENT, "--image", "torchx-elastic:latest"],
        ["status", "docker://torchx/main-abc"],
        ["cancel", "docker://torchx/main-abc"],
        ["log", "docker://torchx/main-abc"],
    ):
        message = _error(caplog, *argv)
        assert message.startswith("no Docker engine reachable (") and message.endswith(
            "; start one: as root, ci/docker-engine.sh installs Debian's docker.io and starts"
            " dockerd; or point DOCKER_HOST at a running engine"
        ), (argv, message)


def test_an_image_that_cannot_be_pulled_and_a_bad_option_value(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()

    def with_fake_engine(session_name: str, **kwargs: Any) -> Any:
        return docker_scheduler.DockerScheduler(session_name, client=FakeClient(engine))

    monkeypatch.setattr(docker_scheduler, "create_scheduler", with_fake_engine)
    message = _error(caplog, *RUN, *COMPONENT, "--image", "team/trainer:1")
    assert message == (
        "image 'team/trainer:1' is not in the local Docker engine and pulling it failed:"
        " pull access denied for team/trainer:1, repository does not exist; build it with"
        " docker/build-image.sh (torchx-elastic:latest, no registry needed), or docker load /"
        " docker pull it"
    )
    message = _error(caplog, *RUN, "-cfg", "stop_timeout_s=ten", *COMPONENT)
    assert message == (
        "-cfg stop_timeout_s=ten: a docker run option has a value of the wrong type (invalid"
        " literal for int() with base 10: 'ten'); `torchx runopts docker` lists the options"
        " with their types and defaults"
    )
    message = _error(caplog, *RUN, "-cfg", "env=WANDB_MODE", *COMPONENT)
    assert message == (
        "-cfg env=WANDB_MODE: a docker run option has a value of the wrong type (a mapping"
        " option takes KEY:VALUE items: KEY1:v1,KEY2:v2); `torchx runopts docker` lists the"
        " options with their types and defaults"
    )


def test_ctrl_c_while_torchx_waits_says_the_job_goes_on_and_how_to_stop_it(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    def with_fake_engine(session_name: str, **kwargs: Any) -> Any:
        return docker_scheduler.DockerScheduler(session_name, client=FakeClient(engine))

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(docker_scheduler, "create_scheduler", with_fake_engine)
    monkeypatch.setattr(runner_api.time, "sleep", ctrl_c)  # the wait's first pause
    try:
        with pytest.raises(SystemExit) as exit_:
            torchx_main([*RUN, "--wait", *COMPONENT, "--image", "torchx-elastic:latest"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt left torchx run (a traceback for the user)")
    assert exit_.value.code == 130
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "interrupted: torchx stopped here, a job it submitted keeps running; `torchx cancel`"
        " with the handle printed above stops it"
    ]
    assert [c.status for c in engine.containers.values()] == ["running", "running"]
