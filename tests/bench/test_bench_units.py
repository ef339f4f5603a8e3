"""Fast tests of the benchmark harness's parts: records, log checks, ratios, commands, processes."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from bench import commands, logcheck, phases, procs, restart
from bench.benchmarks import BENCHMARKS, Derived, Sample, Settings
from bench.report import BenchmarkResult, Ratio, VariantResult, render_table
from bench.run import (
    DEFAULT_REPEATS,
    benchmark_env,
    derived_result,
    main,
    rotated,
    run_benchmark,
    selected,
    summary_notes,
)
from tests.waiting import wait_until
from torchx_elastic.contract import STDOUT_FILE
from torchx_elastic.contract.log_layout import NodeLogs

# records of a 2-rank run: rank 1 crashes at t=10, rank 0 is back at 12.5, rank 1 at 13
RECORDS = """\
loop 0 0 9.0
loop 0 1 9.1
crash 0 1 10.0
loop 1 0 12.5
loop 1 1 13.0
"""


def test_latency_is_crash_to_the_last_rank_back() -> None:
    records = restart.parse_records(RECORDS)
    assert restart.recovery_latency_s(records, world_size=2) == pytest.approx(3.0)


def test_no_latency_while_a_rank_is_missing() -> None:
    records = restart.parse_records(RECORDS.replace("loop 1 1 13.0\n", ""))
    assert restart.recovery_latency_s(records, world_size=2) is None


def test_no_latency_without_a_crash() -> None:
    records = restart.parse_records("loop 0 0 1.0\nloop 0 1 1.0\n")
    assert restart.recovery_latency_s(records, world_size=2) is None


def test_a_later_complete_attempt_counts_when_the_first_restart_was_partial() -> None:
    text = RECORDS.replace("loop 1 1 13.0\n", "") + "loop 2 0 20.0\nloop 2 1 21.0\n"
    found = restart.recovery(restart.parse_records(text), world_size=2)
    assert found is not None
    assert found.attempt == 2
    assert found.latency_s == pytest.approx(11.0)


def test_a_bad_record_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"record 2 is not '<loop\|crash> ATTEMPT RANK TIME': 'oops'"
    ):
        restart.parse_records("loop 0 0 1.0\noops\n")


def test_missing_record_file_means_not_recovered(tmp_path: Path) -> None:
    assert restart.read_recovery(tmp_path / "none.txt", world_size=2) is None


def _lines(rank: int, count: int) -> bytes:
    return b"".join(b"bench-line rank=%d i=%d %s\n" % (rank, i, b"x" * 48) for i in range(count))


def test_log_check_accepts_complete_logs(tmp_path: Path) -> None:
    for rank in range(2):
        ours = Path(NodeLogs(str(tmp_path)).rank_dir(0, rank))
        ours.mkdir(parents=True)
        (ours / STDOUT_FILE).write_bytes(b"hello\n" + _lines(rank, 5))
    check = logcheck.check_log_dir(tmp_path, expected_per_rank=5)
    assert check.complete(world_size=2)
    assert check.summary(world_size=2) == "10/10 lines, 0 malformed"


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data.replace(b"i=3 ", b"i=9 "),  # out of order
        lambda data: data.replace(b"rank=0 i=2 " + b"x" * 48 + b"\n", b""),  # missing
        lambda data: data.replace(b"i=4 " + b"x" * 48, b"i=4 " + b"x" * 10),  # torn
        lambda data: data + data.splitlines(keepends=True)[-1],  # a repeated line
    ],
)
def test_log_check_notices_damage(damage: object, tmp_path: Path) -> None:
    assert callable(damage)
    check = logcheck.LogCheck(expected_per_rank=5)
    check.feed(damage(_lines(0, 5)))
    check.feed(_lines(1, 5))
    assert not check.complete(world_size=2)


def test_log_check_notices_a_missing_rank() -> None:
    check = logcheck.LogCheck(expected_per_rank=5)
    check.feed(_lines(0, 5))
    assert not check.complete(world_size=2)


def test_console_lines_are_counted_with_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "console.txt"
    path.write_bytes(
        b"[n0 r0] " + _lines(0, 3).replace(b"\nbench", b"\n[n0 r0] bench") + b"noise\n"
    )
    assert logcheck.count_console_lines(path) == logcheck.ConsoleCount(lines=3, whole=3)


def test_console_lines_run_together_are_not_whole(tmp_path: Path) -> None:
    path = tmp_path / "console.txt"
    first, second, third = _lines(0, 3).splitlines(keepends=True)
    path.write_bytes(b"[default0]:" + first + b"[default0]:" + second.rstrip() + third)
    assert logcheck.count_console_lines(path) == logcheck.ConsoleCount(lines=3, whole=1)


def _variants(ours: list[float | None], torchrun: list[float | None]) -> dict[str, VariantResult]:
    return {"ours": VariantResult("o", ours), "torchrun": VariantResult("t", torchrun)}


def test_ratio_of_medians_and_goal() -> None:
    variants = _variants([1.0, 2.0, 9.0], [4.0, 5.0, None])
    assert variants["torchrun"].failed == 1
    assert Ratio("ours", "torchrun").value(variants) == pytest.approx(2.0 / 4.5)
    assert Ratio("ours", "torchrun", goal_max=0.5).status(variants) == "PASS"
    assert Ratio("ours", "torchrun", goal_max=0.4).status(variants) == "MISS"
    assert Ratio("ours", "torchrun").status(variants) == ""


def test_strict_goal_misses_at_equality() -> None:
    variants = _variants([2.0], [2.0])
    assert Ratio("ours", "torchrun", goal_max=1.0).status(variants) == "PASS"
    assert Ratio("ours", "torchrun", goal_max=1.0, strict=True).status(variants) == "MISS"


def test_ratio_without_samples_is_not_applicable() -> None:
    variants = _variants([None], [3.0])
    assert Ratio("ours", "torchrun", goal_max=0.5).status(variants) == "n/a"


def test_table_shows_medians_spread_ratios_and_notes() -> None:
    result = BenchmarkResult(
        "launch",
        "1. launch",
        "s",
        _variants([1.0, 3.0, 2.0], [4.0, 4.0, None]),
        (Ratio("ours", "torchrun", goal_max=0.5),),
        notes=["noisy"],
    )
    table = render_table([result])
    assert "| 1. launch | ours | o | 2.00 s | 1.00 | 3.00 | 3/3 |" in table
    assert "| 1. launch | torchrun | t | 4.00 s | 4.00 | 4.00 | 2/3 |" in table
    assert "| 1. launch | ours / torchrun | 0.50x | <= 0.5 | PASS |" in table
    assert "- 1. launch: noisy" in table
    assert result.as_json()["ratios"][0]["status"] == "PASS"


def test_ours_is_the_real_torchx_cli(tmp_path: Path) -> None:
    command = commands.ours_torchx("1x4", "s.py", ["--steps", "2"], log_dir=tmp_path)
    assert command[0] == str(Path(sys.executable).parent / "torchx")
    assert command[1:] == [
        "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path}",
        "dist.ddp", "-j", "1x4", "--script", "s.py", "--", "--steps", "2",
    ]  # fmt: skip


def test_two_torchrun_agents_share_one_rendezvous() -> None:
    first, second = commands.torchrun_nodes(2, 2, "s.py", rdzv_port=1234)
    assert first == second
    assert first[first.index("--rdzv-endpoint") + 1] == "localhost:1234"
    assert first[first.index("--nnodes") + 1] == "2"


def test_our_agents_share_one_rendezvous_with_torchruns_flags() -> None:
    ours = commands.ours_nodes(3, 1, "s.py", ["--world-size", "3"], rdzv_port=1234)
    theirs = commands.torchrun_nodes(3, 1, "s.py", ["--world-size", "3"], rdzv_port=1234)
    assert len(ours) == 3 and ours[0] == ours[2]
    assert ours[0][1:3] == ["-m", "torchx_elastic.agent"]
    for flag, value in (("--nnodes", "3"), ("--rdzv-endpoint", "localhost:1234")):
        assert ours[0][ours[0].index(flag) + 1] == theirs[0][theirs[0].index(flag) + 1] == value
    assert ours[0][-3:] == theirs[0][-3:] == ["s.py", "--world-size", "3"]


def test_floor_sets_the_distributed_environment_by_hand() -> None:
    envs = commands.floor_envs({"A": "1"}, nproc=2, master_port=4321)
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert {env["MASTER_PORT"] for env in envs} == {"4321"}
    assert all(env["A"] == "1" for env in envs)


def test_benchmark_env_drops_an_enclosing_jobs_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = benchmark_env()
    assert "RANK" not in env and "PET_NNODES" not in env and "TORCHELASTIC_RUN_ID" not in env
    assert env["OMP_NUM_THREADS"] == "1"


def test_variant_order_rotates_per_repeat() -> None:
    assert [rotated(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip


def test_unknown_benchmark_is_named_with_the_choices() -> None:
    with pytest.raises(
        SystemExit, match=r"bench: unknown benchmark\(s\) lunch; choose from launch,"
    ):
        selected("lunch")


def test_repeats_must_be_positive() -> None:
    with pytest.raises(SystemExit, match=r"bench: --repeats 0 must be at least 1"):
        main(["--repeats", "0"])


def test_run_together_times_and_reports_exit_codes(tmp_path: Path) -> None:
    outcome = procs.run_together(
        [
            [sys.executable, "-c", "import time; time.sleep(0.3)"],
            [sys.executable, "-c", "print('bye'); raise SystemExit(3)"],
        ],
        output_path=tmp_path / "out.log",
        timeout_s=30,
        cwd=tmp_path,
        envs=[{}, {}],
    )
    assert outcome.exit_codes == (0, 3)
    assert not outcome.ok and not outcome.timed_out
    assert outcome.wall_s >= 0.3  # (the harness's own overhead is not bounded here)
    assert outcome.output_tail() == "bye"


def test_run_together_needs_one_env_per_command(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 commands but 1 environments"):
        procs.run_together(
            [["true"], ["true"]], output_path=tmp_path / "o", timeout_s=1, cwd=tmp_path, envs=[{}]
        )


def test_timeout_stops_the_whole_tree_including_other_sessions(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    launcher = textwrap.dedent(
        f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher that ignores SIGTERM
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                 start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(3600)  # what ends first is the run's timeout: waiting for it would hang
        """
    )
    outcome = procs.run_together(
        [[sys.executable, "-c", launcher]],
        output_path=tmp_path / "out.log",
        timeout_s=10,  # the launcher started its child by then (a scenario's time, not a wait)
        cwd=tmp_path,
        envs=[{}],
    )
    assert outcome.timed_out and outcome.exit_codes == (None,)
    grandchild = int(pid_file.read_text())
    status = Path(f"/proc/{grandchild}/status")
    wait_until(
        lambda: not status.exists() or "zombie" in status.read_text(),
        what="the end of the launcher's child in another session",
    )


