"""End to end on a real Docker engine, through the torchx CLI.

Needs the engine and the image ``torchx-elastic:latest`` (see conftest.py: skipped
locally without them, failing in CI).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, List

import pytest
import torchx.specs as specs

from tests.waiting import wait_until
from torchx_elastic.contract import RANK0_ENV
from torchx_elastic.schedulers.docker import DockerScheduler, create_scheduler
from torchx_elastic.schedulers.docker.errors import (
    ContainerStartError,
    ImageMissingError,
    NameClashError,
)
from torchx_elastic.schedulers.docker.request import LABEL_APP_ID, container_name

# the first test may build the image (docker/build-image.sh, a few minutes when stale)
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
LONG_RUN = ["--", "--steps", "100000000"]  # runs until stopped


def torchx(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def run_job(*component_args: str, cfg: str = "", component: str = "dist.ddp") -> str:
    """``torchx run -s docker [-cfg CFG] COMPONENT ...``; the app handle."""
    cfg_args = ("-cfg", cfg) if cfg else ()
    out = torchx("run", "-s", "docker", *cfg_args, component, *component_args).stdout
    match = re.search(r"^(docker://\S+/\S+)$", out, re.MULTILINE)
    assert match, f"no app handle in torchx run's output:\n{out}"
    return match.group(1)


def status_text(handle: str) -> str:
    return torchx("status", handle).stdout


def wait_for(handle: str, states: tuple[str, ...], timeout_s: float = 180) -> str:
    """``torchx status``'s text once the job is in one of ``states``."""

    def reached() -> str | None:
        text = status_text(handle)
        return text if re.search(rf"State: ({'|'.join(states)})\b", text) else None

    return wait_until(
        reached,
        what=f"{handle} in {states}",
        timeout_s=timeout_s,
        every_s=1,
        detail=lambda: status_text(handle) + torchx("log", handle, check=False).stdout,
    )


def wait_for_log(handle: str, pattern: str, count: int) -> List[str]:
    """The lines of the job's log once ``count`` of them match ``pattern``."""

    def lines() -> List[str]:
        return torchx("log", f"{handle}/main").stdout.splitlines()

    def enough() -> List[str] | None:
        found = lines()
        return found if len([ln for ln in found if re.search(pattern, ln)]) >= count else None

    return wait_until(
        enough,
        what=f"{count} lines of the job's log matching {pattern!r}",
        every_s=1,
        detail=lambda: "\n".join(lines()),
    )


def leftovers(client: Any, app_id: str) -> List[str]:
    label = {"label": f"{LABEL_APP_ID}={app_id}"}
    return (
        [c.name for c in client.containers.list(all=True, filters=label)]
        + [n.name for n in client.networks.list(filters=label)]
        + [v.name for v in client.volumes.list(filters=label)]
    )


@pytest.fixture
def handles(docker_image: str) -> Iterator[List[str]]:
    """App handles a test started; whatever is left of them is removed afterwards."""
    started: List[str] = []
    yield started
    scheduler = create_scheduler("torchx")
    for handle in started:
        scheduler.delete(handle.rsplit("/", 1)[1])


