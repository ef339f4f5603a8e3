"""The real torchx CLI (``torchx run/status/log/list/cancel -s kubernetes``) against the
fake cluster, through a generated kubeconfig, as a user would drive it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from torchx.cli.argparse_util import ArgOnceAction, torchxconfig
from torchx.cli.main import main as torchx_main

from tests.kubernetes.conftest import SUFFIX
from tests.kubernetes.fake_api import FakeCluster
from tests.kubernetes.validation import validate_all
from torchx_elastic.contract import RANK0_ENV

JOB = f"main-{SUFFIX}"
HANDLE = f"kubernetes://torchx/default:{JOB}"
# the image has the script: no workspace to build and push (see tests/workspace/)
RUN = ["run", "--workspace", "", "-s", "kubernetes", "dist.ddp", "-j", "2:4x8", "-h", "gpu.small"]


@pytest.fixture(autouse=True)
def _isolated(fake: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .torchxconfig of the checkout
    monkeypatch.setattr("torchx_elastic.schedulers.kubernetes.names.new_suffix", lambda: SUFFIX)
    # torchx's CLI remembers flags across calls in one process (class-level sets)
    for action in (ArgOnceAction, torchxconfig):
        monkeypatch.setattr(action, "called_args", set())


def _torchx(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``torchx *argv`` in this process, as if in a fresh one; returns its stdout."""
    ArgOnceAction.called_args.clear()
    torchxconfig.called_args.clear()
    capsys.readouterr()
    torchx_main(list(argv))
    return capsys.readouterr().out