def test_helpers_are_the_launchers_processes_that_are_not_workers() -> None:
    # 10 the launcher; 11 a fork server, 12 and 13 workers forked from it; 14 a worker's child
    memory = procs.TreeMemory(
        root=10,
        peak_rss_kb={10: 100, 11: 200, 12: 300, 13: 300, 14: 50},
        parents={10: 1, 11: 10, 12: 11, 13: 11, 14: 12},
        pss_ticks=[{10: 60, 11: 40}, {10: 70, 11: 50, 12: 500}, {10: 70}],
    )
    assert memory.helpers(workers={12, 13}) == [11]
    assert memory.peak_pss_kb({10, 11}) == 120
    assert memory.helpers(workers={11}) == []


def test_job_memory_counts_only_samples_that_saw_every_worker() -> None:
    # 10 the launcher; 11 a fork server; 12 and 13 workers; 14 a worker's child
    memory = procs.TreeMemory(
        root=10,
        parents={10: 1, 11: 10, 12: 11, 13: 11, 14: 12},
        pss_ticks=[
            {10: 60, 11: 40, 12: 900},  # 13 not there yet: not while the workers run
            {10: 70, 11: 50, 12: 300, 13: 300, 14: 5},
            {10: 80, 11: 30, 12: 200, 13: 250},
            {10: 500},
        ],
    )
    assert memory.pss_while_running({12, 13}) == (725, 120)  # whole job, launcher side
    assert memory.pss_while_running({12, 15}) is None


