"""Request building: golden files of the dry-run request, no engine needed.

Regenerate the golden files on purpose only: ``UPDATE_GOLDEN=1 pytest tests/docker``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torchx.specs as specs
from docker.types import DeviceRequest, Mount

from torchx_elastic.components.dist import ddp
from torchx_elastic.contract import RANK0_ENV
from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.docker.request import build_job, container_name, network_name
from torchx_elastic.schedulers.names import dns_label

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run UPDATE_GOLDEN=1 pytest tests/docker"
    assert text == path.read_text(), f"request differs from {path} (UPDATE_GOLDEN=1 on purpose)"


def trainer_app() -> specs.AppDef:
    return specs.AppDef(
        name="trainer",
        roles=[
            specs.Role(
                name="trainer",
                image="my/image:1",
                entrypoint="python3",
                args=[
                    "-m",
                    "train",
                    "--host",
                    f"${{{specs.macros.rank0_env}}}",
                    "--rid",
                    "${replica_id}",
                ],
                min_replicas=2,
                num_replicas=3,
                max_retries=2,
                resource=specs.Resource(
                    cpu=4, gpu=2, memMB=2048, devices={"vpc.amazonaws.com/efa": 1}
                ),
                env={"FROM_ROLE": "role", "SHARED": "role wins"},
                mounts=specs.parse_mounts(
                    [
                        "type=bind",
                        "src=/data",
                        "dst=/data",
                        "readonly",
                        "type=volume",
                        "src=ckpt",
                        "dst=/ckpt",
                        "type=device",
                        "src=/dev/fuse",
                    ]
                ),
            )
        ],
    )


def test_ddp_2x2_request_matches_golden_file() -> None:
    app = ddp(script="examples/main.py", j="2x2")
    job = build_job(app, DockerOptions(), "main-abc123", host_env={"HOME": "/root"})
    assert_golden("ddp_2x2.yaml", str(job))


def test_request_with_every_option_matches_golden_file() -> None:
    options = DockerOptions(
        copy_env=("NCCL_*", "SHARED"),
        env={"FROM_OPTION": "option", "SHARED": "option"},
        image_pull="never",
        shm_size_mb=512,
        stop_timeout_s=5,
        restart_containers=True,
        privileged=True,
    )
    host_env = {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1", "HOME": "/root", "SHARED": "host"}
    job = build_job(trainer_app(), options, "trainer-xyz789", host_env)
    assert_golden("trainer_every_option.yaml", str(job))


def test_every_replica_names_replica_0_as_rank0_host() -> None:
    job = build_job(ddp(script="main.py", j="3x1"), DockerOptions(), "main-abc123", {})
    names = [c.name for c in job.containers]
    assert names == ["main-abc123-main-0", "main-abc123-main-1", "main-abc123-main-2"]
    assert all(c.hostname == c.name for c in job.containers)
    assert {c.environment[RANK0_ENV] for c in job.containers} == {"main-abc123-main-0"}
    # the agent expands the variable itself: the command names it, no shell involved
    assert f"${{{RANK0_ENV}:-localhost}}:29500" in job.containers[1].command


def test_env_precedence_is_copy_env_then_env_option_then_role_env() -> None:
    options = DockerOptions(copy_env=("SHARED", "ONLY_HOST"), env={"SHARED": "option"})
    job = build_job(trainer_app(), options, "t-1", {"SHARED": "host", "ONLY_HOST": "h"})
    env = job.containers[0].environment
    assert env["ONLY_HOST"] == "h"
    assert env["SHARED"] == "role wins"
    assert env[RANK0_ENV] == "t-1-trainer-0"


def test_user_args_with_dollar_reach_the_container_unchanged() -> None:
    app = ddp("--price", "$5", "${HOME}", script="main.py", j="2x1")
    job = build_job(app, DockerOptions(), "main-1", {})
    assert job.containers[0].command[-2:] == ["$5", "${HOME}"]


def test_restart_policy_follows_max_retries_when_enabled() -> None:
    restarting = DockerOptions(restart_containers=True)
    job = build_job(trainer_app(), restarting, "t-1", {})
    kwargs = job.containers[0].create_kwargs(job.network)
    assert kwargs["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 2}
    job = build_job(trainer_app(), DockerOptions(), "t-1", {})  # off by default
    assert "restart_policy" not in job.containers[0].create_kwargs(job.network)
    job = build_job(ddp(script="main.py", j="2x1"), restarting, "m-1", {})  # max_retries=0
    assert "restart_policy" not in job.containers[0].create_kwargs(job.network)


def test_create_kwargs_are_docker_py_types() -> None:
    job = build_job(trainer_app(), DockerOptions(shm_size_mb=512), "t-1", {})
    kwargs = job.containers[0].create_kwargs(job.network)
    assert kwargs["network"] == "torchx-t-1"
    assert kwargs["mounts"] == [
        Mount(target="/data", source="/data", type="bind", read_only=True),
        Mount(target="/ckpt", source="ckpt", type="volume", read_only=False),
    ]
    assert "/dev/fuse:/dev/fuse:rwm" in kwargs["devices"]
    assert "/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm" in kwargs["devices"]
    assert kwargs["device_requests"] == [
        DeviceRequest(count=2, capabilities=[["compute", "utility"]])
    ]
    assert kwargs["nano_cpus"] == 4_000_000_000
    assert kwargs["mem_limit"] == "2048m"
    assert kwargs["shm_size"] == "512m"
    assert kwargs["labels"]["torchx-elastic/stop-timeout-s"] == "10"


def test_shm_size_defaults_to_memMB() -> None:
    job = build_job(ddp(script="main.py", j="2x1", memMB=3000), DockerOptions(), "m-1", {})
    assert job.containers[0].create_kwargs(job.network)["shm_size"] == "3000m"


@pytest.mark.parametrize(
    ("app_id", "role"),
    [("a" * 80 + "-uniq123", "trainer"), ("My_App.v2-x1", "Role_With.Dots"), ("x-1", "r" * 70)],
)
def test_names_are_valid_hostnames_that_keep_the_unique_tail(app_id: str, role: str) -> None:
    name = container_name(app_id, role, 12)
    assert len(name) <= 63
    assert name == dns_label(name)
    assert name.endswith("-12")
    assert dns_label(app_id)[-6:] in name
    assert len(network_name(app_id)) <= 63


def test_dns_label_lowercases_and_replaces_other_characters() -> None:
    assert dns_label("My_App.v2--x") == "my-app-v2-x"
    assert dns_label("__a__") == "a"
