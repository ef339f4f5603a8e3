"""The benchmarks of issues 5, 24 and 42, each a set of variants that run one at a time.

A variant's ``run`` starts one complete job in a fresh directory and returns one
:class:`Sample`; ``bench/run.py`` interleaves the variants repeat by repeat.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench import commands, logcheck, node_loss, phases, procs, restart
from bench.report import Ratio
from tests.timeline_jobs import generated_job, write_crash_files, write_events
from torchx_elastic.agent.console.progress.channel import ActivityChannel, RankActivity
from torchx_elastic.contract import RESTART_COUNT_ENV, SECRET_ENV, SHARE_STORE_OPT_OUT_ENV

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DDP_SCRIPT = "bench/ddp_script.py"
CRASH_SCRIPT = "bench/crash_once.py"
LOG_SCRIPT = "bench/log_heavy.py"
SHORT_SCRIPT = "bench/short_job.py"
PROGRESS_SCRIPT = "bench/progress_calls.py"
TIMELINE_SCRIPT = "bench/timeline_build.py"
# torch's opt-out of the rendezvous store it shares with the workers across restarts
FRESH_STORE_ENV = SHARE_STORE_OPT_OUT_ENV


@dataclass(frozen=True)
class Settings:
    """Sizes and limits shared by all benchmarks (the smoke test makes them tiny)."""

    env: Mapping[str, str]
    nproc: int = 4
    steps: int = 20
    log_lines: int = 100_000
    timeout_s: float = 90.0
    restart_timeout_s: float = 60.0
    max_restarts: int = 3
    restart_env: Mapping[str, str] = field(default_factory=dict)  # extra, restart runs only
    hang_timeout_s: float = 60.0  # exit_hangs: a launch not done by then hung
    progress_calls: int = 100_000  # progress_call: calls per run
    timeline_nodes: int = 64  # timeline: the generated job's nodes x procs per node
    timeline_procs: int = 8
    timeline_progress_samples: int = 1000  # and its progress records


@dataclass
class Sample:
    value: float | None  # None: the run failed; ``note`` says why
    note: str = ""
    facts: dict[str, object] = field(default_factory=dict)


RunVariant = Callable[[Settings, Path], Sample]


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    unit: str
    variants: dict[str, tuple[str, RunVariant]]  # key -> (label, run)
    ratios: tuple[Ratio, ...] = ()
    derived: tuple[Derived, ...] = ()  # more tables from the same runs' facts


@dataclass(frozen=True)
class Derived:
    """A second figure of the same runs, shown as a benchmark of its own: each variant's
    ``fact`` of every run that worked."""

    name: str
    title: str
    unit: str
    fact: str
    ratios: tuple[Ratio, ...] = ()


def _failure(outcome: procs.Outcome) -> str:
    how = "timed out" if outcome.timed_out else f"exit codes {list(outcome.exit_codes)}"
    return f"{how}; output: {outcome.output_path}\n{outcome.output_tail()}"


def _wall(outcome: procs.Outcome) -> Sample:
    if outcome.ok:
        return Sample(outcome.wall_s)
    return Sample(None, _failure(outcome))


def _run(
    commands_: list[list[str]],
    s: Settings,
    run_dir: Path,
    *,
    envs: list[dict[str, str]] | None = None,
    timeout_s: float | None = None,
    sample_rss: bool = False,
    started: Callable[[int], None] = lambda pid: None,
) -> procs.Outcome:
    return procs.run_together(
        commands_,
        output_path=run_dir / "output.log",
        timeout_s=timeout_s or s.timeout_s,
        cwd=REPO,
        envs=envs or [dict(s.env)] * len(commands_),
        sample_rss=sample_rss,
        started=started,
    )


def _steps(s: Settings, world_size: int | None = None) -> list[str]:
    return ["--steps", str(s.steps), *(_world(world_size) if world_size else [])]


# 1. launch -------------------------------------------------------------------------------

RECORD_ENV = "BENCH_RECORD_FILE"


def _launch(
    commands_: list[list[str]],
    s: Settings,
    run_dir: Path,
    world_size: int,
    envs: list[dict[str, str]] | None = None,
) -> Sample:
    """Wall time of a DDP job, with where it went (``bench/phases.py``) as facts."""
    record_file = run_dir / "records.txt"
    envs = [{**env, RECORD_ENV: str(record_file)} for env in envs or [dict(s.env)] * len(commands_)]
    outcome = _run(commands_, s, run_dir, envs=envs)
    sample = _wall(outcome)
    if outcome.ok:
        found = phases.read_phases(
            record_file, world_size, outcome.started_unix_s, outcome.ended_unix_s
        )
        if found is None:  # the launcher said 0, but not every rank got to its end
            return Sample(None, f"not every rank recorded its start and end; {_failure(outcome)}")
        sample.facts.update(to_training_s=found.to_training_s, exit_tail_s=found.exit_tail_s)
        if found.to_first_worker_s is not None:
            sample.facts["to_first_worker_s"] = found.to_first_worker_s
        if found.to_scripts_s is not None:
            sample.facts["to_scripts_s"] = found.to_scripts_s
    return sample


def _world(world_size: int) -> list[str]:
    """The jobs' own check: a launcher that starts a world of another size fails the run."""
    return ["--world-size", str(world_size)]