def test_dryrun_prints_yaml_that_kubectl_apply_accepts() -> None:
    """A real ``torchx`` process; the YAML after the header is the request, as it is."""
    result = subprocess.run(
        [
            Path(sys.executable).parent / "torchx",
            *RUN[:1],
            "--dryrun",
            *RUN[1:],
            "--script",
            "main.py",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TORCHX_CONTEXT_NAME": "test"},
    )
    request = result.stdout.split("=== SCHEDULER REQUEST ===\n", 1)[1]
    job, service, secret, policy = yaml.safe_load_all(request)
    validate_all([job, service, secret, policy])
    name = job["metadata"]["name"]
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env[RANK0_ENV] == f"{name}-0.{name}.default.svc"
    assert env["TORCHX_JOB_ID"] == f"kubernetes://torchx/default:{name}"


def test_a_torchx_process_submits_to_the_fake_cluster(fake: FakeCluster, tmp_path: Path) -> None:
    """A fresh ``torchx`` process: entry point, kubeconfig, submit and first status."""
    result = subprocess.run(
        [Path(sys.executable).parent / "torchx", *RUN, "--script", "main.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    (handle,) = result.stdout.split()
    name = handle.rpartition(":")[2]
    assert handle.startswith("kubernetes://torchx/default:main-")
    assert len(fake.pods(name)) == 4 and ("default", name) in fake.objects["services"]
    assert "State: PENDING" in result.stderr


def _run(capsys: pytest.CaptureFixture[str], fake: FakeCluster) -> None:
    assert _torchx(capsys, *RUN, "--script", "main.py").strip() == HANDLE
    assert len(fake.pods(JOB)) == 4


def test_run_wait_of_a_job_the_cluster_refuses_ends_with_the_reason(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """run's first status deletes the refused Job; --wait still reads why it failed (torchx
    raised 'unknown status, wait returned None' for a job that is gone)."""
    fake.refuse_pods = f'pods "{JOB}-0-abcde" is forbidden: exceeded quota: team'
    with pytest.raises(SystemExit) as exit_:
        _torchx(capsys, *RUN[:1], "--wait", *RUN[1:], "--script", "main.py")
    assert exit_.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # torchx's own: the final AppStatus, as YAML
    status = " ".join(errors[0].split())
    assert "state: FAILED" in status, status
    assert "the cluster refused to create the job''s pods: pods" in status, status
    assert "is forbidden: exceeded quota: team" in status, status
    assert ("default", JOB) not in fake.objects["jobs"]


def _start_all(fake: FakeCluster) -> None:
    for index in range(4):
        pod = fake.pod(JOB, index)
        fake.set_phase(pod, "Running")
        fake.write_log(pod, f"[{index}]: hel".encode())
        fake.write_log(pod, b"lo\n")


def test_run_then_status_shows_why_pods_do_not_start(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _run(capsys, fake)
    assert "State: PENDING" in caplog.text  # torchx run prints the first status

    # an image that cannot be pulled shows on the next status call
    fake.wait_image(fake.pod(JOB, 3))
    status = _torchx(capsys, "status", HANDLE)
    assert "State: PENDING" in status
    pod3 = fake.pod(JOB, 3)["metadata"]["name"]
    assert (
        f'Msg: main[3] pod {pod3}: ImagePullBackOff: Back-off pulling image "torchx-elastic:latest"'
    ) in status

    _start_all(fake)
    status = _torchx(capsys, "status", HANDLE)
    assert "State: RUNNING" in status and " *main[0]:RUNNING" in status


def test_log_per_replica_and_per_role(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(capsys, fake)
    _start_all(fake)
    out = _torchx(capsys, "log", f"{HANDLE}/main/2")
    assert out.splitlines() == ["main/2 [2]: hello"]
    out = _torchx(capsys, "log", f"{HANDLE}/main")
    assert sorted(out.splitlines()) == [f"main/{i} [{i}]: hello" for i in range(4)]


def test_log_tail_follows_until_the_pod_ends(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(capsys, fake)
    _start_all(fake)
    follower = threading.Thread(target=torchx_main, args=(["log", "--tail", f"{HANDLE}/main/0"],))
    follower.start()
    fake.write_log(fake.pod(JOB, 0), b"[0]: step 1\n")
    fake.set_phase(fake.pod(JOB, 0), "Succeeded")
    follower.join(timeout=60)  # a bound on a hang, not a speed
    assert not follower.is_alive()
    assert capsys.readouterr().out.splitlines() == ["main/0 [0]: hello", "main/0 [0]: step 1"]


def test_list_then_cancel_then_status_of_the_deleted_job(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    _run(capsys, fake)
    _start_all(fake)
    listed = _torchx(capsys, "list", "-s", "kubernetes")
    assert f"default:{JOB}" in listed and "RUNNING" in listed

    _torchx(capsys, "cancel", HANDLE)
    assert fake.objects["jobs"] == {} and fake.objects["services"] == {} and fake.pods(JOB) == []

    caplog.clear()
    with pytest.raises(SystemExit) as exit_:
        _torchx(capsys, "status", HANDLE)
    assert exit_.value.code == 1
    assert (
        f"AppDef: default:{JOB}, does not exist or has been removed from kubernetes's data plane"
        in caplog.text
    )


def test_run_options_from_the_command_line(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = "queue=team-q,tolerations=nvidia.com/gpu:NoSchedule,secret_env=HF_TOKEN:hf/token"
    _torchx(capsys, *RUN[:5], "-cfg", cfg, *RUN[5:], "--script", "main.py")
    job = fake.objects["jobs"][("default", JOB)]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    spec = job["spec"]["template"]["spec"]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def _error(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *argv: str) -> str:
    """``torchx *argv`` that fails as torchx's own errors do: exit code 1, one ERROR record
    (no exception, so no traceback); returns that record's message."""
    caplog.clear()
    with pytest.raises(SystemExit) as exit_:
        _torchx(capsys, *argv)
    assert exit_.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_bad_run_option_value_is_one_line_that_says_what_is_accepted(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    message = _error(
        capsys, caplog, *RUN[:5], "-cfg", "backend=kueue", *RUN[5:], "--script", "m.py"
    )
    assert (
        message
        == "invalid kubernetes run option backend='kueue'; accepted: job, volcano (default: job)"
    )
    ttl = "ttl_seconds_after_finished=soon"
    message = _error(capsys, caplog, *RUN[:5], "-cfg", ttl, *RUN[5:], "--script", "m.py")
    assert message == (
        f"-cfg {ttl}: a kubernetes run option has a value of the wrong type (invalid literal"
        " for int() with base 10: 'soon'); `torchx runopts kubernetes` lists the options with"
        " their types and defaults"
    )
    for bad in ("secret_env=WANDB_API_KEY", "node_selector=gpu"):
        message = _error(capsys, caplog, *RUN[:5], "-cfg", bad, *RUN[5:], "--script", "m.py")
        assert message == (
            f"-cfg {bad}: a kubernetes run option has a value of the wrong type (a mapping"
            " option takes KEY:VALUE items: KEY1:v1,KEY2:v2); `torchx runopts kubernetes`"
            " lists the options with their types and defaults"
        )


def test_a_device_mount_without_the_privileged_option_is_one_line(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    message = _error(
        capsys, caplog, *RUN, "--mounts", "type=device,src=/dev/fuse", "--script", "m.py"
    )
    assert message.startswith("device mount /dev/fuse needs a privileged container"), message


def test_forbidden_through_the_cli(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    fake.forbid("get", "jobs")
    assert _error(capsys, caplog, "status", HANDLE).startswith(
        f"cannot read Job {JOB} in namespace default: forbidden (jobs.batch is forbidden:"
        ' User "alice" cannot get resource "jobs"'
    )


def test_a_namespace_that_does_not_exist(
    fake: FakeCluster, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    fake.namespaces = {"default"}
    message = _error(
        capsys, caplog, *RUN[:5], "-cfg", "namespace=ml", *RUN[5:], "--script", "main.py"
    )
    assert message == (
        f"cannot create Job {JOB} in namespace ml: the namespace ml does not exist; create it"
        " (kubectl create namespace ml) or choose another with -cfg namespace=NAME"
    )


def test_no_kubeconfig_on_run_status_log_and_cancel(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nowhere"))
    expected = (
        f"no usable Kubernetes configuration ({tmp_path / 'nowhere'}): Invalid kube-config"
        " file. No configuration found. Point KUBECONFIG at a kubeconfig file (e.g. one"
        " written by your cloud's get-credentials command) or run inside the cluster with a"
        " service account"
    )
    for argv in (
        [*RUN, "--script", "m.py"],
        ["status", HANDLE],
        ["log", HANDLE],
        ["log", f"{HANDLE}/main/0"],
        ["cancel", HANDLE],
        ["list", "-s", "kubernetes"],
    ):
        assert _error(capsys, caplog, *argv) == expected, argv


def test_a_bad_app_id_and_the_log_of_a_job_that_is_gone(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert _error(capsys, caplog, "status", "kubernetes://torchx/main-x") == (
        "invalid kubernetes app id 'main-x': expected NAMESPACE:JOB (e.g."
        " default:train-bcdfghjk), as printed by torchx run"
    )
    # torchx's log of a whole app would wait for it to start, forever
    assert _error(capsys, caplog, "log", HANDLE) == (
        f"AppDef: default:{JOB}, does not exist or has been removed from kubernetes's data plane"
    )


def test_a_workspace_without_image_repo_in_a_torchx_process(tmp_path: Path) -> None:
    """The first command of a new user (a project directory is the workspace): one line
    with both fixes, torchx's exit code, no traceback."""
    (tmp_path / "hello.py").write_text("print('hello')\n")
    result = subprocess.run(
        [Path(sys.executable).parent / "torchx", "run", "-s", "kubernetes", "dist.ddp",
         "-j", "2x1", "--script", "hello.py"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"kubernetes: the workspace file://{tmp_path} must be pushed to a registry the cluster"
        " pulls from; set -cfg image_repo=REGISTRY/REPO (e.g."
        " image_repo=localhost:5000/me/train), or pass --workspace '' to run the role's image"
        " as it is"
    ), result.stderr


def test_runopts_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    out = _torchx(capsys, "runopts", "kubernetes")
    for option in ("namespace", "backend", "queue", "tolerations", "secret_env"):
        assert f"{option}={option.upper()} (" in out