def test_a_derived_figure_is_a_table_of_the_same_runs() -> None:
    source = BenchmarkResult(
        "memory",
        "8. memory",
        "MiB",
        {"ours": VariantResult("ours", [300.0, None, 310.0], [], [{"x": 100}, {}, {"x": 120}])},
    )
    derived = derived_result(Derived("memory_launcher", "9. launcher", "MiB", "x"), source)
    assert (derived.name, derived.title) == ("memory_launcher", "9. launcher")
    assert derived.variants["ours"].samples == [100.0, None, 120.0]
    assert derived.variants["ours"].median == 110.0


def test_peak_rss_is_sampled_from_the_process(tmp_path: Path) -> None:
    grow = "b = bytearray(64 * 1024 * 1024); import time; time.sleep(0.5)"
    outcome = procs.run_together(
        [[sys.executable, "-c", grow]],
        output_path=tmp_path / "out.log",
        timeout_s=30,
        cwd=tmp_path,
        envs=[{}],
        sample_rss=True,
    )
    assert outcome.ok
    assert outcome.peak_rss_kb[0] > 64 * 1024


def test_phases_of_a_launch() -> None:
    text = "start 0 10.0 7\nstart 1 11.0 8\ndone 1 20.0 8\ndone 0 20.5 7\n"
    found = phases.parse_phases(text, world_size=2, started_unix_s=4.0, ended_unix_s=21.0)
    assert found == phases.Phases(to_training_s=7.0, exit_tail_s=0.5)


