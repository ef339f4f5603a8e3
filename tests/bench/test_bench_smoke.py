"""The whole harness once, tiny: every benchmark, one repeat, 2 workers, few steps and lines
(and calls, and a 2x2 job's timeline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {
    "launch": {"ours", "ours_spawn", "torchrun", "floor"},
    "two_nodes": {"ours", "torchrun"},
    "restart": {"ours", "ours_spawn", "torchrun", "torchrun_fresh_store"},
    "agent_rss": {"ours", "torchrun"},
    "log_heavy": {"ours_console", "ours_quiet", "torchrun"},
    "exit_hangs": {"ours"},
    "short_job": {"ours", "ours_agent", "torchrun", "floor"},
    "memory": {"ours", "torchrun", "ours_2n", "torchrun_2n"},
    "memory_launcher": {"ours", "torchrun", "ours_2n", "torchrun_2n"},
    "progress_call": {"ours", "floor", "sendto"},
    "timeline": {"ours", "ours_warm", "floor"},
}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_prints_the_table_and_writes_the_json(tmp_path: Path) -> None:
    output = tmp_path / "latest.json"
    proc = subprocess.run(
        [
            sys.executable,
            "bench/run.py",
            "--quick",
            "--nproc",
            "2",
            "--steps",
            "2",
            "--log-lines",
            "300",
            "--progress-calls",
            "1000",
            "--timeline-nodes",
            "2",
            "--timeline-procs",
            "2",
            "--timeout-s",
            "90",
            "--restart-timeout-s",
            "60",
            # torch 2.13 keeps the agent's store, stale keys and all, across attempts: without
            # this a restart recovers only when the ranks win a race (see docs/bench.md)
            "--restart-fresh-store",
            "--work-dir",
            str(tmp_path / "runs"),
            "--output",
            str(output),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=590,
    )
    assert "| benchmark | variant | what runs | median | min | max | ok runs |" in proc.stdout
    assert f"JSON: {output}" in proc.stdout

    document = json.loads(output.read_text())
    benchmarks = document["benchmarks"]
    assert {name: set(b["variants"]) for name, b in benchmarks.items()} == VARIANTS
    for name, bench in benchmarks.items():
        for key, variant in bench["variants"].items():
            assert variant["n"] == 1, (name, key)
            # every variant's job ran and gave the right result, ours above all: a failing run
            # of ours is a regression, whatever the table would say about it (the launch jobs
            # check their world and their result and exit 1 when wrong; a launcher that
            # exits 0 before every rank recorded its end fails the run too)
            assert variant["failed"] == 0, (name, key, variant["notes"])
            assert variant["median"] > 0, (name, key)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = {(name, key) for name, bench in benchmarks.items() for key in bench["variants"]}
    # torchrun recovers from the crash, and the latency is crash to the last rank back
    for key in ("torchrun", "torchrun_fresh_store"):  # both with a fresh store here
        torchrun_restart = benchmarks["restart"]["variants"][key]
        assert torchrun_restart["failed"] == 0, torchrun_restart["notes"]
        assert torchrun_restart["median"] > 0
    restart_goals = {r["name"] for r in benchmarks["restart"]["ratios"]}
    assert {"ours / torchrun", "ours / torchrun_fresh_store"} <= restart_goals
    assert any("torchrun: 1/1 recovered" in note for note in benchmarks["restart"]["notes"])
    assert (
        "both launchers ran with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
        in (benchmarks["restart"]["notes"])
    )
    # both agents import torch: well above a bare interpreter's ~10 MiB
    assert benchmarks["agent_rss"]["variants"]["torchrun"]["median"] > 50
    rss_notes = " ".join(benchmarks["agent_rss"]["notes"])
    assert "torchrun: 0 helper process(es) besides the agent and the workers;" in rss_notes
    # where the launch time goes, for every variant of the launch
    for key in VARIANTS["launch"]:
        if ("launch", key) in ran:
            (note,) = [n for n in benchmarks["launch"]["notes"] if n.startswith(f"{key}: ")]
            assert "start to all ranks training " in note, note
            assert "last rank done to launcher exit " in note, note
    log_notes = " ".join(benchmarks["log_heavy"]["notes"])
    for key in VARIANTS["log_heavy"]:
        if ("log_heavy", key) in ran:
            assert f"{key}: every line whole and in order in the per-rank files in 1/1 runs;" in (
                log_notes
            )
    assert log_notes.count("every line whole on the console in 1/1") == sum(
        1 for name, _ in ran if name == "log_heavy"
    ), log_notes
    launch_goals = {r["name"]: r["status"] for r in benchmarks["launch"]["ratios"]}
    assert set(launch_goals) == {
        "ours / torchrun",
        "ours / floor",
        "torchrun / floor",
        "ours_spawn / torchrun",
    }
    expected = ("PASS", "MISS") if ("launch", "ours") in ran else ("n/a",)
    assert launch_goals["ours / torchrun"] in expected
    # the short job and the memory, beside torchrun; speed and size are not judged here
    short_goals = {r["name"]: r["goal"] for r in benchmarks["short_job"]["ratios"]}
    assert short_goals == {
        "ours / torchrun": "<= 0.5",
        "ours_agent / torchrun": "<= 0.45",
        "ours / floor": None,
    }
    for key in VARIANTS["short_job"]:
        (note,) = [n for n in benchmarks["short_job"]["notes"] if n.startswith(f"{key}: ")]
        assert "start to first worker process " in note, note
    assert "| 8. memory, whole job | ours |" in proc.stdout
    assert "| 9. memory, launcher side | torchrun_2n |" in proc.stdout
    for name in ("memory", "memory_launcher"):
        goals = {r["name"]: r["goal"] for r in benchmarks[name]["ratios"]}
        assert set(goals) == {"ours / torchrun", "ours_2n / torchrun_2n"}
    # a whole job holds at least its launcher and its workers
    for key in VARIANTS["memory"]:
        whole = benchmarks["memory"]["variants"][key]["median"]
        assert whole > benchmarks["memory_launcher"]["variants"][key]["median"] > 0
    assert launch_goals["torchrun / floor"] is None  # no goal
