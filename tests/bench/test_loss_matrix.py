"""Fast tests of the loss matrix's pure parts (bench/loss_matrix.py): the cells, the flags,
reading the loops' lines and the agents' last words, the table. No hosts are made."""

from __future__ import annotations

import pytest

from bench import loss_matrix as lm
from torchx_elastic.contract import SHARE_STORE_OPT_OUT_ENV

LOG = """\
[n0 r0] step 20 world 2 at 100.000
[n0 r0] step 30 world 2 at 100.500
torchx-elastic: node 1 (h1, agent pid 512) was lost: its agent is gone
[n0 r0] frame #3: c10d::TCPStore::doWait
[n0 r0] step 40 world 2 at 101.100
torchx-elastic: round 2: h2 (agent pid 7) takes the place of h1 (agent pid 512), lost
[n0 r0] step 0 world 2 at 102.300
[n0 r0] step 10 world 2 at 102.600
"""


def test_sixteen_cells_and_their_selection() -> None:
    cells = lm.all_cells()
    assert len(cells) == 16 and len({c.key for c in cells}) == 16
    assert [c.key for c in lm.selected(cells, "fixed/h0/killed/*")] == [
        "fixed/h0/killed/progress",
        "fixed/h0/killed/plain",
    ]
    assert len(lm.selected(cells, "*/h1/*/plain, elastic/h0/cut/progress")) == 5
    assert lm.selected(cells, None) == cells
    assert lm.selected(cells, "nothing") == []


def test_flags_and_replacements() -> None:
    assert "--max-restarts=0" in lm.flags("ours", "fixed")
    assert "--nnodes=2" in lm.flags("ours", "fixed")
    assert "--nnodes=2:3" in lm.flags("torchrun", "elastic")
    assert "--max-restarts=3" in lm.flags("torchrun", "elastic")
    assert lm.launcher_env("ours") == {}
    assert lm.launcher_env("torchrun") == {SHARE_STORE_OPT_OUT_ENV: "1"}
    assert lm.launcher_env("torchrun", torchrun_as_is=True) == {}
    assert lm.replacement("ours", lm.Cell("fixed", "h1", "killed", "plain")) is None
    assert lm.replacement("torchrun", lm.Cell("elastic", "h1", "killed", "plain")) is None
    assert lm.replacement("torchrun", lm.Cell("fixed", "h0", "killed", "plain")) == "h0"
    assert lm.replacement("torchrun", lm.Cell("fixed", "h1", "cut", "plain")) == "h2"


def test_back_is_the_first_step_0_of_world_2_after_the_fault() -> None:
    # step 40 of the old world, printed after the fault, does not count
    assert lm.back_after(LOG, 2, 101.0) == pytest.approx(102.3)
    assert lm.back_after(LOG, 3, 101.0) is None
    assert lm.back_after(LOG, 2, 103.0) is None
    assert lm.last_step(LOG, 2, 102.3) == 10
    assert lm.last_step(LOG, 3, 0) == -1


def test_last_agent_line() -> None:
    assert lm.last_agent_line(LOG).startswith("torchx-elastic: round 2: h2")
    torchrun = "[W1129 dynamic_rendezvous.py:1298] The node failed to shutdown\n frame #1: x\n"
    assert (
        lm.last_agent_line(torchrun)
        == "[W1129 dynamic_rendezvous.py:1298] The node failed to shutdown"
    )
    noisy = "RendezvousConnectionError: failed\n[W1129 socket.cpp:207] [c10d] The hostname\n"
    assert lm.last_agent_line(noisy + "Summary (JSON): /tmp/s.json\n").startswith("Rendezvous")
    assert lm.last_agent_line("") == "(nothing)"
    assert lm.last_agent_line("x" * 500, limit=20) == "x" * 17 + "..."


def test_median_of_the_runs_that_came_back() -> None:
    assert lm.median([3.0, None, 1.0]) == 2.0
    assert lm.median([None]) is None
    assert lm.median([]) is None


def result(
    launcher: str, node: str, values: list[float | None], reasons: list[str]
) -> lm.CellResult:
    return lm.CellResult(
        launcher=launcher, shape="fixed", node=node, node_role=lm.ROLE[node], fault="killed",
        progress=True, script="bench/progress_loop.py", flags=lm.flags(launcher, "fixed"),
        env=lm.launcher_env(launcher),
        replacement=lm.replacement(launcher, lm.Cell("fixed", node, "killed", "progress")),
        values=values, reasons=reasons, median=lm.median(values),
    )  # fmt: skip


def test_table_puts_ours_beside_torchrun_and_says_why_not_back() -> None:
    table = lm.render_table(
        [
            result("torchrun", "h0", [None], ["h1 exit 1: Broken pipe"]),
            result("ours", "h1", [1.25, None], ["", "within 90s"]),
            result("torchrun", "h1", [30.4], [""]),
            result("ours", "h0", [4.0], [""]),
        ]
    )
    rows = [line for line in table.splitlines() if line.startswith("| fixed")]
    assert rows == [
        "| fixed | h1 (an active node) | killed | progress | 1.2 s (1/2 back) | 30.4 s |",
        "| fixed | h0 (the rendezvous host) | killed | progress | 4.0 s | not back |",
    ]
    assert "- torchrun fixed/h0/killed/progress run 1: not back: h1 exit 1: Broken pipe" in table
    assert "- ours fixed/h1/killed/progress run 2: not back: within 90s" in table
    assert f"`{SHARE_STORE_OPT_OUT_ENV}=1 --nnodes=2 " in table
    assert "--max-restarts=0" in table and "a replacement starts right after the fault" in table


def test_bad_selection_is_refused_before_any_host_is_made(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        lm.main(["--only", "nothing/*"])
    with pytest.raises(SystemExit):
        lm.main(["--launchers", "slurm"])
    assert "no cell" in capsys.readouterr().err


def test_the_torchx_cells_find_the_replica_that_stands_by() -> None:
    from bench.loss_torchx import spare_replica

    line = (
        "loop/{} torchx-elastic: standing by: the job has its 2 nodes (3 here); this node takes"
        " the place of the first one lost, at the next round; rendezvous at 127.0.0.1:5, run id 'x'"
    )
    text = "loop/1 [n0 r0] step 0 world 2 at 1.000\n" + line.format(0) + "\n"
    assert spare_replica(text) == 0
    assert spare_replica("loop/1 [n0 r0] step 0 world 2 at 1.000\n") is None
    assert spare_replica(text + line.format(2)) is None  # two said so: not one spare