def test_phases_need_every_rank() -> None:
    text = "start 0 10.0 7\nstart 1 11.0 8\ndone 0 20.5 7\n"
    assert phases.parse_phases(text, 2, 4.0, 21.0) is None
    assert phases.worker_pids(text) == {7, 8}


def test_a_bad_phase_record_is_named() -> None:
    with pytest.raises(
        ValueError,
        match=r"record 1 is not '<proc\|script\|start\|done> RANK TIME PID': 'start 0 1.0'",
    ):
        phases.parse_phases("start 0 1.0\n", 1, 0.0, 1.0)


def test_phases_before_training_when_recorded() -> None:
    text = (
        "script 0 6.0 7\nproc 0 5.5 7\nscript 1 6.5 8\nproc 1 5.0 8\n"
        "start 0 10.0 7\nstart 1 11.0 8\ndone 1 20.0 8\ndone 0 20.5 7\n"
    )
    found = phases.parse_phases(text, world_size=2, started_unix_s=4.0, ended_unix_s=21.0)
    assert found == phases.Phases(
        to_training_s=7.0, exit_tail_s=0.5, to_first_worker_s=1.0, to_scripts_s=2.5
    )


def test_tree_sampler_finds_a_helper_beside_a_worker(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    launcher = textwrap.dedent(
        f"""
        import subprocess, sys
        sleep = [sys.executable, "-c", "import time; time.sleep(1.0)"]
        helper, worker = subprocess.Popen(sleep), subprocess.Popen(sleep)
        open({str(pids)!r}, "w").write(f"{{helper.pid}} {{worker.pid}}")
        helper.wait(); worker.wait()
        """
    )
    outcome = procs.run_together(
        [[sys.executable, "-c", launcher]],
        output_path=tmp_path / "out.log",
        timeout_s=30,
        cwd=tmp_path,
        envs=[{}],
        sample_rss=True,
    )
    assert outcome.ok
    helper, worker = map(int, pids.read_text().split())
    memory = outcome.memory[0]
    assert memory.helpers(workers={worker}) == [helper]
    assert "time.sleep(1.0)" in memory.commands[helper]
    assert memory.peak_pss_kb({memory.root, helper}) > 1024


def test_exit_hangs_counts_launches_that_timed_out() -> None:
    runs = [Sample(3.0, facts={"hang": False}), Sample(None, "timed out", {"hang": True})]
    runs.append(Sample(2.5, facts={"hang": False}))
    variant = VariantResult("ours fork")
    variant.samples.extend(s.value for s in runs)
    result = BenchmarkResult("exit_hangs", "6. hangs over N launches", "s", {"ours": variant})
    notes = summary_notes("exit_hangs", result, {"ours": runs})
    assert notes == [
        "ours: 1 hang(s) in 3 launches (still running after the --hang-timeout-s limit)"
    ]


def test_exit_hangs_is_a_benchmark_with_its_own_launch_count() -> None:
    assert [b.name for b in selected("exit_hangs")] == ["exit_hangs"]


def test_every_benchmark_has_a_default_repeat_count() -> None:
    assert set(DEFAULT_REPEATS) == set(BENCHMARKS)
    assert [b.name for b in selected("progress_call,timeline")] == ["progress_call", "timeline"]


def _tiny() -> Settings:
    return Settings(
        env=benchmark_env(),
        progress_calls=1000,
        timeline_nodes=2,
        timeline_procs=2,
        timeline_progress_samples=5,
    )


SPEED_FACTS = {
    "progress_call": {
        key: {"seconds", "calls", "dropped", "process_wall_s"}
        for key in ("ours", "floor", "sendto")
    },
    "timeline": {
        "ours": {"seconds", "ranks", "nodes", "page_bytes", "trace_bytes", "process_wall_s"},
        "ours_warm": {"seconds", "ranks", "nodes", "page_bytes", "trace_bytes", "process_wall_s"},
        "floor": {"seconds", "records", "read_bytes", "process_wall_s"},
    },
}
# what the tiny size makes of each, where a variant records it (1000 calls, none failed, all
# live: ours fails unless the agent's channel saw the last step; a 2x2 job)
TINY_FACTS = {"calls": 1000, "dropped": 0, "ranks": 4, "nodes": 2}


@pytest.mark.parametrize("name", sorted(SPEED_FACTS))
def test_a_speed_that_left_the_tests_runs_at_a_tiny_size_with_its_ratios(
    name: str, tmp_path: Path
) -> None:
    """(Its time is the bench's figure, not asserted here.)"""
    result, samples = run_benchmark(BENCHMARKS[name], 1, _tiny(), tmp_path, keep=False)
    for key, facts in SPEED_FACTS[name].items():
        [sample] = samples[key]
        assert sample.value is not None, sample.note
        assert set(sample.facts) == facts, key
        for fact, value in TINY_FACTS.items():
            assert sample.facts.get(fact, value) == value, (key, fact)
    ratios = result.as_json()["ratios"]
    assert ratios and all(ratio["value"] is not None for ratio in ratios)
    assert result.notes  # what the runs did besides their time


def test_the_lost_node_benchmark_reads_when_the_world_was_back_at_its_size() -> None:
    from bench.node_loss import back_at_size_s, steps_at

    records = "step 0 2 100.0\nstep 20 2 101.0\nstep 0 1 104.0\nstep 0 2 112.5\ndone 2 120.0\n"
    assert steps_at(records, 2) == 20
    assert steps_at(records, 3) == -1
    assert back_at_size_s(records, 2, after_s=101.5) == 11.0
    assert back_at_size_s(records, 2, after_s=113.0) is None  # never again after it
