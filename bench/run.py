"""``python bench/run.py``: the benchmarks of issue 5, side by side and interleaved.

For each benchmark, repeat by repeat, every variant (ours / torchrun / floor) runs once,
in an order that rotates with the repeat, so slow drifts of a shared machine hit all
variants alike. Prints a Markdown table of medians, min/max and ratios against the goals
and writes the JSON to ``bench/results/latest.json``. See ``docs/bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchmarks import (  # noqa: E402
    BENCHMARKS,
    FRESH_STORE_ENV,
    REPO,
    Benchmark,
    Derived,
    Sample,
    Settings,
)
from bench.report import BenchmarkResult, VariantResult, render_table  # noqa: E402

DEFAULT_REPEATS = {
    "launch": 5,
    "two_nodes": 3,
    "restart": 4,
    "agent_rss": 3,
    "log_heavy": 3,
    "exit_hangs": 200,
    "short_job": 7,
    "memory": 3,
    "rendezvous_scale": 3,
    "progress_call": 5,
    "timeline": 3,
    "node_loss": 3,
}
# not in a plain run: the rendezvous of up to 16 agents per run, and the lost node (about a
# minute per repeat, torchrun's runs the longest)
OPT_IN = ("rendezvous_scale", "node_loss")
DEFAULT_BENCHMARKS = [name for name in BENCHMARKS if name not in OPT_IN]
DEFAULT_OUTPUT = REPO / "bench" / "results" / "latest.json"
# a launcher's own variables from an enclosing job must not leak into the benchmarked ones
_INHERITED_PREFIXES = ("PET_", "TORCHELASTIC_", "TORCHX_")
_INHERITED_NAMES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/run.py",
        description="torchx-elastic vs torchrun vs N plain processes, interleaved in one run.",
    )
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_BENCHMARKS),
        help=f"comma-separated benchmarks to run, of {','.join(BENCHMARKS)} (default: all but"
        f" {' and '.join(OPT_IN)}, which start many agents or run long)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of every variant of every benchmark (default: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_REPEATS.items())
        + ")",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one run of everything (same as --repeats 1)"
    )
    parser.add_argument(
        "--nproc", type=int, default=4, help="workers per job (default 4; two nodes: N/2 each)"
    )
    parser.add_argument(
        "--steps", type=int, default=20, help="DDP steps of the launch job (default 20)"
    )
    parser.add_argument(
        "--log-lines",
        type=int,
        default=100_000,
        help="lines per rank of the log-heavy job (default 100000)",
    )
    parser.add_argument(
        "--progress-calls",
        type=int,
        default=100_000,
        help="progress() calls per run of progress_call (default 100000)",
    )
    parser.add_argument(
        "--timeline-nodes",
        type=int,
        default=64,
        help="nodes of the timeline benchmark's generated job (default 64)",
    )
    parser.add_argument(
        "--timeline-procs",
        type=int,
        default=8,
        help="ranks per node of the timeline benchmark's generated job (default 8)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=90.0, help="limit of one run (default 90)"
    )
    parser.add_argument(
        "--restart-timeout-s",
        type=float,
        default=60.0,
        help="a restart run not done by then is killed and counted as not recovered (default 60)",
    )
    parser.add_argument(
        "--hang-launches",
        type=int,
        default=None,
        help="launches of the exit_hangs benchmark (default: --repeats, else"
        f" {DEFAULT_REPEATS['exit_hangs']})",
    )
    parser.add_argument(
        "--hang-timeout-s",
        type=float,
        default=60.0,
        help="exit_hangs: a launch still running after this many seconds hung (default 60)",
    )
    parser.add_argument(
        "--restart-fresh-store",
        action="store_true",
        help=f"restart runs of both launchers with {FRESH_STORE_ENV}=1: the workers' store is"
        " new on every attempt instead of the agent's, which torch 2.13 keeps across attempts"
        " with the last attempt's keys in it (see docs/bench.md)",
    )
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help=f"JSON path (default {DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where runs write (default: a new temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs of successful runs too")
    return parser


def selected(only: str) -> list[Benchmark]:
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown or not names:
        raise SystemExit(
            f"bench: unknown benchmark(s) {', '.join(unknown) or '(none given)'};"
            f" choose from {', '.join(BENCHMARKS)} (e.g. --only launch,restart)"
        )
    return [BENCHMARKS[name] for name in names]


def benchmark_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _INHERITED_NAMES and not key.startswith(_INHERITED_PREFIXES)
    }
    # torchrun sets OMP_NUM_THREADS=1 for several workers on its own; give every variant the same
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def rotated(keys: list[str], repeat: int) -> list[str]:
    shift = repeat % len(keys)
    return keys[shift:] + keys[:shift]


def warm_up(env: dict[str, str]) -> None:
    """Read torch, torchx and the agent into the page cache once, untimed."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch.distributed.run, torchx.runner, torchx_elastic.agent",
        ],
        cwd=REPO,
        env=env,
        check=False,  # a broken launcher shows in the runs, with its output
    )