def launch_ours(s: Settings, run_dir: Path) -> Sample:
    command = commands.ours_torchx(
        f"1x{s.nproc}", DDP_SCRIPT, _steps(s, s.nproc), log_dir=run_dir / "torchx_logs"
    )
    return _launch([command], s, run_dir, s.nproc)


def launch_torchrun(s: Settings, run_dir: Path) -> Sample:
    command = commands.torchrun_standalone(s.nproc, DDP_SCRIPT, _steps(s, s.nproc))
    return _launch([command], s, run_dir, s.nproc)


def launch_ours_spawn(s: Settings, run_dir: Path) -> Sample:
    """Ours with a fresh interpreter per worker (``--start_method spawn``, the option)."""
    command = commands.ours_torchx(
        f"1x{s.nproc}",
        DDP_SCRIPT,
        _steps(s, s.nproc),
        log_dir=run_dir / "torchx_logs",
        component_args=["--start_method", "spawn"],
    )
    return _launch([command], s, run_dir, s.nproc)


def launch_floor(s: Settings, run_dir: Path) -> Sample:
    envs = commands.floor_envs(s.env, s.nproc, procs.free_port())
    floor = commands.floor(s.nproc, DDP_SCRIPT, _steps(s, s.nproc))
    return _launch(floor, s, run_dir, s.nproc, envs)


# 7. a short job ---------------------------------------------------------------------------


def short_ours(s: Settings, run_dir: Path) -> Sample:
    command = commands.ours_torchx(
        f"1x{s.nproc}", SHORT_SCRIPT, _world(s.nproc), log_dir=run_dir / "torchx_logs"
    )
    return _launch([command], s, run_dir, s.nproc)


def short_ours_agent(s: Settings, run_dir: Path) -> Sample:
    command = commands.ours_agent(s.nproc, SHORT_SCRIPT, _world(s.nproc), log_dir=run_dir / "logs")
    return _launch([command], s, run_dir, s.nproc)


def short_torchrun(s: Settings, run_dir: Path) -> Sample:
    command = commands.torchrun_standalone(s.nproc, SHORT_SCRIPT, _world(s.nproc))
    return _launch([command], s, run_dir, s.nproc)


def short_floor(s: Settings, run_dir: Path) -> Sample:
    envs = commands.floor_envs(s.env, s.nproc, procs.free_port())
    floor = commands.floor(s.nproc, SHORT_SCRIPT, _world(s.nproc))
    return _launch(floor, s, run_dir, s.nproc, envs)


# 2. two nodes on one machine ---------------------------------------------------------------


