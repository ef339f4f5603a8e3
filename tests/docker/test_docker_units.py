"""Options, state mapping and log lines of the docker scheduler: pure functions, no engine."""

from __future__ import annotations

import json

import pytest
from torchx.schedulers.api import Stream
from torchx.specs import AppState

from torchx_elastic.schedulers.docker import create_scheduler
from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.docker.request import (
    LABEL_APP_ID,
    LABEL_MIN_REPLICAS,
    LABEL_NUM_REPLICAS,
    LABEL_REPLICA_ID,
    LABEL_ROLE_NAME,
)
from torchx_elastic.schedulers.docker.status import (
    ContainerSnapshot,
    app_message,
    app_state,
    root_cause,
)
from torchx_elastic.schedulers.log_lines import whole_lines
from torchx_elastic.schedulers.options import RunOptionError

# -- options ------------------------------------------------------------------------------


def test_runopts_are_generated_from_the_one_declaration() -> None:
    opts = create_scheduler("s").run_opts()
    names = [name for name, _ in opts]
    assert names == [
        "copy_env",
        "env",
        "secret_env_file",
        "image_pull",
        "shm_size_mb",
        "restart_containers",
        "stop_timeout_s",
        "privileged",
        "image_repo",
        "quiet",
    ]
    image_pull = opts.get("image_pull")
    assert image_pull is not None and image_pull.default == "missing"
    assert "pull only when it is not there" in image_pull.help