def run_benchmark(
    bench: Benchmark, repeats: int, settings: Settings, work_dir: Path, keep: bool
) -> tuple[BenchmarkResult, dict[str, list[Sample]]]:
    variants = {key: VariantResult(label) for key, (label, _) in bench.variants.items()}
    samples: dict[str, list[Sample]] = {key: [] for key in bench.variants}
    for repeat in range(repeats):
        for key in rotated(list(bench.variants), repeat):
            run_dir = work_dir / bench.name / f"{key}-{repeat}"
            run_dir.mkdir(parents=True)
            sample = bench.variants[key][1](settings, run_dir)
            samples[key].append(sample)
            variants[key].samples.append(sample.value)
            variants[key].facts.append(sample.facts)
            shown = "FAILED" if sample.value is None else f"{sample.value:.2f} {bench.unit}"
            print(
                f"[{bench.name} {repeat + 1}/{repeats}] {key}: {shown}", file=sys.stderr, flush=True
            )
            if sample.value is None:
                variants[key].notes.append(f"run {repeat + 1}: {sample.note}")
                print(f"  {sample.note}", file=sys.stderr, flush=True)
            elif not keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    result = BenchmarkResult(bench.name, bench.title, bench.unit, variants, bench.ratios)
    result.notes.extend(summary_notes(bench.name, result, samples))
    if bench.name == "restart" and settings.restart_env:
        extra = " ".join(f"{k}={v}" for k, v in settings.restart_env.items())
        result.notes.append(f"both launchers ran with {extra}")
    return result, samples


def derived_result(derived: Derived, source: BenchmarkResult) -> BenchmarkResult:
    """A second figure of ``source``'s runs as a result of its own (a failed run stays one)."""
    variants = {}
    for key, variant in source.variants.items():
        copy = VariantResult(variant.label)
        for sample, facts in zip(variant.samples, variant.facts, strict=True):
            value = facts.get(derived.fact) if sample is not None else None
            copy.samples.append(float(value) if isinstance(value, (int, float)) else None)
        copy.notes = list(variant.notes)
        variants[key] = copy
    return BenchmarkResult(derived.name, derived.title, derived.unit, variants, derived.ratios)


def summary_notes(
    name: str, result: BenchmarkResult, samples: dict[str, list[Sample]]
) -> list[str]:
    notes: list[str] = []
    if name == "restart":
        for key, variant in result.variants.items():
            first = sum(
                1
                for s in samples[key]
                if s.value is not None and s.facts.get("recovered_in_attempt") == 1
            )
            notes.append(
                f"{key}: {len(variant.values)}/{len(variant.samples)} recovered"
                f" ({first} on the first restart; recovered: all ranks back in the loop and"
                " the job done before the timeout)"
            )
    if name in ("launch", "two_nodes", "short_job"):
        for key, runs in samples.items():
            to_training = [s.facts["to_training_s"] for s in runs if "to_training_s" in s.facts]
            tails = [s.facts["exit_tail_s"] for s in runs if "exit_tail_s" in s.facts]
            firsts = [s.facts["to_first_worker_s"] for s in runs if "to_first_worker_s" in s.facts]
            scripts = [s.facts["to_scripts_s"] for s in runs if "to_scripts_s" in s.facts]
            before = ""
            if firsts and scripts:
                before = (
                    f"start to first worker process {_median(firsts):.2f} s, to every rank's"
                    f" script running {_median(scripts):.2f} s, "
                )
            if to_training and tails:
                notes.append(
                    f"{key}: {before}start to all ranks training {_median(to_training):.2f} s,"
                    f" last rank done to launcher exit {_median(tails):.2f} s (medians)"
                )
    if name == "exit_hangs":
        for key, runs in samples.items():
            hangs = sum(1 for s in runs if s.facts.get("hang"))
            notes.append(
                f"{key}: {hangs} hang(s) in {len(runs)} launches (still running after the"
                " --hang-timeout-s limit)"
            )
    if name == "agent_rss":
        for key, runs in samples.items():
            done = [s for s in runs if s.value is not None]
            if not done:
                continue
            helpers = done[-1].facts["helpers"]
            assert isinstance(helpers, list)
            names = "; ".join(f"{h['command']} ({h['peak_rss_mib']:.0f} MiB)" for h in helpers)
            pss = _median([s.facts["agent_and_helpers_peak_pss_mib"] for s in done])
            notes.append(
                f"{key}: {len(helpers)} helper process(es) besides the agent and the workers"
                f"{': ' + names if names else ''}; agent + helpers peak PSS {pss:.0f} MiB (median)"
            )
    notes.extend(speed_notes(name, samples))
    if name == "log_heavy":
        for key, runs in samples.items():
            done = [s for s in runs if s.value is not None]
            files_ok = sum(1 for s in done if s.facts.get("all_lines_in_files"))
            console_ok = sum(
                1
                for s in done
                if s.facts["console_lines"]
                == s.facts["console_whole_lines"]
                == s.facts["console_expected"]
            )
            last = (
                f" (last run: files {done[-1].facts['files']}; console"
                f" {done[-1].facts['console_lines']}/{done[-1].facts['console_expected']} lines,"
                f" {done[-1].facts['console_whole_lines']} whole)"
                if done
                else ""
            )
            notes.append(
                f"{key}: every line whole and in order in the per-rank files in"
                f" {files_ok}/{len(runs)} runs; every line whole on the console in"
                f" {console_ok}/{len(runs)}{last}"
            )
    return notes