def test_2x2_runs_in_two_containers_with_world_size_4(
    handles: List[str], docker_client: Any, tmp_path: Path
) -> None:
    secret_env = tmp_path / "secret.env"
    secret_env.write_text("WANDB_API_KEY=k-never-in-the-config\n")
    handle = run_job(
        "-j", "2x2", "--script", "examples/main.py", cfg=f"secret_env_file={secret_env}"
    )  # fmt: skip
    handles.append(handle)
    app_id = handle.rsplit("/", 1)[1]
    text = wait_for(handle, ("SUCCEEDED", "FAILED"))
    assert "State: SUCCEEDED" in text, text
    assert " *main[0]:SUCCEEDED" in text and "  main[1]:SUCCEEDED" in text

    lines = torchx("log", f"{handle}/main").stdout.splitlines()
    ranks = sorted(
        int(m.group(1)) for m in (re.search(r"rank (\d) of world size 4", x) for x in lines) if m
    )
    assert ranks == [0, 1, 2, 3], lines
    # one replica's log: only node 1's ranks, as whole lines
    replica1 = torchx("log", f"{handle}/main/1").stdout.splitlines()
    assert sorted(re.findall(r"rank (\d) of world size 4", "\n".join(replica1))) == ["2", "3"]
    assert "stdout" not in torchx("log", "--streams", "stderr", f"{handle}/main/1").stdout

    # the two containers reached each other by name over the job's own network
    names = sorted(
        c.name
        for c in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_APP_ID}={app_id}"}
        )
    )
    assert names == [f"{app_id}-main-0", f"{app_id}-main-1"]
    container = docker_client.containers.get(names[1])
    assert container.attrs["Config"]["Env"].count(f"{RANK0_ENV}={names[0]}") == 1
    # the secret env file is in the container, its values are not in its config
    assert "k-never-in-the-config" not in json.dumps(container.attrs)
    chunks, _ = container.get_archive("/tmp/torchx-elastic-secret.env")
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        (member,) = archive.getmembers()
        assert member.mode & 0o777 == 0o444
        assert archive.extractfile(member).read() == secret_env.read_bytes()  # type: ignore[union-attr]
    assert f"torchx-{app_id}" in container.attrs["NetworkSettings"]["Networks"]
    assert app_id in torchx("list", "-s", "docker").stdout

    # follow (-t) ends with the container; since: nothing was written after the job ended
    assert "done: 20 steps" in torchx("log", "-t", f"{handle}/main/0").stdout
    scheduler = create_scheduler("torchx")
    after = datetime.now(timezone.utc) + timedelta(seconds=2)
    assert list(scheduler.log_iter(app_id, "main", 0, since=after)) == []

    # a finished job's containers stay for status and logs until removed
    subprocess.run(
        [sys.executable, "-m", "torchx_elastic.schedulers.docker", "remove", app_id], check=True
    )
    assert leftovers(docker_client, app_id) == []


PROGRESS = re.compile(
    r"progress (\d+)/100000 \([\d.]+%\) of 4/4 ranks, [\d.]+ steps/s, ETA \w+"
    r" \(as of \w+ ago, log of (\S+)\)"
)


def test_status_shows_the_progress_of_the_whole_job(handles: List[str]) -> None:
    handle = run_job(
        "-j", "2x2", "--script", "examples/progress.py",
        "--", "--steps", "100000", "--step-s", "0.02", "--log-every", "100000",
    )  # fmt: skip
    handles.append(handle)
    app_id = handle.rsplit("/", 1)[1]
    seen: List[int] = []
    deadline = time.monotonic() + 240
    text = ""
    while len(seen) < 2 and time.monotonic() < deadline:
        text = status_text(handle)
        assert "State: FAILED" not in text, text
        match = PROGRESS.search(text)
        if match and (not seen or int(match[1]) > seen[-1]):
            # the rank-0 agent's container (the role is named after the script)
            assert match[2] == f"{app_id}-progress-0", text
            seen.append(int(match[1]))
        time.sleep(2)
    assert len(seen) == 2, f"no progress (or no new progress) in torchx status:\n{text}"
    assert "State: RUNNING" in text


