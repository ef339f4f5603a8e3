"""``--rdzv-conf``: what torchrun takes is taken; keys the backend does not read are named."""

from __future__ import annotations

import logging

import pytest

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import AgentConfig, UsageError, config_from_args

C10D = ("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400")
STATIC = ("--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "n0:29400")
C10D_READS = (
    "cas_backoff_max_seconds, close_timeout, finished_grace_s, handler, heartbeat_timeout,"
    " is_host, join_timeout, keep_alive_interval, keep_alive_max_attempt, last_call_timeout,"
    " liveness, read_timeout, store_type"
)


def config(*argv: str) -> AgentConfig:
    return config_from_args(build_parser().parse_args([*argv, "train.py"]))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_torch_launcher_tests_quoted_conf_is_taken_as_torchrun_takes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # torch's test_launch_elastic: one argv element, the shell's quotes left in
    c = config(*C10D, "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'")
    assert c.rdzv_configs == {"'join_timeout": "5", "last_call_timeout": "1", "timeout": "5'"}
    assert warnings_of(caplog) == [
        "--rdzv-conf \"'join_timeout\", 'timeout': the c10d rendezvous does not read these"
        " settings, so they are ignored (as torchrun ignores them); it reads " + C10D_READS
    ]


def test_one_unread_key_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    c = config(*C10D, "--rdzv-conf", "join_timeout=60,rank=1")
    assert c.rdzv_configs["rank"] == "1"  # handed to torch's handler, which ignores it
    assert warnings_of(caplog) == [
        "--rdzv-conf 'rank': the c10d rendezvous does not read this setting, so it is ignored"
        " (as torchrun ignores it); it reads " + C10D_READS
    ]


def test_keys_read_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    config(*C10D, "--rdzv-conf", "join_timeout=60,last_call_timeout=1,read_timeout=5,is_host=1")
    assert warnings_of(caplog) == []


def test_a_key_the_backend_reads_is_still_checked() -> None:
    # the static backend reads `timeout` (int(...)): torchrun fails on 5' too
    with pytest.raises(UsageError) as error:
        config(*STATIC, "--rdzv-conf", "timeout=5'")
    assert str(error.value) == (
        '--rdzv-conf timeout="5\'": timeout must be a whole number of seconds > 0'
        " (e.g. timeout=600)"
    )


def test_static_reads_timeout_and_ignores_the_dynamic_keys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = config(*STATIC, "--node-rank", "1", "--rdzv-conf", "timeout=30,close_timeout=x")
    assert (c.rdzv_configs["timeout"], c.rdzv_configs["close_timeout"]) == ("30", "x")
    assert warnings_of(caplog) == [
        "--rdzv-conf 'close_timeout': the static rendezvous does not read this setting, so it"
        " is ignored (as torchrun ignores it); it reads finished_grace_s, join_timeout,"
        " keep_alive_interval, keep_alive_max_attempt, rank, timeout"
    ]


def test_a_key_without_a_value_is_refused_as_torchrun_refuses_it() -> None:
    with pytest.raises(UsageError) as error:
        config(*C10D, "--rdzv-conf", "x=")
    assert str(error.value) == (
        "--rdzv-conf item 'x=' has no value after '=' (e.g. join_timeout=600)"
    )


def test_a_backend_of_another_package_gets_every_key_checked_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torchx_elastic.agent.config import rdzv_conf

    rdzv_conf.check("my-backend", {"anything": "1"})
    assert warnings_of(caplog) == []
    with pytest.raises(ValueError, match="join_timeout='x': join_timeout must be a whole"):
        rdzv_conf.check("my-backend", {"join_timeout": "x"})


def test_the_settings_are_read_once_into_typed_figures() -> None:
    defaults = config(*C10D).rdzv
    assert (defaults.keep_alive_interval_s, defaults.keep_alive_max_attempt) == (2.0, 5)
    assert defaults.dead_after_s == 10.0
    assert (defaults.first_last_call_s, defaults.reform_last_call_s) == (30.0, 3.0)
    assert (defaults.join_timeout_s, defaults.read_timeout_s) == (600.0, 60.0)
    assert (defaults.store_type, defaults.is_host, defaults.torch_handler) == ("tcp", None, False)
    assert defaults.liveness_mode("c10d") == "keys"
    assert defaults.torch_conf() == {
        "keep_alive_interval": "2",
        "keep_alive_max_attempt": "5",
        "timeout": 900,  # torchrun's LaunchConfig adds it
    }
    given = config(
        *C10D,
        "--rdzv-conf",
        "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=7,join_timeout=20,"
        "is_host=no,handler=torch,finished_grace_s=2.5",
    ).rdzv
    assert given.dead_after_s == 3.0
    assert (given.first_last_call_s, given.reform_last_call_s) == (7.0, 7.0)
    assert (given.join_timeout_s, given.is_host, given.finished_grace_s) == (20.0, False, 2.5)
    assert given.torch_handler and given.liveness_mode("c10d") == "state"
    assert config(*C10D, "--rdzv-conf", "liveness=state").rdzv.torch_handler
    static = config(*STATIC, "--node-rank", "0").rdzv
    assert (static.static_rank, static.static_timeout_s) == (0, 900.0)


def test_a_setting_the_backend_does_not_read_keeps_its_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # static reads no read_timeout: its value is not checked (one warning), and not read
    settings = config(*STATIC, "--node-rank", "1", "--rdzv-conf", "read_timeout=soon").rdzv
    assert settings.read_timeout_s == 60.0 and settings.static_rank == 1
    assert any(
        "'read_timeout': the static rendezvous does not read" in w for w in warnings_of(caplog)
    )