def _per_node(s: Settings) -> int:
    return max(1, s.nproc // 2)


def two_nodes_ours(s: Settings, run_dir: Path) -> Sample:
    command = commands.ours_torchx(
        f"2x{_per_node(s)}",
        DDP_SCRIPT,
        _steps(s, 2 * _per_node(s)),
        log_dir=run_dir / "torchx_logs",
        component_args=["--rdzv_port", str(procs.free_port())],
    )
    return _launch([command], s, run_dir, 2 * _per_node(s))


def two_nodes_torchrun(s: Settings, run_dir: Path) -> Sample:
    agents = commands.torchrun_nodes(
        2, _per_node(s), DDP_SCRIPT, _steps(s, 2 * _per_node(s)), rdzv_port=procs.free_port()
    )
    return _launch(agents, s, run_dir, 2 * _per_node(s))


# 10. rendezvous of N nodes -----------------------------------------------------------------

SCALE_NODES = (2, 4, 8, 16)
SCALE_SECRET = {SECRET_ENV: "bench"}  # every node the same (docs/security.md)


def _scale(nodes: int, ours: bool) -> RunVariant:
    """N nodes of one worker each on this machine, the short job (c10d rendezvous)."""

    def run(s: Settings, run_dir: Path) -> Sample:
        make = commands.ours_nodes if ours else commands.torchrun_nodes
        agents = make(nodes, 1, SHORT_SCRIPT, _world(nodes), rdzv_port=procs.free_port())
        envs = [{**s.env, **SCALE_SECRET}] * nodes
        return _launch(agents, s, run_dir, nodes, envs)

    return run


# 13. a lost node ---------------------------------------------------------------------------


def _node_loss(ours: bool, spare: bool) -> RunVariant:
    """Two nodes of one worker (c10d), the second SIGKILLed mid-run (bench/node_loss.py)."""

    def run(s: Settings, run_dir: Path) -> Sample:
        make = commands.ours_nodes if ours else commands.torchrun_nodes
        job_args = ["--record-file", str(run_dir / "records.txt")]
        [agent, _] = make(2, 1, node_loss.LOCKSTEP_SCRIPT, job_args, rdzv_port=procs.free_port())
        agent[3:3] = ["--max-restarts", str(s.max_restarts)]  # after `python -m MODULE`
        # torch 2.13's torchrun recovers only with its opt-out of the store it keeps across
        # restarts (benchmark 3; docs/bench.md)
        env = {**s.env, **SCALE_SECRET, **({} if ours else {FRESH_STORE_ENV: "1"})}
        value, note = node_loss.lost_node(
            agent, run_dir, env, spare=spare, timeout_s=s.restart_timeout_s
        )
        return Sample(value, note)

    return run


# 3. restart after a crash ------------------------------------------------------------------


def _restart_sample(outcome: procs.Outcome, record_file: Path, world_size: int) -> Sample:
    found = restart.read_recovery(record_file, world_size)
    facts: dict[str, object] = {"wall_s": outcome.wall_s, "exit_codes": list(outcome.exit_codes)}
    if found is not None:
        facts["recovered_in_attempt"] = found.attempt
    if found is not None and outcome.ok:
        return Sample(found.latency_s, facts=facts)
    why = "not every rank came back" if found is None else "ranks came back but the job failed"
    return Sample(None, f"did not recover: {why}; {_failure(outcome)}", facts)


def _crash_args(record_file: Path) -> list[str]:
    return ["--record-file", str(record_file)]


def _restart_env(s: Settings) -> dict[str, str]:
    return {**s.env, **s.restart_env}


def _restart_ours(s: Settings, run_dir: Path, start_method: str | None) -> Sample:
    record_file = run_dir / "records.txt"
    command = commands.ours_agent(
        s.nproc,
        CRASH_SCRIPT,
        _crash_args(record_file),
        log_dir=run_dir / "logs",
        max_restarts=s.max_restarts,
        start_method=start_method,
    )
    outcome = _run([command], s, run_dir, envs=[_restart_env(s)], timeout_s=s.restart_timeout_s)
    return _restart_sample(outcome, record_file, s.nproc)


def restart_ours(s: Settings, run_dir: Path) -> Sample:
    return _restart_ours(s, run_dir, None)


def restart_ours_spawn(s: Settings, run_dir: Path) -> Sample:
    return _restart_ours(s, run_dir, "spawn")


def _restart_torchrun(s: Settings, run_dir: Path, env: Mapping[str, str]) -> Sample:
    record_file = run_dir / "records.txt"
    command = commands.torchrun_standalone(
        s.nproc, CRASH_SCRIPT, _crash_args(record_file), max_restarts=s.max_restarts
    )
    outcome = _run([command], s, run_dir, envs=[dict(env)], timeout_s=s.restart_timeout_s)
    return _restart_sample(outcome, record_file, s.nproc)


def restart_torchrun(s: Settings, run_dir: Path) -> Sample:
    return _restart_torchrun(s, run_dir, _restart_env(s))


def restart_torchrun_fresh_store(s: Settings, run_dir: Path) -> Sample:
    """torchrun with torch's own opt-out of the store it shares across restarts, with which
    torch 2.13's torchrun recovers (as it comes it often does not: docs/bench.md)."""
    return _restart_torchrun(s, run_dir, {**_restart_env(s), FRESH_STORE_ENV: "1"})


# 6. hangs at exit over many launches ------------------------------------------------------


def _hang_sample(outcome: procs.Outcome, s: Settings, run_dir: Path) -> Sample:
    """Wall time of one launch; a launch still running at the timeout is a hang."""
    sample = _wall(outcome)
    sample.facts["hang"] = outcome.timed_out
    return sample


def hangs_ours(s: Settings, run_dir: Path) -> Sample:
    command = commands.ours_agent(s.nproc, DDP_SCRIPT, _steps(s), log_dir=run_dir / "logs")
    outcome = _run([command], s, run_dir, timeout_s=s.hang_timeout_s)
    return _hang_sample(outcome, s, run_dir)


# 4. the agent's own memory -----------------------------------------------------------------


def _rss_sample(command: list[str], s: Settings, run_dir: Path) -> Sample:
    """Peak RSS of the agent process; helpers (not workers) and the PSS of both as facts."""
    record_file = run_dir / "records.txt"
    env = {**s.env, RECORD_ENV: str(record_file)}
    outcome = _run([command], s, run_dir, envs=[env], sample_rss=True)
    if not outcome.ok:
        return Sample(None, _failure(outcome))
    memory = outcome.memory[0]
    workers = phases.worker_pids(record_file.read_text()) if record_file.exists() else set()
    if len(workers) != s.nproc:
        return Sample(None, f"{len(workers)} of {s.nproc} workers recorded their pid")
    helpers = memory.helpers(workers)
    facts: dict[str, object] = {
        "wall_s": outcome.wall_s,
        "helpers": [
            {
                "command": memory.commands.get(pid, "?"),
                "peak_rss_mib": memory.peak_rss_kb[pid] / 1024,
            }
            for pid in helpers
        ],
        "agent_and_helpers_peak_pss_mib": memory.peak_pss_kb({memory.root, *helpers}) / 1024,
    }
    return Sample(memory.peak_rss_kb[memory.root] / 1024, facts=facts)


def rss_ours(s: Settings, run_dir: Path) -> Sample:
    command = commands.ours_agent(s.nproc, DDP_SCRIPT, _steps(s), log_dir=run_dir / "logs")
    return _rss_sample(command, s, run_dir)


def rss_torchrun(s: Settings, run_dir: Path) -> Sample:
    return _rss_sample(commands.torchrun_standalone(s.nproc, DDP_SCRIPT, _steps(s)), s, run_dir)


# 8. the whole job's memory ------------------------------------------------------------------


def _memory_sample(command: list[str], s: Settings, run_dir: Path, world_size: int) -> Sample:
    """Peak PSS of the whole job while all its workers run; the launcher side's as a fact."""
    record_file = run_dir / "records.txt"
    env = {**s.env, RECORD_ENV: str(record_file)}
    outcome = _run([command], s, run_dir, envs=[env], sample_rss=True)
    if not outcome.ok:
        return Sample(None, _failure(outcome))
    workers = phases.worker_pids(record_file.read_text()) if record_file.exists() else set()
    if len(workers) != world_size:
        return Sample(None, f"{len(workers)} of {world_size} workers recorded their pid")
    found = outcome.memory[0].pss_while_running(workers)
    if found is None:
        return Sample(None, "no memory sample saw every worker running")
    whole_kb, launcher_kb = found
    facts: dict[str, object] = {"wall_s": outcome.wall_s, "launcher_pss_mib": launcher_kb / 1024}
    return Sample(whole_kb / 1024, facts=facts)


MEMORY_HOLD_S = 1.0  # how long every rank of the memory job stays after its all_reduce


def _memory_args(nproc: int) -> list[str]:
    """The short job, holding: every worker is sampled there (20 a second) several times."""
    return [*_world(nproc), "--hold-s", str(MEMORY_HOLD_S)]


def _memory_ours(s: Settings, run_dir: Path, nproc: int) -> Sample:
    args = _memory_args(nproc)
    command = commands.ours_agent(nproc, SHORT_SCRIPT, args, log_dir=run_dir / "logs")
    return _memory_sample(command, s, run_dir, nproc)


def _memory_torchrun(s: Settings, run_dir: Path, nproc: int) -> Sample:
    command = commands.torchrun_standalone(nproc, SHORT_SCRIPT, _memory_args(nproc))
    return _memory_sample(command, s, run_dir, nproc)


def memory_ours(s: Settings, run_dir: Path) -> Sample:
    return _memory_ours(s, run_dir, s.nproc)


def memory_torchrun(s: Settings, run_dir: Path) -> Sample:
    return _memory_torchrun(s, run_dir, s.nproc)


def memory_ours_2n(s: Settings, run_dir: Path) -> Sample:
    return _memory_ours(s, run_dir, 2 * s.nproc)


def memory_torchrun_2n(s: Settings, run_dir: Path) -> Sample:
    return _memory_torchrun(s, run_dir, 2 * s.nproc)


# 5. a log-heavy job ------------------------------------------------------------------------


def _log_sample(
    outcome: procs.Outcome, s: Settings, log_dir: Path, console_expected: int
) -> Sample:
    if not outcome.ok:
        return Sample(None, _failure(outcome))
    check = logcheck.check_log_dir(log_dir, s.log_lines)
    console = logcheck.count_console_lines(outcome.output_path)
    facts: dict[str, object] = {
        "all_lines_in_files": check.complete(s.nproc),
        "files": check.summary(s.nproc),
        "console_lines": console.lines,
        "console_whole_lines": console.whole,
        "console_expected": console_expected,
    }
    return Sample(outcome.wall_s, facts=facts)


def _log_args(s: Settings) -> list[str]:
    return ["--lines", str(s.log_lines)]


def _log_ours(s: Settings, run_dir: Path, tee: int) -> Sample:
    log_dir = run_dir / "logs"
    command = commands.ours_agent(s.nproc, LOG_SCRIPT, _log_args(s), log_dir=log_dir, tee=tee)
    console_expected = s.nproc * s.log_lines if tee & 1 else 0
    return _log_sample(_run([command], s, run_dir), s, log_dir, console_expected)


def log_ours_console(s: Settings, run_dir: Path) -> Sample:
    return _log_ours(s, run_dir, tee=3)


def log_ours_quiet(s: Settings, run_dir: Path) -> Sample:
    return _log_ours(s, run_dir, tee=0)


def log_torchrun(s: Settings, run_dir: Path) -> Sample:
    log_dir = run_dir / "logs"
    command = commands.torchrun_standalone(
        s.nproc, LOG_SCRIPT, _log_args(s), log_dir=log_dir, tee=3
    )
    return _log_sample(_run([command], s, run_dir), s, log_dir, s.nproc * s.log_lines)


# 11. one progress() call --------------------------------------------------------------------

_CHANNEL_WAIT_S = 10.0  # the agent's channel reads a datagram already sent in well under this


def _in_process(
    command: list[str],
    s: Settings,
    run_dir: Path,
    env: Mapping[str, str],
    started: Callable[[int], None] = lambda pid: None,
) -> tuple[dict[str, object], procs.Outcome] | Sample:
    """Run a benchmark's process; what it timed in itself (its ``--result-file``), or the
    failed sample."""
    result_file = run_dir / "result.json"
    command = [*command, "--result-file", str(result_file)]
    outcome = _run([command], s, run_dir, envs=[dict(env)], started=started)
    if not outcome.ok:
        return Sample(None, _failure(outcome))
    if not result_file.exists():
        return Sample(None, f"no {result_file.name}; {_failure(outcome)}")
    found: dict[str, object] = json.loads(result_file.read_text())
    return found, outcome


def _seconds(result: Mapping[str, object]) -> float:
    seconds = result["seconds"]
    assert isinstance(seconds, (int, float)), result
    return float(seconds)


def _last_step_seen(activity: RankActivity, step: int) -> bool:
    """Whether the agent's channel got the last progress() call (it is always sent)."""
    deadline = time.monotonic() + _CHANNEL_WAIT_S
    while time.monotonic() < deadline:
        seen = activity.snapshot().get(0)
        if seen is not None and seen.step == step:
            return True
        time.sleep(0.01)
    return False


def _progress(kind: str) -> RunVariant:
    """``--progress-calls`` calls of ``kind`` in one process, the agent's channel in this one
    (every variant gets it), in ns per call."""

    def run(s: Settings, run_dir: Path) -> Sample:
        activity = RankActivity()
        channel = ActivityChannel(activity)
        try:
            env = {**s.env, **channel.env(), "LOCAL_RANK": "0", RESTART_COUNT_ENV: "0"}
            command = [commands.PYTHON, PROGRESS_SCRIPT, "--kind", kind]
            command += ["--calls", str(s.progress_calls)]
            # the process is the agent's worker here: heard even if read once it has ended
            found = _in_process(command, s, run_dir, env, started=lambda pid: channel.expect([pid]))
            if isinstance(found, Sample):
                return found
            result, outcome = found
            if kind == "progress" and not _last_step_seen(activity, s.progress_calls):
                return Sample(None, f"the agent's channel never saw step {s.progress_calls}")
        finally:
            channel.close()
        facts = {**result, "process_wall_s": outcome.wall_s}
        return Sample(_seconds(result) / s.progress_calls * 1e9, facts=facts)

    return run


# 12. the timeline of a big job ---------------------------------------------------------------


def _timeline(kind: str) -> RunVariant:
    """The generated ``--timeline-nodes x --timeline-procs`` job that failed once and
    restarted (``tests/timeline_jobs.py``), written untimed; what ``kind`` does with it, ms."""

    def run(s: Settings, run_dir: Path) -> Sample:
        log_dir, out_dir = run_dir / "logs", run_dir / "out"
        job = generated_job(
            s.timeline_nodes, s.timeline_procs, progress_samples=s.timeline_progress_samples
        )
        write_events(log_dir, job)
        write_crash_files(log_dir)
        out_dir.mkdir()
        command = [commands.PYTHON, TIMELINE_SCRIPT, "--kind", kind, "--log-dir", str(log_dir)]
        found = _in_process([*command, "--out-dir", str(out_dir)], s, run_dir, s.env)
        if isinstance(found, Sample):
            return found
        result, outcome = found
        facts = {**result, "process_wall_s": outcome.wall_s}
        return Sample(_seconds(result) * 1000, facts=facts)

    return run


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "launch",
            "1. launch",
            "s",
            {
                "ours": (
                    "ours: torchx run -s local_cwd dist.ddp -j 1xN (default start method)",
                    launch_ours,
                ),
                "ours_spawn": ("the same, --start_method spawn", launch_ours_spawn),
                "torchrun": ("torchrun --standalone --nproc_per_node N", launch_torchrun),
                "floor": ("floor: N x python script.py", launch_floor),
            },
            (
                Ratio("ours", "torchrun", goal_max=0.5),
                Ratio("ours", "floor", goal_max=1.0, strict=True),
                Ratio("ours_spawn", "torchrun"),
                Ratio("torchrun", "floor"),
            ),
        ),
        Benchmark(
            "two_nodes",
            "2. two nodes, one machine",
            "s",
            {
                "ours": ("ours: torchx run -s local_cwd dist.ddp -j 2x(N/2)", two_nodes_ours),
                "torchrun": ("2 torchrun agents, c10d rendezvous", two_nodes_torchrun),
            },
            (Ratio("ours", "torchrun"),),
        ),
        Benchmark(
            "restart",
            "3. restart latency",
            "s",
            {
                "ours": ("ours: agent --max-restarts 3 (default start method)", restart_ours),
                "ours_spawn": ("the same, --start-method spawn", restart_ours_spawn),
                "torchrun": ("torchrun --max-restarts 3", restart_torchrun),
                "torchrun_fresh_store": (
                    f"the same, {FRESH_STORE_ENV}=1",
                    restart_torchrun_fresh_store,
                ),
            },
            (
                Ratio("ours", "torchrun", goal_max=0.3),
                Ratio("ours", "torchrun_fresh_store", goal_max=0.3),
                Ratio("ours_spawn", "torchrun"),
            ),
        ),
        Benchmark(
            "agent_rss",
            "4. agent peak RSS",
            "MiB",
            {
                "ours": ("ours: agent process (VmHWM)", rss_ours),
                "torchrun": ("torchrun agent process (VmHWM)", rss_torchrun),
            },
            (Ratio("ours", "torchrun"),),
        ),
        Benchmark(
            "log_heavy",
            "5. log-heavy job",
            "s",
            {
                "ours_console": ("ours: agent, console on (--tee 3)", log_ours_console),
                "ours_quiet": ("ours: agent, console off (--tee 0)", log_ours_quiet),
                "torchrun": ("torchrun --tee 3 --log-dir", log_torchrun),
            },
            (Ratio("ours_console", "ours_quiet"), Ratio("ours_console", "torchrun")),
        ),
        Benchmark(
            "exit_hangs",
            "6. hangs over N launches",
            "s",
            {
                "ours": (
                    "ours: agent (default start method), one launch per repeat",
                    hangs_ours,
                ),
            },
        ),
        Benchmark(
            "short_job",
            "7. short job",
            "s",
            {
                "ours": ("ours: torchx run -s local_cwd dist.ddp -j 1xN", short_ours),
                "ours_agent": ("ours: the agent alone, --standalone", short_ours_agent),
                "torchrun": ("torchrun --standalone --nproc_per_node N", short_torchrun),
                "floor": ("floor: N x python short_job.py", short_floor),
            },
            (
                Ratio("ours", "torchrun", goal_max=0.5),
                Ratio("ours_agent", "torchrun", goal_max=0.45),
                Ratio("ours", "floor"),
            ),
        ),
        Benchmark(
            "rendezvous_scale",
            "10. rendezvous of N nodes (1 worker each, one machine)",
            "s",
            {
                **{
                    f"ours_{n}": (f"ours: {n} agents, --nnodes {n}, short job", _scale(n, True))
                    for n in SCALE_NODES
                },
                **{
                    f"torchrun_{n}": (f"{n} torchrun agents, --nnodes {n}", _scale(n, False))
                    for n in SCALE_NODES
                },
            },
            tuple(
                Ratio(f"ours_{n}", f"torchrun_{n}", goal_max=0.5 if n == 8 else None)
                for n in SCALE_NODES
            ),
        ),
        Benchmark(
            "node_loss",
            "13. a lost node: kill to world 2 again (2 nodes x 1 worker, one machine)",
            "s",
            {
                "ours_spare": (
                    "ours: --nnodes 2 and a spare standing by (dist.ddp --spares 1)",
                    _node_loss(ours=True, spare=True),
                ),
                "ours": (
                    "ours: --nnodes 2, a new agent started at once in the lost one's place",
                    _node_loss(ours=True, spare=False),
                ),
                "torchrun": (
                    f"torchrun: --nnodes 2, the same instant replacement (no spares),"
                    f" {FRESH_STORE_ENV}=1",
                    _node_loss(ours=False, spare=False),
                ),
            },
            (Ratio("ours_spare", "torchrun"), Ratio("ours", "torchrun")),
        ),
        Benchmark(
            "memory",
            "8. memory, whole job",
            "MiB",
            {
                "ours": ("ours: agent, 1xN short job held 1 s (PSS of all processes)", memory_ours),
                "torchrun": ("torchrun, 1xN", memory_torchrun),
                "ours_2n": ("ours: agent, 1x2N", memory_ours_2n),
                "torchrun_2n": ("torchrun, 1x2N", memory_torchrun_2n),
            },
            (
                Ratio("ours", "torchrun", goal_max=0.4),
                Ratio("ours_2n", "torchrun_2n", goal_max=0.25),
            ),
            (
                Derived(
                    "memory_launcher",
                    "9. memory, launcher side",
                    "MiB",
                    "launcher_pss_mib",
                    (
                        Ratio("ours", "torchrun", goal_max=1.0),
                        Ratio("ours_2n", "torchrun_2n", goal_max=1.0),
                    ),
                ),
            ),
        ),
        Benchmark(
            "progress_call",
            "11. one progress() call",
            "ns",
            {
                "ours": (
                    "ours: torchx_elastic.worker.progress(step, N), the agent's channel live",
                    _progress("progress"),
                ),
                "floor": ("floor: a Python function of the same arguments", _progress("trivial")),
                "sendto": (
                    "one socket.sendto per call, same datagram and socket",
                    _progress("sendto"),
                ),
            },
            (Ratio("ours", "floor"), Ratio("ours", "sendto", goal_max=1.0, strict=True)),
        ),
        Benchmark(
            "timeline",
            "12. timeline of an NxM job",
            "ms",
            {
                "ours": (
                    "ours: timeline_of_dir + html.render + trace_events (imports torch)",
                    _timeline("ours"),
                ),
                "ours_warm": ("the same again in the same process", _timeline("ours_warm")),
                "floor": ("floor: read the files, parse the events' lines", _timeline("floor")),
            },
            (Ratio("ours", "floor"), Ratio("ours_warm", "floor")),
        ),
    )
}