def test_a_spare_stands_by_shown_in_status_and_ends_with_the_job(
    handles: List[str], docker_client: Any
) -> None:
    """-j 2x1 --spares 1: three containers, two train and one stands by; torchx status counts
    it while the job runs, and every container exits 0 with the job."""
    handle = run_job(
        "-j", "2x1", "--spares", "1", "--script", "examples/progress.py",
        "--", "--steps", "1500", "--step-s", "0.02", "--log-every", "100000",
    )  # fmt: skip
    handles.append(handle)
    app_id = handle.rsplit("/", 1)[1]
    wait_until(
        lambda: "nodes: 2 training, 1 standby" in status_text(handle),
        what="the standby in torchx status",
        every_s=1,
        detail=lambda: status_text(handle),
    )
    text = wait_for(handle, ("SUCCEEDED", "FAILED"))
    log = torchx("log", f"{handle}/progress").stdout  # the role is named after the script
    assert "State: SUCCEEDED" in text, text + log
    assert len(re.findall(r"torchx-elastic: standing by: the job has its 2 nodes", log)) >= 1, log
    assert "stood by as a spare, so this node exits without training" in log
    label = {"label": f"{LABEL_APP_ID}={app_id}"}
    codes = [
        c.attrs["State"]["ExitCode"] for c in docker_client.containers.list(all=True, filters=label)
    ]
    assert codes == [0, 0, 0], codes


def test_cancel_keeps_status_and_logs_delete_leaves_nothing(
    handles: List[str], docker_client: Any
) -> None:
    handle = run_job("-j", "2x1", "--script", "examples/main.py", *LONG_RUN)
    handles.append(handle)
    app_id = handle.rsplit("/", 1)[1]
    wait_for_log(handle, r"of world size 2", 2)
    assert len(leftovers(docker_client, app_id)) == 3
    torchx("cancel", handle)  # (how long it takes is a speed: bench/)
    # as torchx's local_docker: stopped, not removed; status and logs stay
    status = torchx("status", handle).stdout
    assert "State: CANCELLED" in status, status
    assert "of world size 2" in torchx("log", f"{handle}/main/0").stdout
    # removal: `torchx delete` on torchx's development line, this command on 0.7
    subprocess.run(
        [sys.executable, "-m", "torchx_elastic.schedulers.docker", "remove", app_id], check=True
    )
    assert leftovers(docker_client, app_id) == []
    gone = torchx("status", handle, check=False)
    assert gone.returncode == 1 and "does not exist" in gone.stderr


def test_killed_replica_fails_the_job_with_the_root_cause(
    handles: List[str], docker_client: Any
) -> None:
    # max_retries=1: rank 0's agent would wait for the lost node in the rendezvous;
    # the scheduler stops it as soon as the job cannot meet min_replicas any more
    handle = run_job("-j", "2x1", "--max_retries", "1", "--script", "examples/main.py", *LONG_RUN)
    handles.append(handle)
    app_id = handle.rsplit("/", 1)[1]
    wait_for_log(handle, r"of world size 2", 2)
    docker_client.containers.get(f"{app_id}-main-1").kill()
    text = wait_for(handle, ("FAILED",))
    assert (
        f"Msg: main[1] (container {app_id}-main-1) failed first: exit code 137 (killed by SIGKILL"
        in text
    ), text
    assert f"its log: torchx log docker://torchx/{app_id}/main/1" in text
    assert "main[1]:FAILED (exitcode: 137)" in text
    wait_until(
        lambda: docker_client.containers.get(f"{app_id}-main-0").status == "exited",
        what="replica 0 stopped",
        every_s=0.5,
    )


def test_worker_failure_restarts_in_place_with_max_retries(handles: List[str]) -> None:
    handle = run_job(
        "-j",
        "2x1",
        "--max_retries",
        "1",
        "--mounts",
        f"type=bind,src={SCRIPTS},dst=/tests,readonly",
        "--script",
        "/tests/fail_once.py",
    )
    handles.append(handle)
    text = wait_for(handle, ("SUCCEEDED", "FAILED"))
    log = torchx("log", f"{handle}/fail_once").stdout  # the role is named after the script
    assert "State: SUCCEEDED" in text, text + log
    assert "rank 1 fails on purpose on attempt 0" in log
    assert re.search(r"attempt 1: rank \d of world size 2", log), log
    # said once for the job, by the node whose rank failed
    restart = re.findall(
        r"torchx-elastic: rank 1 \(node \d\) failed: exit code 1; restarting every node:"
        r" attempt 2 of 2 \(0 restarts left\), rendezvous round 2 next",
        log,
    )
    assert len(restart) == 1, log


