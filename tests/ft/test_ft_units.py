"""ft.ddp without running a job, in this process: its AppDef, its errors, the Lighthouse
role's registry of the groups (served over HTTP, with the group launcher and the Lighthouse
role as real processes: tests/ft/test_ft_launcher.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

import pytest
import torchx.specs as specs

from torchx_elastic.components.dist_app import DistApp
from torchx_elastic.components.ft import INSTALL_HINT, ddp
from torchx_elastic.components.ft_app import FtApp, FtUsageError
from torchx_elastic.components.job_size import JobSize
from torchx_elastic.contract import (
    RANK0_ENV,
    ROLE_RANK0_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
)
from torchx_elastic.ft.lighthouse import GroupRegistry
from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.docker.request import build_job
from torchx_elastic.schedulers.local_cwd import create_scheduler


def _app(**kwargs: object) -> specs.AppDef:
    return ddp("--lr", "0.1", script="train.py", **kwargs)  # type: ignore[arg-type]


def test_one_lighthouse_role_then_one_role_per_group_each_with_its_own_rendezvous() -> None:
    app = _app(j="2x4", replica_groups=3, max_retries=5, rdzv_port=29600)
    assert [r.name for r in app.roles] == ["lighthouse", "group0", "group1", "group2"]
    lighthouse, *groups = app.roles
    assert lighthouse.num_replicas == 1
    assert lighthouse.port_map == {"lighthouse": 29510, "registry": 29511}
    assert lighthouse.args[:4] == ["-m", "torchx_elastic.ft.lighthouse", "--num_groups", "3"]
    for g, role in enumerate(groups):
        assert role.num_replicas == 2 and role.max_retries == 5
        assert role.env["REPLICA_GROUP_ID"] == str(g)
        assert role.env["NUM_REPLICA_GROUPS"] == "3"
        assert role.port_map == {"c10d": 29600 + g}
        agent = role.args[role.args.index("--") + 1 :]
        assert agent[:2] == ["-m", "torchx_elastic.agent"]
        # -j keeps its meaning inside a group; each group restarts on its own
        assert agent[agent.index("--nnodes") + 1] == "2"
        assert agent[agent.index("--nproc-per-node") + 1] == "4"
        assert agent[agent.index("--max-restarts") + 1] == "5"
        endpoint = agent[agent.index("--rdzv-endpoint") + 1]
        assert endpoint == f"$${{{ROLE_RANK0_ENV}:-localhost}}:{29600 + g}"
        assert agent[-3:] == ["train.py", "--lr", "0.1"]


def test_a_bare_process_count_is_one_node_per_group() -> None:
    group = _app(j="3").roles[1]
    assert group.num_replicas == 1
    assert group.args[group.args.index("--nproc-per-node") + 1] == "3"
    # its store and gloo listen where the other groups reach them (torchft's Manager hands
    # them MASTER_ADDR), on a free port: not on loopback as a one-node dist.ddp job's do
    endpoint = group.args[group.args.index("--rdzv-endpoint") + 1]
    assert endpoint == f"$${{{ROLE_RANK0_ENV}:-localhost}}:0"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replica_groups": 0}, "--replica_groups 0: expected 1 or more replica groups"),
        (
            {"replica_groups": 2, "min_replica_groups": 3},
            "--min_replica_groups 3: expected 1 to --replica_groups (2), the groups a step needs",
        ),
        (
            {"j": "1:2x2"},
            "-j 1:2x2: a replica group of ft.ddp has a fixed size, give -j NxM (nodes x"
            " processes of each group); --replica_groups and --min_replica_groups set how"
            " many groups train",
        ),
        (
            {"replica_groups": 12, "rdzv_port": 29500, "lighthouse_port": 29510},
            "--lighthouse_port 29510 (and 29511 for the groups' registry) overlaps the groups'"
            " rendezvous ports 29500..29511 (--rdzv_port + group): move one of them",
        ),
    ],
)
def test_bad_combinations_say_what_to_give(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(FtUsageError) as err:
        _app(**kwargs)
    assert str(err.value) == message


def test_a_group_of_another_rendezvous_backend_is_refused() -> None:
    """ft.ddp takes no --rdzv_backend; an FtApp built in code from a static group is refused."""
    group = DistApp(size=JobSize.parse("2x2"), script="train.py", m=None, rdzv_backend="static")
    with pytest.raises(FtUsageError) as err:
        FtApp(group=group, replica_groups=2)
    assert str(err.value) == (
        "--rdzv_backend static: ft.ddp's groups rendezvous with c10d (each group restarts on"
        " its own)"
    )


def test_without_torchft_the_component_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: Optional[str] = None) -> object:
        return None if name == "torchft" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    _app()
    assert capsys.readouterr().err.strip() == INSTALL_HINT
    assert "pip install 'torchx-elastic[ft]'" in INSTALL_HINT


def test_registry_states_and_the_end_of_every_group() -> None:
    registry = GroupRegistry(2)
    assert [registry.state(g) for g in (0, 1)] == ["waiting", "waiting"]
    registry.record(0, "0", "started")
    registry.record(0, "1", "started")
    registry.record(1, "0", "started")
    registry.record(0, "0", "ended", 0)
    assert registry.state(0) == "running"  # node 1 of group 0 still runs
    registry.record(0, "1", "ended", 0)
    registry.record(1, "0", "ended", 1)
    assert (registry.state(0), registry.state(1)) == ("succeeded", "failed")
    assert registry.all_ended()
    assert registry.summary() == "group0 succeeded, group1 failed"
    with pytest.raises(ValueError, match=r"no replica group 2: this app has 2 \(0\.\.\)"):
        registry.record(2, "0", "started")


def test_docker_and_local_cwd_give_each_role_its_own_rank0_host() -> None:
    app = _app(j="2x1")
    job = build_job(app, DockerOptions(), "ft-abc", {})
    hosts = {
        c.name: (
            c.environment[RANK0_ENV],
            c.environment[ROLE_RANK0_ENV],
        )
        for c in job.containers
    }
    assert hosts == {
        "ft-abc-lighthouse-0": ("ft-abc-lighthouse-0", "ft-abc-lighthouse-0"),
        "ft-abc-group0-0": ("ft-abc-lighthouse-0", "ft-abc-group0-0"),
        "ft-abc-group0-1": ("ft-abc-lighthouse-0", "ft-abc-group0-0"),
        "ft-abc-group1-0": ("ft-abc-lighthouse-0", "ft-abc-group1-0"),
        "ft-abc-group1-1": ("ft-abc-lighthouse-0", "ft-abc-group1-0"),
    }
    request = create_scheduler("test").submit_dryrun(app, {}).request
    for replicas in request.role_params.values():
        for replica in replicas:
            assert replica.env[ROLE_RANK0_ENV] == "127.0.0.1"


def test_a_group_launcher_whose_secret_file_cannot_be_read_says_so_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchx_elastic.ft import group

    missing = tmp_path / "no.secret"
    monkeypatch.setenv("REPLICA_GROUP_ID", "0")
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv(SECRET_FILE_ENV, str(missing))
    started = tmp_path / "started"
    # (it reports nothing, to no port)
    assert group.run("0", 1, ["-c", f"open({str(started)!r}, 'w')"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"torchx-elastic: error: {SECRET_FILE_ENV}={missing}: cannot read the job's secret"
        " (No such file or directory)"
    )
    assert not started.exists()
