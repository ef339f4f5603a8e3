"""A rank killed by the kernel's OOM killer is named out of memory: the kill counts read from
cgroup v1, cgroup v2 and /proc/vmstat (a fake root here), and the report's policy."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from torchx_elastic.agent.console.failure import oom, report
from torchx_elastic.agent.console.failure.report import RankFailure, classify

SIGTERM, SIGKILL = -int(signal.SIGTERM), -int(signal.SIGKILL)
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill {}\noom_group_kill 0\n"
VMSTAT = "nr_free_pages 123\noom_kill {}\nunevictable_pgs_culled 0\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _host(root: Path, kills: int, cgroup_lines: str) -> None:
    _write(root / "proc/vmstat", VMSTAT.format(kills))
    _write(root / "proc/self/cgroup", cgroup_lines)


def test_cgroup_v1_own_path_with_its_limit(tmp_path: Path) -> None:
    _host(tmp_path, 7, "5:memory:/docker/abc\n1:cpu:/docker/abc\n")
    memcg = tmp_path / "sys/fs/cgroup/memory/docker/abc"
    _write(memcg / "memory.oom_control", V1_OOM_CONTROL.format(2))
    _write(memcg / "memory.limit_in_bytes", f"{1536 << 20}\n")
    assert oom.read_counts(str(tmp_path)) == oom.OomCounts(2, 7, 1536 << 20)


def test_cgroup_v1_seen_from_a_container_at_the_mount_without_a_limit(tmp_path: Path) -> None:
    """Without a cgroup namespace a container sees the host's path, but its own cgroup at
    the mount; v1 writes "no limit" as a number near 2**63."""
    _host(tmp_path, 0, "4:memory:/kubepods/pod1/c1\n0::/kubepods/pod1/c1\n")
    mount = tmp_path / "sys/fs/cgroup/memory"
    _write(mount / "memory.oom_control", V1_OOM_CONTROL.format(1))
    _write(mount / "memory.limit_in_bytes", "9223372036854771712\n")
    assert oom.read_counts(str(tmp_path)) == oom.OomCounts(1, 0, None)


def test_cgroup_v2_with_and_without_a_limit(tmp_path: Path) -> None:
    _host(tmp_path, 4, "0::/system.slice/train.service\n")
    mount = tmp_path / "sys/fs/cgroup"
    _write(mount / "cgroup.controllers", "cpu memory pids\n")
    own = mount / "system.slice/train.service"
    _write(own / "memory.events", V2_EVENTS.format(3))
    _write(own / "memory.max", f"{512 << 20}\n")
    assert oom.read_counts(str(tmp_path)) == oom.OomCounts(3, 4, 512 << 20)
    _write(own / "memory.max", "max\n")
    assert oom.read_counts(str(tmp_path)) == oom.OomCounts(3, 4, None)


def test_the_host_count_alone_where_no_cgroup_counts(tmp_path: Path) -> None:
    """The root cgroup of v2 has no memory.events; v1's has one that never counts."""
    _host(tmp_path, 9, "0::/\n")
    _write(tmp_path / "sys/fs/cgroup/cgroup.controllers", "memory\n")
    assert oom.read_counts(str(tmp_path)) == oom.OomCounts(None, 9, None)
    v1_root = tmp_path / "v1"
    _host(v1_root, 9, "4:memory:/\n0::/\n")
    _write(v1_root / "sys/fs/cgroup/memory/memory.oom_control", V1_OOM_CONTROL.format(0))
    assert oom.read_counts(str(v1_root)) == oom.OomCounts(None, 9, None)
    assert oom.read_counts(str(tmp_path / "nothing")) == oom.OomCounts(None, None, None)
    _host(tmp_path, 9, "not a cgroup line\n\n0::/\n")
    assert oom.read_counts(str(tmp_path)) == oom.OomCounts(None, 9, None)


def test_kills_between_prefers_the_cgroup_and_says_its_limit() -> None:
    before = oom.OomCounts(cgroup=1, host=10)
    assert oom.kills_between(before, oom.OomCounts(2, 11, 1536 << 20)) == (
        1,
        "in this node's memory cgroup, limit 1.5 GiB",
    )
    assert oom.kills_between(before, oom.OomCounts(3, 12, 512 << 20)) == (
        2,
        "in this node's memory cgroup, limit 512 MiB",
    )
    # a cgroup that counts and did not: another cgroup's process was killed
    assert oom.kills_between(before, oom.OomCounts(1, 12)) == (0, "")
    assert oom.kills_between(oom.OomCounts(None, 10), oom.OomCounts(None, 12)) == (
        2,
        "on this host",
    )
    assert oom.kills_between(oom.OomCounts(), oom.OomCounts(5, 5)) == (0, "")


def failure(rank: int, exitcode: int, exit_time_s: float, **kw: object) -> RankFailure:
    return RankFailure(
        rank=rank,
        local_rank=rank,
        node=0,
        pid=100 + rank,
        exitcode=exitcode,
        exit_time_s=exit_time_s,
        **kw,  # type: ignore[arg-type]
    )


MESSAGE = (
    "out of memory: the kernel's OOM killer sent SIGKILL (1 kill during the attempt in this"
    " node's memory cgroup, limit 1.5 GiB); give each node more memory, or use less per process"
    " (a smaller batch, fewer processes per node)"
)


def test_the_killed_rank_is_the_root_cause_out_of_memory_even_beside_a_lost_peer() -> None:
    """Its peer's traceback says it lost a peer; without the OOM count the killed rank would
    count as one the agent stopped, and the report would name no cause."""
    killed = failure(1, SIGKILL, 10.0)
    lost = failure(0, 1, 10.2, traceback="RuntimeError: Connection closed by peer")
    assert classify([lost, killed]).root_is_victim  # what the report said before
    facts = report.with_oom_kills([lost, killed], 1, "in this node's memory cgroup, limit 1.5 GiB")
    verdict = classify(facts)
    assert verdict.root is not None and verdict.root.rank == 1 and not verdict.root_is_victim
    assert verdict.root.message == MESSAGE
    assert [v.failure.rank for v in verdict.victims] == [0]
    assert f"  error: {MESSAGE}" in report.render(verdict, "/logs")


@pytest.mark.parametrize("kills", [1, 2])
def test_only_the_first_killed_ranks_are_said_out_of_memory(kills: int) -> None:
    """The agent's own SIGKILL (a rank that ignored its SIGTERM) comes later."""
    facts = [failure(2, SIGKILL, 20.0), failure(0, SIGKILL, 10.0), failure(1, SIGTERM, 10.5)]
    said = report.with_oom_kills(facts, kills, "on this host")
    assert sorted(f.rank for f in said if f.message.startswith("out of memory")) == [0, 2][:kills]
    assert said[2].message == ""