def test_status_names_the_jobs_first_failure(handles: List[str]) -> None:
    handle = run_job(
        "-j",
        "2x1",
        "--mounts",
        f"type=bind,src={SCRIPTS},dst=/tests,readonly",
        "--script",
        "/tests/raise_on_last_rank.py",
    )
    handles.append(handle)
    text = wait_for(handle, ("SUCCEEDED", "FAILED"))
    assert "State: FAILED" in text, text
    first = re.search(
        r"failed first: exit code 1: (rank 1 \(node \d\) failed first:"
        r" ValueError: the last rank gives up); its log",
        text,
    )
    assert first, text

    # both nodes name it last (the second may still be ending when the job is FAILED)
    def named_by_both() -> str | None:
        log = torchx("log", f"{handle}/raise_on_last_rank").stdout
        return log if log.count(f"torchx-elastic: job failed: {first[1]}") == 2 else None

    log = wait_until(named_by_both, what="the job's first failure named by both nodes", every_s=1)
    assert log.count("Root cause") == 1, log


# -- errors from the real engine ------------------------------------------------------------


def plain_app(image: str, entrypoint: str = "python3") -> specs.AppDef:
    role = specs.Role(name="r", image=image, entrypoint=entrypoint, args=["-c", "print(1)"])
    return specs.AppDef(name="plain", roles=[role])


@pytest.fixture
def scheduler(docker_image: str) -> DockerScheduler:
    return create_scheduler("torchx")


def test_missing_image_that_cannot_be_pulled(scheduler: DockerScheduler) -> None:
    with pytest.raises(ImageMissingError) as error:
        scheduler.submit(plain_app("torchx-elastic-no-such-image:1"), {})
    message = str(error.value)
    assert message.startswith(
        "image 'torchx-elastic-no-such-image:1' is not in the local Docker engine and pulling"
        " it failed: "
    )
    assert message.endswith(
        "; build it with docker/build-image.sh (torchx-elastic:latest, no registry needed),"
        " or docker load / docker pull it"
    )


def test_container_that_fails_to_start(scheduler: DockerScheduler, docker_client: Any) -> None:
    with pytest.raises(ContainerStartError) as error:
        scheduler.submit(plain_app("torchx-elastic:latest", entrypoint="no-such-program"), {})
    message = str(error.value)
    assert re.match(r"container plain-\w+-r-0 \(r\[0\]\) failed to start: ", message), message
    assert "no-such-program" in message and "executable file not found" in message
    assert message.endswith("The job's containers and network were removed")
    app_id = message.split()[1].rsplit("-r-0", 1)[0]
    assert leftovers(docker_client, app_id) == []


def test_name_clash(
    scheduler: DockerScheduler, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "torchx_elastic.schedulers.docker.scheduler.make_unique", lambda name: "clash-test1"
    )
    squatter = docker_client.containers.create("torchx-elastic:latest", name="clash-test1-r-0")
    try:
        with pytest.raises(
            NameClashError, match=r"^container name\(s\) already in use: clash-test1-r-0 "
        ):
            scheduler.submit(plain_app("torchx-elastic:latest"), {})
    finally:
        squatter.remove(force=True)


FT_STEPS = 300  # about 30 s: group 0 still trains when group 1 is back, under load too
FT_STEP = re.compile(r"group (\d) step (\d+) quorum (\d+) loss \S+ t ([0-9.]+)")
FT_START = re.compile(r"group (\d) rank (\d) pid (\d+) attempt (\d+)")


