"""``--health-check``'s runs (supervision/health_check.py): a check that hangs is killed after
its timeout and said so; every run's output is kept."""

from __future__ import annotations

from pathlib import Path

from torchx_elastic.agent.supervision.health_check import HealthCheck


def test_a_check_that_hangs_is_killed_after_its_timeout(tmp_path: Path) -> None:
    check = HealthCheck("echo probing; exec sleep 60", str(tmp_path), timeout_s=0.5)
    run = check.run(3)
    assert run.exit_code is None and not run.passed
    assert run.seconds < 30  # killed, not waited for
    assert str(check.failure(run)) == (
        "health check 'echo probing; exec sleep 60' did not exit within 0.5s (killed) before"
        " rendezvous round 3: this node does not join the job; its last line: 'probing'; its"
        f" output: {tmp_path / 'health_check_round3.log'}"
    )


def test_each_run_keeps_its_output_and_a_signal_is_named(tmp_path: Path) -> None:
    check = HealthCheck("echo round; kill -9 $$", str(tmp_path))
    first, second = check.run(1), check.run(2)
    assert Path(first.output).read_text() == Path(second.output).read_text() == "round\n"
    assert first.exit_code == -9
    assert "failed with signal 9 before rendezvous round 1" in str(check.failure(first))
    assert HealthCheck("true", str(tmp_path)).run(4).facts() | {"seconds": 0} == {
        "round": 4,
        "exit_code": 0,
        "passed": True,
        "output": str(tmp_path / "health_check_round4.log"),
        "seconds": 0,
    }