def speed_notes(name: str, samples: dict[str, list[Sample]]) -> list[str]:
    """What the progress and timeline runs did besides their time (the last run that worked)."""
    notes: list[str] = []
    for key, runs in samples.items():
        done = [s.facts for s in runs if s.value is not None]
        if not done:
            continue
        last = done[-1]
        if name == "progress_call" and key == "sendto":
            notes.append(
                f"{key}: {last['dropped']} of {last['calls']} sends failed in the last run (a"
                " full queue; a failed send costs an exception more)"
            )
        if name == "timeline" and key != "floor":
            notes.append(
                f"{key}: {last['ranks']} ranks on {last['nodes']} nodes; page"
                f" {_kib(last['page_bytes'])}, trace {_kib(last['trace_bytes'])}"
            )
        if name == "timeline" and key == "floor":
            notes.append(f"{key}: {last['records']} records, {_kib(last['read_bytes'])} read")
    return notes


def _kib(size: object) -> str:
    return f"{size / 1024:.0f} KiB" if isinstance(size, (int, float)) else "?"


def _median(values: list[object]) -> float:
    return statistics.median(float(v) for v in values if isinstance(v, (int, float)))


def environment_facts() -> dict[str, Any]:
    import torch
    import torchx

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchx": torchx.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    benches = selected(args.only)
    repeats = 1 if args.quick else args.repeats
    if repeats is not None and repeats < 1:
        raise SystemExit(f"bench: --repeats {repeats} must be at least 1")
    env = benchmark_env()
    settings = Settings(
        env=env,
        nproc=args.nproc,
        steps=args.steps,
        log_lines=args.log_lines,
        timeout_s=args.timeout_s,
        restart_timeout_s=args.restart_timeout_s,
        restart_env={FRESH_STORE_ENV: "1"} if args.restart_fresh_store else {},
        hang_timeout_s=args.hang_timeout_s,
        progress_calls=args.progress_calls,
        timeline_nodes=args.timeline_nodes,
        timeline_procs=args.timeline_procs,
    )
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="torchx_elastic_bench_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"bench: runs write under {work_dir}", file=sys.stderr, flush=True)

    started = time.time()
    load_before = os.getloadavg()
    warm_up(env)
    results = []
    for bench in benches:
        count = repeats or DEFAULT_REPEATS[bench.name]
        if bench.name == "exit_hangs" and args.hang_launches is not None:
            count = args.hang_launches
        result, _ = run_benchmark(bench, count, settings, work_dir, args.keep)
        results.append(result)
        results.extend(derived_result(derived, result) for derived in bench.derived)
    load_after = os.getloadavg()

    table = render_table(results)
    document = {
        "command": " ".join(["python bench/run.py", *(argv if argv is not None else sys.argv[1:])]),
        "started_unix_s": started,
        "duration_s": time.time() - started,
        "settings": {
            "nproc": settings.nproc,
            "steps": settings.steps,
            "log_lines": settings.log_lines,
            "timeout_s": settings.timeout_s,
            "restart_timeout_s": settings.restart_timeout_s,
            "max_restarts": settings.max_restarts,
            "restart_env": dict(settings.restart_env),
            "progress_calls": settings.progress_calls,
            "timeline_job": f"{settings.timeline_nodes}x{settings.timeline_procs}",
            "timeline_progress_samples": settings.timeline_progress_samples,
            "omp_num_threads": env["OMP_NUM_THREADS"],
        },
        "machine": {
            **environment_facts(),
            "load_avg_1m_before": load_before[0],
            "load_avg_1m_after": load_after[0],
        },
        "benchmarks": {result.name: result.as_json() for result in results},
        "table_markdown": table,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(table)
    print(
        f"\n{time.time() - started:.0f} s in all; load average (1 min) {load_before[0]:.2f} before,"
        f" {load_after[0]:.2f} after; JSON: {args.output}"
    )
    # a restart run that does not recover is a measured result; any other failure is not
    failed = sum(
        v.failed
        for r in results
        if r.name != "restart" and r.name in BENCHMARKS
        for v in r.variants.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