def test_ft_ddp_a_killed_worker_restarts_its_group_alone(
    handles: List[str], docker_client: Any
) -> None:
    """ft.ddp, 2 groups x (1x2), one container per group: a worker of group 1 is SIGKILLed
    mid-run. Group 1's agent restarts it in its container (spawn: a restart of seconds);
    group 0 never restarts and its steps never go back; torchx status shows group 1
    recovering then both groups training; the job SUCCEEDS with both at the last step."""
    handle = run_job(
        "--replica_groups", "2", "-j", "1x2", "--max_retries", "2", "--start_method", "spawn",
        "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000",
        "--script", "examples/ft_ddp.py", "--", "--steps", str(FT_STEPS), "--step-s", "0.1",
        component="ft.ddp",
    )  # fmt: skip
    handles.append(handle)
    app_id = handle.rsplit("/", 1)[1]
    scheduler = create_scheduler("torchx")

    def log(group: int) -> str:
        return torchx("log", f"{handle}/group{group}", check=False).stdout

    def steps(group: int) -> List[tuple[int, int, float]]:
        found = (m for m in FT_STEP.finditer(log(group)) if int(m[1]) == group)
        return [(int(m[2]), int(m[3]), float(m[4])) for m in found]

    deadline = time.monotonic() + 240
    text = ""
    # joint steps, and the groups' agents' first [job progress] lines (every 5 s)
    while sum(q == 2 for _, q, _ in steps(1)) < 5 or "job progress " not in text:
        assert time.monotonic() < deadline, text + log(0) + log(1)
        time.sleep(1)
        text = status_text(handle)
    assert re.search(r"group0: RUNNING; training \(in quorum \d+\)", text), text
    assert re.search(r"group1: RUNNING; training \(in quorum \d+\)", text), text
    assert "job progress " in text and " of 2 groups: " in text, text
    starts = [m for m in FT_START.finditer(log(1)) if m[1] == "1" and m[2] == "1"]
    result = docker_client.containers.get(container_name(app_id, "group1", 0)).exec_run(
        ["sh", "-c", f"kill -9 {starts[0][3]}"]
    )
    assert result.exit_code == 0, result.output
    # group 1 restarts in its container: the status says so until it is back in the quorum
    said: List[str] = []

    def back_in_quorum() -> bool:
        """Group 1's restarted rank 0 committed a step with both groups."""
        text = log(1)
        restarted = re.search(r"group 1 rank 0 pid \d+ attempt [1-9]", text)
        later = FT_STEP.finditer(text[restarted.end() :]) if restarted else iter(())
        return any(m[3] == "2" for m in later)

    while not back_in_quorum():
        assert time.monotonic() < deadline + 120, "\n".join(said) + log(1)
        desc = scheduler.describe(app_id)
        assert desc is not None and desc.state == specs.AppState.RUNNING, desc
        said.append(desc.msg)
    # what torchx status said while group 1 recovered, where a poll caught it: a poll reads
    # both containers through the engine, and under load one can take longer than a restart
    # by spawn (the recovering state itself is asserted on the Kubernetes node, where the
    # replaced pod takes longer: tests/kubernetes/test_real_node.py)
    recovering = [m for m in said if "group1: RUNNING; recovering (not in quorum" in m]
    print(f"[ft docker] torchx status while group 1 recovered: {recovering[-1:]}")
    for text in recovering:
        assert "group0: RUNNING; training (in quorum" in text, text
    text = wait_for(handle, ("SUCCEEDED", "FAILED"), timeout_s=240)
    assert "State: SUCCEEDED" in text, text + log(0) + log(1)
    for role in ("lighthouse", "group0", "group1"):
        assert f"{role}: SUCCEEDED" in text, text
    group0 = [step for step, _, _ in steps(0)]
    assert group0 == list(range(group0[0], FT_STEPS + 1)), group0  # never back, never stopped
    attempts = {g: {m[4] for m in FT_START.finditer(log(g))} for g in (0, 1)}
    assert attempts == {0: {"0"}, 1: {"0", "1"}}, attempts
    assert steps(1)[-1][0] == FT_STEPS
