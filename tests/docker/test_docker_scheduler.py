"""The scheduler against a stateful fake engine: submit, status, list, logs, cancel, errors."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from docker_fake_engine import FakeEngine, FakeImage
from torchx.specs import AppState

from torchx_elastic.components.dist import ddp
from torchx_elastic.components.ft import ddp as ft_ddp
from torchx_elastic.contract import ENV_FILE_ENV, RANK0_ENV, SECRET_ENV
from torchx_elastic.schedulers.docker import DockerScheduler, create_scheduler
from torchx_elastic.schedulers.docker.errors import (
    ContainerStartError,
    EngineUnreachableError,
    ImageMissingError,
    NameClashError,
)
from torchx_elastic.schedulers.docker.request import container_name
from torchx_elastic.schedulers.docker.secret_file import SecretEnvFileError


def submit(scheduler: DockerScheduler, j: str = "2x2", **cfg: object) -> str:
    app = ddp(script="examples/main.py", j=j, max_retries=int(cfg.pop("max_retries", 0)))  # type: ignore[call-overload]
    return scheduler.submit(app, cfg)  # type: ignore[arg-type]


def test_submit_runs_one_container_per_replica_on_the_job_network(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler)
    assert sorted(engine.containers) == [f"{app_id}-main-0", f"{app_id}-main-1"]
    assert list(engine.networks) == [f"torchx-{app_id}"]
    for container in engine.containers.values():
        assert container.status == "running"
        assert container.kwargs["network"] == f"torchx-{app_id}"
        assert container.kwargs["environment"][RANK0_ENV] == f"{app_id}-main-0"
    # the job's own secret, the same in every container, made at submission (not dry run)
    secrets = {c.kwargs["environment"][SECRET_ENV] for c in engine.containers.values()}
    assert len(secrets) == 1 and len(secrets.pop()) == 64
    assert engine.images.pulls == []  # the local image is used as it is


def test_status_follows_the_containers(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    app_id = submit(scheduler)
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    assert [r.hostname for r in desc.roles_statuses[0].replicas] == [
        f"{app_id}-main-0",
        f"{app_id}-main-1",
    ]
    for container in engine.containers.values():
        container.finish(0)
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert desc.roles[0].num_replicas == 2
    assert scheduler.describe("no-such-job") is None


def test_killed_replica_fails_the_job_with_its_root_cause(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler)
    rank1 = engine.containers[f"{app_id}-main-1"]
    rank1.write("[1:2] step 10\n")
    rank1.crash(137)
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED
    assert desc.msg == (
        f"main[1] (container {app_id}-main-1) failed first: exit code 137 (killed by SIGKILL,"
        f" e.g. docker kill or docker stop); its log: torchx log docker://test/{app_id}/main/1;"
        " stopped the 1 replica(s) still running"
    )
    # no gang scheduling in Docker: the scheduler stops what is left of a failed job
    assert f"stop {app_id}-main-0 timeout=10" in engine.calls
    assert engine.containers[f"{app_id}-main-0"].status == "exited"
    replica1 = desc.roles_statuses[0].replicas[1]
    assert replica1.state == AppState.FAILED
    assert "last log lines: [1:2] step 10" in replica1.structured_error_msg


def test_with_restart_containers_a_killed_replica_is_restarted(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler, max_retries=1, restart_containers=True)
    rank1 = engine.containers[f"{app_id}-main-1"]
    assert rank1.kwargs["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 1}
    rank1.crash(137)
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    assert desc.num_restarts == 1
    rank1.crash(137)  # restarts used up
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED


def test_list_shows_each_job_once(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    first = submit(scheduler)
    second = submit(scheduler, j="1x1")
    engine.containers[f"{second}-main-0"].finish(0)
    listed = {(r.app_id, r.state) for r in scheduler.list()}
    assert listed == {(first, AppState.RUNNING), (second, AppState.SUCCEEDED)}


def test_logs_per_replica_in_whole_lines(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    app_id = submit(scheduler)
    rank1 = engine.containers[f"{app_id}-main-1"]
    rank1.write("[1:2] world size 4, rank 2\n")
    rank1.write("[1:3] a warning\n", stream="stderr")
    rank1.write("[1:2] done\n")
    engine.containers[f"{app_id}-main-0"].write("[0:0] rank 0\n")

    lines = list(scheduler.log_iter(app_id, "main", k=1))
    assert lines == ["[1:2] world size 4, rank 2\n", "[1:3] a warning\n", "[1:2] done\n"]
    assert list(scheduler.log_iter(app_id, "main", k=1, regex="rank")) == [lines[0]]
    from torchx.schedulers.api import Stream

    assert list(scheduler.log_iter(app_id, "main", k=1, streams=Stream.STDERR)) == [lines[1]]
    since = datetime(2026, 1, 1)
    list(scheduler.log_iter(app_id, "main", k=0, since=since, should_tail=True))
    assert engine.log_calls[-1] == {"since": since, "until": None, "follow": True}


def test_logs_of_a_replica_that_does_not_exist(scheduler: DockerScheduler) -> None:
    app_id = submit(scheduler)
    with pytest.raises(ValueError) as error:
        scheduler.log_iter(app_id, "main", k=5)
    assert str(error.value) == f"job {app_id} has no replica main/5; its replicas: main/0, main/1"


def test_cancel_stops_and_keeps_status_and_logs(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler)
    other = submit(scheduler, j="1x1")
    engine.containers[f"{app_id}-main-0"].write("before the cancel\n")
    scheduler.cancel(app_id)
    # stopped (SIGTERM, SIGKILL after stop_timeout_s), as torchx's local_docker; not removed
    for name in (f"{app_id}-main-0", f"{app_id}-main-1"):
        assert f"stop {name} timeout=10" in engine.calls
        assert f"remove {name}" not in engine.calls
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED
    assert desc.msg.startswith("cancelled by torchx cancel; ")
    assert list(scheduler.log_iter(app_id, "main", 0)) == ["before the cancel\n"]
    assert {a.app_id: a.state for a in scheduler.list()} == {
        app_id: AppState.CANCELLED,
        other: AppState.RUNNING,
    }
    scheduler.cancel(app_id)  # idempotent
    assert scheduler.describe(app_id).state == AppState.CANCELLED  # type: ignore[union-attr]


def test_cancel_of_an_ended_job_keeps_its_state(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler)
    for container in engine.containers.values():
        container.finish(0)
    scheduler.cancel(app_id)
    assert scheduler.describe(app_id).state == AppState.SUCCEEDED  # type: ignore[union-attr]
    assert engine.volumes == {}


def test_delete_leaves_nothing_behind(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    app_id = submit(scheduler)
    other = submit(scheduler, j="1x1")
    scheduler.cancel(app_id)
    scheduler.delete(app_id)
    assert sorted(engine.containers) == [f"{other}-main-0"]
    assert list(engine.networks) == [f"torchx-{other}"]
    assert engine.volumes == {}
    for name in (f"{app_id}-main-0", f"{app_id}-main-1"):
        assert engine.calls.index(f"stop {name} timeout=10") < engine.calls.index(f"remove {name}")
    assert scheduler.describe(app_id) is None
    scheduler.delete(app_id)  # idempotent


def test_delete_cleans_up_a_finished_job(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    app_id = submit(scheduler)
    for container in engine.containers.values():
        container.finish(1)
    scheduler.delete(app_id)
    assert engine.containers == {} and engine.networks == {}


# -- errors -------------------------------------------------------------------------------


def test_no_engine_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    scheduler = create_scheduler("test")
    with pytest.raises(EngineUnreachableError) as error:
        scheduler.list()
    message = str(error.value)
    assert message.startswith("no Docker engine reachable (Error while fetching server API version")
    assert message.endswith(
        "; start one: as root, ci/docker-engine.sh installs Debian's docker.io and starts"
        " dockerd; or point DOCKER_HOST at a running engine"
    )


def test_image_missing_and_pull_fails(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    del engine.local_images["torchx-elastic:latest"]
    with pytest.raises(ImageMissingError) as error:
        submit(scheduler)
    assert str(error.value) == (
        "image 'torchx-elastic:latest' is not in the local Docker engine and pulling it failed:"
        " pull access denied for torchx-elastic:latest, repository does not exist; build it"
        " with docker/build-image.sh (torchx-elastic:latest, no registry needed), or docker"
        " load / docker pull it"
    )
    assert engine.images.pulls == ["torchx-elastic:latest"]
    assert engine.containers == {} and engine.networks == {}


def test_image_missing_and_pulling_forbidden(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    del engine.local_images["torchx-elastic:latest"]
    with pytest.raises(ImageMissingError, match="and image_pull=never forbids pulling it; build"):
        submit(scheduler, image_pull="never")
    assert engine.images.pulls == []


def test_missing_image_is_pulled_when_a_registry_has_it(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    del engine.local_images["torchx-elastic:latest"]
    engine.registry_images.add("torchx-elastic:latest")
    submit(scheduler)
    assert engine.images.pulls == ["torchx-elastic:latest"]


def test_pull_always_falls_back_to_the_local_image(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler, image_pull="always")
    assert engine.images.pulls == ["torchx-elastic:latest"]
    assert len(scheduler.describe(app_id).roles_statuses[0].replicas) == 2  # type: ignore[union-attr]


def test_name_clash_with_an_existing_container(
    scheduler: DockerScheduler, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "torchx_elastic.schedulers.docker.scheduler.make_unique", lambda name: "main-fixed"
    )
    submit(scheduler)
    engine.networks.clear()  # only the containers are left over
    with pytest.raises(NameClashError) as error:
        submit(scheduler)
    assert str(error.value) == (
        "container name(s) already in use: main-fixed-main-0, main-fixed-main-1 (a job with the"
        " same id or its leftovers); remove them with `docker rm -f main-fixed-main-0"
        " main-fixed-main-1` or run again (a new run gets a new app id)"
    )


def test_name_clash_with_an_existing_network(
    scheduler: DockerScheduler, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "torchx_elastic.schedulers.docker.scheduler.make_unique", lambda name: "main-fixed"
    )
    engine.networks_api.create("torchx-main-fixed")
    with pytest.raises(
        NameClashError, match=r"^network name\(s\) already in use: torchx-main-fixed"
    ):
        submit(scheduler)
    assert engine.containers == {}


def test_container_that_fails_to_start(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    engine.local_images["no-python"] = FakeImage("no-python", executables=("sh",))
    app = ddp(script="main.py", j="2x1", image="no-python")
    with pytest.raises(ContainerStartError) as error:
        scheduler.submit(app, {})
    name = error.value.args[0].split()[1]
    assert str(error.value) == (
        f"container {name} (main[0]) failed to start: failed to create shim task: OCI runtime"
        ' create failed: exec: "python3": executable file not found in $PATH; check that the'
        " image 'no-python' has the entrypoint 'python3' and that mount sources exist. The"
        " job's containers and network were removed"
    )
    assert engine.containers == {} and engine.networks == {}


def test_container_that_cannot_be_created(scheduler: DockerScheduler, engine: FakeEngine) -> None:
    app = ddp(script="main.py", j="2x1", mounts=["type=bind", "src=/no/such/dir", "dst=/data"])
    with pytest.raises(ContainerStartError, match="bind source path does not exist: /no/such/dir"):
        scheduler.submit(app, {})
    assert engine.containers == {} and engine.networks == {}


# -- python -m torchx_elastic.schedulers.docker remove ------------------------------------


def test_remove_finished_jobs(
    scheduler: DockerScheduler, engine: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    from docker_fake_engine import FakeClient

    from torchx_elastic.schedulers.docker.__main__ import main

    finished = submit(scheduler, j="1x1")
    running = submit(scheduler, j="1x1")
    engine.containers[f"{finished}-main-0"].finish(0)
    assert main(["remove", "--finished"], client=FakeClient(engine)) == 0
    assert capsys.readouterr().out == f"removed {finished}\n"
    assert list(engine.containers) == [f"{running}-main-0"]
    assert list(engine.networks) == [f"torchx-{running}"]
    assert main(["remove", running], client=FakeClient(engine)) == 0
    assert engine.containers == {} and engine.networks == {}


def test_remove_needs_app_ids_or_finished(capsys: pytest.CaptureFixture[str]) -> None:
    from torchx_elastic.schedulers.docker.__main__ import main

    with pytest.raises(SystemExit):
        main(["remove"])
    assert "error: give either APP_IDs or --finished" in capsys.readouterr().err


def test_remove_without_an_engine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchx_elastic.schedulers.docker.__main__ import main

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert main(["remove", "--finished"]) == 1
    assert capsys.readouterr().err.startswith("error: no Docker engine reachable (")


JOB_LINE = (
    "[job progress] 120/200 (60.0%) of 4/4 ranks on 2/2 nodes, slowest r3 (n1) 120,"
    " fastest r0 (n0) 131, 4.1 steps/s, ETA 29s\n"
)


def test_status_shows_the_jobs_progress_from_replica_0s_log(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler)
    rank0 = engine.containers[f"{app_id}-main-0"]
    assert scheduler.describe(app_id).msg == "<NONE>"  # type: ignore[union-attr]
    rank0.write(JOB_LINE.replace("120/200 (60.0%)", "80/200 (40.0%)"), stream="stderr")
    rank0.write(JOB_LINE, stream="stderr")
    rank0.write("[n0 r0] step 130\n")
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    assert desc.msg == (
        "progress 120/200 (60.0%) of 4/4 ranks, 4.1 steps/s, ETA 29s"
        f" (as of 0s ago, log of {app_id}-main-0)"
    )


def test_status_shows_the_progress_of_another_replica_where_replica_0_stands_by(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler, j="3x1")  # two train, one stands by
    spare, rank0 = engine.containers[f"{app_id}-main-0"], engine.containers[f"{app_id}-main-2"]
    spare.write("torchx-elastic: standing by: the job has its 2 nodes (3 here)\n", "stderr")
    rank0.write(JOB_LINE, stream="stderr")
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.msg == (
        "progress 120/200 (60.0%) of 4/4 ranks, 4.1 steps/s, ETA 29s"
        f" (as of 0s ago, log of {app_id}-main-2)"
    )


def test_status_counts_the_standby_of_a_job_whose_script_reports_no_progress(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = submit(scheduler, j="3x1")  # two train, one stands by
    rank0 = engine.containers[f"{app_id}-main-0"]
    rank0.write("[job progress] nodes: 2 training, 1 standby\n", stream="stderr")
    rank0.write("[n0 r0] step 130\n")
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.msg == (
        f"nodes: 2 training, 1 standby (as of 0s ago, log of {app_id}-main-0)"
    )


LONG_NAME = "a-training-run-whose-name-is-long-enough-to-fill-a-hostname-x"


def test_two_jobs_with_the_same_long_name_get_networks_of_their_own(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app = ddp(script="examples/main.py", j="2x1", name=LONG_NAME)
    first, second = scheduler.submit(app, {}), scheduler.submit(app, {})
    assert len(LONG_NAME) == 61 and first != second
    networks = list(engine.networks)
    assert all(n.startswith("torchx-") and len(n) <= 63 for n in networks), networks
    # each keeps its job's unique suffix, as the container names do
    assert [n.rpartition("-")[2] for n in networks] == [
        a.rpartition("-")[2] for a in (first, second)
    ]


def test_secret_env_file_reaches_the_containers_as_a_file_not_their_config(
    scheduler: DockerScheduler, engine: FakeEngine, tmp_path: Path
) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_text("# for wandb\nWANDB_API_KEY=abc=123\n\n")
    app_id = submit(scheduler, j="2x1", secret_env_file=str(env_file))
    for container in engine.containers.values():
        environment = container.kwargs["environment"]
        assert "abc=123" not in str(container.kwargs)
        assert environment[ENV_FILE_ENV] == "/tmp/torchx-elastic-secret.env"
        assert container.files == {"/tmp/torchx-elastic-secret.env": b"WANDB_API_KEY=abc=123\n"}
    assert app_id


def test_a_missing_secret_env_file_fails_before_anything_is_created(
    scheduler: DockerScheduler, engine: FakeEngine, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.env"
    with pytest.raises(
        SecretEnvFileError, match=f"^secret_env_file {missing}: No such file or directory$"
    ):
        submit(scheduler, secret_env_file=str(missing))
    assert engine.containers == {} and engine.networks == {}


def test_a_failed_replica_group_stops_only_its_own_containers(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    """ft.ddp: a group that failed for good ends alone; the Lighthouse and the other group
    run on, and the status says what each group does and where the job is."""
    app = ft_ddp(script="examples/ft_ddp.py", j="2x1", max_retries=1)
    app_id = scheduler.submit(app, {})  # type: ignore[arg-type]
    lighthouse = engine.containers[container_name(app_id, "lighthouse", 0)]
    lighthouse.write(
        "[torchx-elastic ft] quorum 3 at step 8: 2 of 2 replica groups (ft_ddp_0, ft_ddp_1)\n"
        "[torchx-elastic ft] quorum 4 at step 9: 1 of 2 replica groups (ft_ddp_0)\n",
        stream="stderr",
    )
    engine.containers[container_name(app_id, "group0", 0)].write(
        "[job progress] 12/40 (30.0%) of 2/2 ranks on 2/2 nodes, slowest r1 (n1) 12,"
        " fastest r0 (n0) 12, 2.5 steps/s, ETA 11s\n",
        stream="stderr",
    )
    engine.containers[container_name(app_id, "group1", 0)].write(
        "[job progress] 8/40 (20.0%) of 2/2 ranks on 2/2 nodes, slowest r1 (n1) 8,"
        " fastest r0 (n0) 8, 2.4 steps/s, ETA 13s\n",
        stream="stderr",
    )
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    lines = desc.msg.splitlines()
    assert lines[0] == "lighthouse: RUNNING"
    assert lines[1].startswith("group0: RUNNING; training (in quorum 4), progress 12/40 (30.0%)")
    assert lines[2].startswith("group1: RUNNING; recovering (not in quorum 4), progress 8/40")
    assert lines[3] == "last quorum 4 at step 9: 1 of 2 replica groups (ft_ddp_0)"
    assert lines[4].startswith(
        "job progress 12/40 (30.0%), group0 the furthest of 2 groups: 2/4 ranks reporting,"
        " 2.5 steps/s, ETA 11s (as of 0s ago); 1 of 2 groups in quorum 4"
    )

    engine.containers[container_name(app_id, "group1", 1)].crash(1)  # out of restarts
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING, desc.msg
    assert desc.msg.splitlines()[0] == (
        f"group1[1] (container {container_name(app_id, 'group1', 1)}) failed first: exit code 1;"
        f" its log: torchx log docker://test/{app_id}/group1/1; stopped the 1 replica(s) still"
        " running in group1"
    )
    # a failed group's last progress says where it stopped
    assert desc.msg.splitlines()[3].startswith("group1: FAILED; progress 8/40 (20.0%)")
    assert f"stop {container_name(app_id, 'group1', 0)} timeout=10" in engine.calls
    for role, replica in (("lighthouse", 0), ("group0", 0), ("group0", 1)):
        assert engine.containers[container_name(app_id, role, replica)].status == "running"
    for replica in (0, 1):
        engine.containers[container_name(app_id, "group0", replica)].finish(0)
    lighthouse.finish(0)  # every group ended
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED
    assert desc.msg.splitlines()[1] == "group1 failed"


def test_an_app_of_several_roles_succeeds_when_every_role_did(
    scheduler: DockerScheduler, engine: FakeEngine
) -> None:
    app_id = scheduler.submit(ft_ddp(script="examples/ft_ddp.py", j="1x2"), {})  # type: ignore[arg-type]
    for container in engine.containers.values():
        container.finish(0)
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == AppState.SUCCEEDED
    assert desc.msg.splitlines() == [
        "lighthouse: SUCCEEDED",
        "group0: SUCCEEDED",
        "group1: SUCCEEDED",
    ]
    assert [r.role for r in desc.roles_statuses] == ["group0", "group1", "lighthouse"]