def test_options_from_a_torchx_cfg_string() -> None:
    opts = create_scheduler("s").run_opts()
    cfg = opts.resolve(
        opts.cfg_from_str("copy_env=NCCL_*;LOGLEVEL,shm_size_mb=256,image_pull=never")
    )
    options = DockerOptions.from_cfg(cfg)
    assert options.copy_env == ("NCCL_*", "LOGLEVEL")
    assert options.shm_size_mb == 256
    assert options.image_pull == "never"
    assert options.restart_containers is False


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {"image_pull": "sometimes"},
            "invalid docker run option image_pull='sometimes';"
            " accepted: missing, always, never (default: missing)",
        ),
        (
            {"shm_size_mb": -1},
            "invalid docker run option shm_size_mb=-1; accepted: a number >= 0 (default: 0)",
        ),
        (
            {"stop_timeout_s": -5},
            "invalid docker run option stop_timeout_s=-5; accepted: a number >= 0 (default: 10)",
        ),
    ],
)
def test_invalid_option_values_are_refused(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(RunOptionError) as error:
        DockerOptions.from_cfg(cfg)  # type: ignore[arg-type]
    assert str(error.value) == message


# -- states -------------------------------------------------------------------------------


def replica(
    replica_id: int,
    status: str,
    exit_code: int = 0,
    finished_at: str = "0001-01-01T00:00:00Z",
    min_replicas: int = 2,
    num_replicas: int = 2,
    oom_killed: bool = False,
    error: str = "",
    log_tail: str = "",
) -> ContainerSnapshot:
    return ContainerSnapshot(
        name=f"job-1-main-{replica_id}",
        image="torchx-elastic:latest",
        labels={
            LABEL_APP_ID: "job-1",
            LABEL_ROLE_NAME: "main",
            LABEL_REPLICA_ID: str(replica_id),
            LABEL_MIN_REPLICAS: str(min_replicas),
            LABEL_NUM_REPLICAS: str(num_replicas),
        },
        status=status,
        exit_code=exit_code,
        oom_killed=oom_killed,
        error=error,
        finished_at=finished_at,
        restart_count=0,
        log_tail=log_tail,
    )


@pytest.mark.parametrize(
    ("status", "exit_code", "error", "state"),
    [
        ("created", 0, "", AppState.SUBMITTED),
        ("created", 127, "exec: not found", AppState.FAILED),
        ("running", 0, "", AppState.RUNNING),
        ("restarting", 137, "", AppState.PENDING),
        ("paused", 0, "", AppState.PENDING),
        ("exited", 0, "", AppState.SUCCEEDED),
        ("exited", 1, "", AppState.FAILED),
        ("removing", 0, "", AppState.CANCELLED),
        ("dead", 0, "", AppState.FAILED),
        ("something-new", 0, "", AppState.UNKNOWN),
    ],
)
def test_replica_state_of_each_container_status(
    status: str, exit_code: int, error: str, state: AppState
) -> None:
    assert replica(0, status, exit_code, error=error).state == state


def test_job_succeeds_when_every_replica_does() -> None:
    assert app_state([replica(0, "exited"), replica(1, "exited")]) == AppState.SUCCEEDED


def test_job_fails_as_soon_as_too_few_replicas_are_left() -> None:
    # 2x2: replica 1 killed, replica 0 still running until its workers notice
    replicas = [replica(0, "running"), replica(1, "exited", 137)]
    assert app_state(replicas) == AppState.FAILED


def test_elastic_job_keeps_running_while_min_replicas_are_left() -> None:
    replicas = [
        replica(0, "running", min_replicas=1),
        replica(1, "exited", 137, min_replicas=1),
    ]
    assert app_state(replicas) == AppState.RUNNING


def test_restarting_replica_keeps_the_job_alive() -> None:
    assert app_state([replica(0, "running"), replica(1, "restarting", 137)]) == AppState.RUNNING


def test_job_is_pending_until_a_replica_runs() -> None:
    assert app_state([replica(0, "created"), replica(1, "created")]) == AppState.SUBMITTED
    assert app_state([]) == AppState.UNKNOWN


def test_root_cause_is_the_replica_that_failed_first() -> None:
    replicas = [
        replica(0, "exited", 1, finished_at="2026-01-01T00:00:09.5Z", log_tail="boom\n"),
        replica(1, "exited", 137, finished_at="2026-01-01T00:00:03.123456789Z"),
    ]
    first = root_cause(replicas)
    assert first is not None and first.replica_id == 1
    assert app_message(replicas, "sess") == (
        "main[1] (container job-1-main-1) failed first: exit code 137 (killed by SIGKILL,"
        " e.g. docker kill or docker stop); its log: torchx log docker://sess/job-1/main/1"
    )
    assert app_message([replica(0, "running")], "sess") == "<NONE>"


@pytest.mark.parametrize(
    ("snapshot", "reason"),
    [
        (replica(0, "exited", 1), "exit code 1"),
        (replica(0, "exited", 139), "exit code 139 (killed by SIGSEGV)"),
        (
            replica(0, "exited", 137, oom_killed=True),
            "exit code 137 (killed by the kernel's OOM killer: raise memMB)",
        ),
        (
            replica(0, "created", 127, error="exec: python9 not found"),
            "the engine could not run it: exec: python9 not found",
        ),
    ],
)
def test_failure_reasons(snapshot: ContainerSnapshot, reason: str) -> None:
    assert snapshot.failure_reason() == reason


def test_structured_error_message_is_torchx_reply_file_json() -> None:
    snapshot = replica(
        1, "exited", 1, finished_at="2026-01-01T00:00:03Z", log_tail="a\nValueError: bad\n"
    )
    data = json.loads(snapshot.structured_error_msg())
    assert data["message"]["errorCode"] == 1
    assert int(data["message"]["extraInfo"]["timestamp"]) == 1767225603  # torchx reads int()
    assert data["message"]["message"] == "exit code 1; last log lines: a | ValueError: bad"


def test_every_replica_names_the_jobs_first_failure_from_its_agents_last_line() -> None:
    """Each node's agent prints the job's first failure last (the same on every node): the
    status of the job and of each failed replica names that rank and message."""
    last_line = "torchx-elastic: job failed: rank 2 (node 1) failed first: ValueError: boom\n"
    replicas = [
        replica(0, "exited", 1, finished_at="2026-01-01T00:00:03Z", log_tail="x\n" + last_line),
        replica(1, "exited", 1, finished_at="2026-01-01T00:00:04Z", log_tail=last_line),
    ]
    assert app_message(replicas, "sess") == (
        "main[0] (container job-1-main-0) failed first: exit code 1: rank 2 (node 1) failed"
        " first: ValueError: boom; its log: torchx log docker://sess/job-1/main/0"
    )
    for snapshot in replicas:
        data = json.loads(snapshot.structured_error_msg())
        assert data["message"]["message"] == (
            "exit code 1: rank 2 (node 1) failed first: ValueError: boom"
        )


# -- logs ---------------------------------------------------------------------------------


def test_whole_lines_rejoin_lines_split_over_chunks() -> None:
    chunks = [b"rank 0: he", b"llo\nrank 1: ", b"hi\n\nlast", b" words"]
    assert list(whole_lines(chunks)) == ["rank 0: hello\n", "rank 1: hi\n", "\n", "last words\n"]


def test_whole_lines_keep_multibyte_characters_split_over_chunks() -> None:
    text = "loss ↓ 0.1\n".encode()
    assert list(whole_lines([text[:6], text[6:]])) == ["loss ↓ 0.1\n"]


def test_unknown_log_stream_is_refused() -> None:
    from torchx_elastic.schedulers.docker.logs import container_log_lines

    with pytest.raises(
        ValueError, match="unknown log stream 'both': use stdout, stderr or combined"
    ):
        container_log_lines(object(), streams="both")  # type: ignore[arg-type]
    assert Stream.COMBINED.value == "combined"
