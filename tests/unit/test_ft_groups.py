"""What torchx status and the console's bar say of ft.ddp's replica groups (pure parts)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from pathlib import Path

from rich.console import Console
from torchx.specs import AppState

from torchx_elastic.contract.job_progress import JobSummary, LineFigures, parse_line, write_file
from torchx_elastic.ft.lighthouse import Quorum, last_logged_quorum
from torchx_elastic.ft.protocol import member_group, role_group
from torchx_elastic.schedulers import ft_groups, role_status
from torchx_elastic.schedulers.file_lines import tail_lines
from torchx_elastic.schedulers.job_bar import _Bar
from torchx_elastic.schedulers.role_states import replicas_state, role_line
from torchx_elastic.schedulers.role_status import AppRoleStatus

NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=timezone.utc)
R, S, F = AppState.RUNNING, AppState.SUCCEEDED, AppState.FAILED


def _summary(step: int, ranks: int = 2, time_s: float = 0.0) -> JobSummary:
    return JobSummary(
        step=step, total=200, slowest_rank=1, slowest_node=0, fastest_rank=0, fastest_node=0,
        fastest_step=step, rate_per_s=5.0, eta_s=(200 - step) / 5.0, ranks_reporting=ranks,
        ranks=ranks, nodes_reporting=1, nodes=1, time_s=time_s,
    )  # fmt: skip


def _figures(step: int) -> LineFigures:
    return _summary(step).figures()


def test_a_quorum_member_is_the_group_its_replica_id_ends_with_as_torchft_numbers_them() -> None:
    assert member_group("ft_ddp_1") == 1
    assert member_group("train12:5f0c-uuid") == 12  # torchft's uuid suffix is not the id
    assert member_group("trainer") is None
    assert role_group("group3") == 3
    assert role_group("lighthouse") is None and role_group("group3x") is None


def test_the_last_logged_quorum_is_read_back_from_the_lighthouse_lines() -> None:
    quorum = Quorum(4, 9, ("ft_ddp_0",))
    lines = [
        "lighthouse/0 [torchx-elastic ft] " + Quorum(3, 8, ("ft_ddp_0", "ft_ddp_1")).line(2),
        "2026-11-25T12:00:00.1Z [torchx-elastic ft] " + quorum.line(2),
        "lighthouse/0 [torchx-elastic ft] replica group 1, node 0: running",
    ]
    assert last_logged_quorum(lines) == (quorum, 2)
    assert last_logged_quorum(["no quorum yet"]) is None


def test_a_running_group_trains_in_the_quorum_and_recovers_out_of_it() -> None:
    quorum = Quorum(4, 9, ("ft_ddp_0",))
    assert ft_groups.activity("group0", R, quorum) == "training (in quorum 4)"
    assert ft_groups.activity("group1", R, quorum) == "recovering (not in quorum 4)"
    # not running, before the first quorum, or not a group: nothing to say
    assert ft_groups.activity("group1", F, quorum) == ""
    assert ft_groups.activity("group1", R, None) == ""
    assert ft_groups.activity("lighthouse", R, quorum) == ""


def test_status_lines_of_the_groups_and_of_the_job() -> None:
    quorum = (Quorum(4, 9, ("ft_ddp_0",)), 2)
    progress = {
        "group0": (NOW - timedelta(seconds=3), _figures(120)),
        "group1": (NOW - timedelta(seconds=9), _figures(80)),
    }
    states = {"lighthouse": R, "group0": R, "group1": R}
    notes = ft_groups.group_notes(states, quorum, progress, NOW)
    assert notes == {
        "group0": "training (in quorum 4), progress 120/200 (60.0%) of 2/2 ranks, 5 steps/s,"
        " ETA 16s (as of 3s ago, its rank-0 agent)",
        "group1": "recovering (not in quorum 4), progress 80/200 (40.0%) of 2/2 ranks,"
        " 5 steps/s, ETA 24s (as of 9s ago, its rank-0 agent)",
    }
    assert ft_groups.status_lines(quorum, progress, NOW) == [
        "last quorum 4 at step 9: 1 of 2 replica groups (ft_ddp_0)",
        "job progress 120/200 (60.0%), group0 the furthest of 2 groups: 2/4 ranks reporting,"
        " 5 steps/s, ETA 16s (as of 3s ago); 1 of 2 groups in quorum 4",
    ]
    # group 1's last figures are from before it failed: the job is where the quorum is
    progress["group1"] = (NOW - timedelta(seconds=9), _figures(130))
    assert ft_groups.status_lines(quorum, progress, NOW)[1].startswith(
        "job progress 120/200 (60.0%), group0 the furthest of 2 groups: 2/4 ranks reporting"
    )
    without_quorum = ft_groups.status_lines(None, progress, NOW)
    assert without_quorum == [
        "job progress 130/200 (65.0%), group1 the furthest of 2 groups: 4/4 ranks reporting,"
        " 5 steps/s, ETA 14s (as of 9s ago)"
    ]
    # nothing known yet: no line
    assert ft_groups.status_lines(None, {}, NOW) == []
    assert (
        role_line("group1", R, 1, note="recovering") == "group1: RUNNING, 1 restart(s); recovering"
    )


def test_every_scheduler_reads_the_groups_through_the_one_extension_point() -> None:
    """A scheduler hands the tail of the first role's log to ``role_status.read`` and asks
    for the roles' lines once; ft.ddp's extension finds the quorum there."""
    lighthouse_log = ["[torchx-elastic ft] " + Quorum(4, 9, ("ft_ddp_0",)).line(2)]
    progress = {"group0": (NOW - timedelta(seconds=3), _figures(120))}
    states = {"lighthouse": R, "group0": R, "group1": R}
    status = role_status.read(lighthouse_log)
    assert ft_groups.FT_GROUPS in role_status.EXTENSIONS
    assert status.roles_lines(states, progress, {"group1": 1}, {"lighthouse": "pod x"}, NOW) == [
        "lighthouse: RUNNING (pod x)",
        "group0: RUNNING; training (in quorum 4), progress 120/200 (60.0%) of 2/2 ranks,"
        " 5 steps/s, ETA 16s (as of 3s ago, its rank-0 agent)",
        "group1: RUNNING, 1 restart(s); recovering (not in quorum 4)",
        "last quorum 4 at step 9: 1 of 2 replica groups (ft_ddp_0)",
        "job progress 120/200 (60.0%), group0 the furthest of 2 groups: 2/2 ranks reporting,"
        " 5 steps/s, ETA 16s (as of 3s ago); 1 of 2 groups in quorum 4",
    ]
    assert (status.bar_label("group1"), status.bar_label("lighthouse")) == (
        "group1 recovering",
        "lighthouse",
    )
    # no log yet (a pod still pending): each role's state, nothing of the groups
    assert role_status.read(None).roles_lines({"lighthouse": R, "group0": R}, {}) == [
        "lighthouse: RUNNING",
        "group0: RUNNING",
    ]


def test_a_roles_state_from_its_replicas() -> None:
    assert replicas_state([R, S]) == R
    assert replicas_state([S, S]) == S
    assert replicas_state([F, S]) == F


def test_the_bar_shows_the_job_across_the_groups_then_each_group_labelled(
    tmp_path: Path,
) -> None:
    paths = []
    for role, step in (("group0", 120), ("group1", 80)):
        (tmp_path / role).mkdir()
        paths.append(write_file(str(tmp_path / role), _summary(step)))
    quorum = (Quorum(4, 9, ("ft_ddp_0",)), 2)
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    status = AppRoleStatus((ft_groups.FtGroupStatus(quorum),))
    bar = _Bar(lambda: paths, console, term_fd=-1, status=lambda: status)
    for row in bar.rows():
        console.print(row)
    lines = out.getvalue().splitlines()
    assert [line.split()[0:2] for line in lines] == [
        ["job", "━━━━━━━━━━━━━━━━━━"],
        ["group0", "training"],
        ["group1", "recovering"],
    ], lines
    # the job is where the groups of the quorum are; group 1's ranks do not report now
    assert "120/200 of 2/4 ranks on 1/2 nodes" in lines[0], lines
    assert "80/200 of 2/2 ranks on 1/1 nodes" in lines[2], lines
    # one role: one bar named job, no quorum read
    one = _Bar(lambda: paths[:1], console, term_fd=-1, status=lambda: 1 / 0)  # type: ignore[arg-type,return-value]
    assert len(one.rows()) == 1


def test_a_summary_reads_as_its_own_line_says() -> None:
    summary = _summary(120)
    assert parse_line(summary.line()) == summary.figures()


def test_tail_lines_keeps_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    lines = tail_lines(str(path), max_bytes=100)
    assert lines[-1] == "line 999" and all(line.startswith("line ") for line in lines)
    assert len(lines) < 13
    assert tail_lines(str(tmp_path / "missing")) == []
