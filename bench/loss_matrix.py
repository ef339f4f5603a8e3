"""The loss matrix (issue 60): how soon a job trains at its full size again after a node is
lost, on three simulated hosts (``../shared/netns/hosts.sh``: network namespaces on one
bridge, the c10d store on h0:29500), our agents beside torchrun's.

Cells: {``elastic``: ``--nnodes 2:3`` on h0..h2, ``fixed``: ``--nnodes 2`` on h0 and h1 with
h2 standing by} x {``h1``: an active node lost, ``h0``: the rendezvous host lost} x
{``killed``: every process of the host SIGKILLed, ``cut``: its link down} x {``progress``: a
script that calls ``torchx_elastic.progress()`` every step (``bench/progress_loop.py``),
``plain``: one that does not (``tests/netns/allreduce_loop.py``)}.

The value: seconds from the fault to the first step of world 2 after it (the first step of a
new world; the loops' lines carry wall times), counted once world 2 went on to step
``STEPS_AFTER`` (it trains, not just starts). "not back" with the reason (exit codes, each
survivor's last agent line) when world 2 does not train again within ``--bound`` seconds or
every survivor exited first.

Ours: ``--max-restarts 0`` (a lost node must spend no restart); in the fixed cells the third
agent is a spare, standing by before the fault. torchrun: ``--max-restarts 3`` (a peer lost
fails the survivors' workers, which torchrun counts as a restart) and
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, torch's opt-out of the store it shares with the
workers across restarts, without which torch 2.13's torchrun does not recover (its world 2
fails gloo's connectFullMesh, "Connection refused", round after round; bench/benchmarks.py's
node-loss torchrun sets it too; ``--torchrun-as-is`` leaves it out); it has no spares, so in
the fixed cells a replacement starts right after the fault: on the lost host's place when it
was killed, on h2 when it was cut off.

``python -m bench.loss_matrix [--repeats N] [--only CELLS] [--launchers ours,torchrun]
[--torchrun-as-is] [--output bench/results/loss_matrix.json]``; CELLS: comma-separated
patterns (fnmatch) of ``shape/node/fault/script``, e.g. ``fixed/h0/*`` or ``*/h1/killed/progress``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torchx_elastic.contract import SHARE_STORE_OPT_OUT_ENV

REPO = Path(__file__).resolve().parent.parent
PROGRESS_LOOP = REPO / "bench/progress_loop.py"
PLAIN_LOOP = REPO / "tests/netns/allreduce_loop.py"
STEPS = 1_000_000  # the loops run until the run stops them: a run ends once world 2 trains
STEP_S = 0.02
STEPS_BEFORE = 20  # the job trains before the fault
STEPS_AFTER = 50  # world 2, back, reaches this step: it trains again
BOUND_S = 90.0  # from the fault: world 2 training again, or "not back"
SETUP_S = 120.0  # for the job to train (and the spare to stand by) before the fault
ENDPOINT = "h0:29500"
STANDING_BY = "standing by: the job has its 2 nodes"

SHAPES = ("elastic", "fixed")
NODES = ("h1", "h0")
FAULTS = ("killed", "cut")
SCRIPTS = ("progress", "plain")
LAUNCHERS = ("ours", "torchrun")
ROLE = {"h1": "an active node", "h0": "the rendezvous host"}

STEP = re.compile(r"step (\d+) world (\d+) at ([\d.]+)")
CPP_FRAME = re.compile(r"(frame #\d+: |Exception raised from |<omitting python frames>)")
# what says nothing about the end: torch's socket warnings, our agent's summary path
NOISE = re.compile(r"(socket\.cpp:\d+\]|^Summary \(JSON\): |^error file: |^Logs of every rank: )")


@dataclass(frozen=True)
class Cell:
    shape: str
    node: str
    fault: str
    script: str

    @property
    def key(self) -> str:
        return f"{self.shape}/{self.node}/{self.fault}/{self.script}"


def all_cells() -> list[Cell]:
    return [
        Cell(shape, node, fault, script)
        for shape in SHAPES
        for node in NODES
        for fault in FAULTS
        for script in SCRIPTS
    ]


def selected(cells: Sequence[Cell], only: str | None) -> list[Cell]:
    """The cells whose key matches one of the comma-separated patterns of ``only``."""
    if not only:
        return list(cells)
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    return [c for c in cells if any(fnmatch.fnmatchcase(c.key, p) for p in patterns)]


def flags(launcher: str, shape: str) -> list[str]:
    """The launcher's flags for a cell of ``shape`` (the script and its arguments follow)."""
    nnodes = "2:3" if shape == "elastic" else "2"
    restarts = "0" if launcher == "ours" else "3"
    return [
        f"--nnodes={nnodes}", "--nproc-per-node=1", f"--max-restarts={restarts}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={ENDPOINT}", "--rdzv-id=job",
    ]  # fmt: skip


def launcher_env(launcher: str, torchrun_as_is: bool = False) -> dict[str, str]:
    """What the cell sets in the agents' environment beside GLOO_SOCKET_IFNAME."""
    if launcher == "ours" or torchrun_as_is:
        return {}
    return {SHARE_STORE_OPT_OUT_ENV: "1"}


def launcher_module(launcher: str) -> str:
    return "torchx_elastic.agent" if launcher == "ours" else "torch.distributed.run"


def replacement(launcher: str, cell: Cell) -> str | None:
    """Where a replacement starts right after the fault (torchrun's fixed cells only)."""
    if launcher != "torchrun" or cell.shape != "fixed":
        return None
    return cell.node if cell.fault == "killed" else "h2"


# --- reading the logs -------------------------------------------------------------------


def steps(text: str) -> list[tuple[int, int, float]]:
    """(step, world, wall time) of every step line, in time order."""
    return sorted(
        ((int(s), int(w), float(t)) for s, w, t in STEP.findall(text)), key=lambda x: x[2]
    )


def back_after(text: str, world: int, after_s: float) -> float | None:
    """Wall time of the first step 0 of ``world`` after ``after_s`` (a new world's first
    step: a line of the old world printed just after the fault does not count), or None."""
    for step, w, at in steps(text):
        if at > after_s and w == world and step == 0:
            return at
    return None


def last_step(text: str, world: int, after_s: float) -> int:
    """The last step of ``world`` printed after ``after_s`` (-1: none)."""
    return max((s for s, w, at in steps(text) if w == world and at >= after_s), default=-1)


def last_agent_line(text: str, limit: int = 240) -> str:
    """The last line an agent said: ours starts its own with ``torchx-elastic:``; otherwise
    the last line that says an error or a failure, else the last line that is not a step line,
    a frame of torch's C++ warnings or noise."""
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip()
        and not STEP.search(line)
        and not CPP_FRAME.search(line)
        and not NOISE.search(line.strip())
        and "done world" not in line
    ]
    ours = [line for line in lines if "torchx-elastic:" in line]
    failed = [line for line in lines if re.search(r"error|fail", line, re.IGNORECASE)]
    line = (ours or failed or lines or ["(nothing)"])[-1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def median(values: Sequence[float | None]) -> float | None:
    """The median of the runs that came back (None: none did)."""
    back = [v for v in values if v is not None]
    return round(statistics.median(back), 2) if back else None


# --- the table ---------------------------------------------------------------------------


@dataclass
class CellResult:
    launcher: str
    shape: str
    node: str
    node_role: str
    fault: str
    progress: bool
    script: str
    flags: list[str]
    env: dict[str, str] = field(default_factory=dict)
    replacement: str | None = None
    values: list[float | None] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    median: float | None = None

    @property
    def key(self) -> str:
        return f"{self.shape}/{self.node}/{self.fault}/{'progress' if self.progress else 'plain'}"


def shown(result: CellResult | None) -> str:
    if result is None or not result.values:
        return "-"
    back = sum(v is not None for v in result.values)
    if result.median is None:
        return "not back"
    figure = f"{result.median:.1f} s"
    return figure if back == len(result.values) else f"{figure} ({back}/{len(result.values)} back)"


def env_words(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def render_table(results: Sequence[CellResult]) -> str:
    """One row per cell, ours and torchrun side by side; the reasons of the runs that did
    not come back and each launcher's flags below."""
    by_key: dict[str, dict[str, CellResult]] = {}
    for result in results:
        by_key.setdefault(result.key, {})[result.launcher] = result
    order = {c.key: i for i, c in enumerate(all_cells())}
    rows = [
        "| shape | lost | fault | script | ours | torchrun |",
        "|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for key in sorted(by_key, key=lambda k: order.get(k, len(order))):
        shape, node, fault, script = key.split("/")
        pair = by_key[key]
        rows.append(
            f"| {shape} | {node} ({ROLE.get(node, node)}) | {fault} | {script} "
            f"| {shown(pair.get('ours'))} | {shown(pair.get('torchrun'))} |"
        )
        for launcher in LAUNCHERS:
            found = pair.get(launcher)
            if found is None:
                continue
            for i, (value, reason) in enumerate(zip(found.values, found.reasons, strict=True)):
                if value is None:
                    notes.append(f"- {launcher} {key} run {i + 1}: not back: {reason}")
    flag_lines = sorted(
        {
            f"- {r.launcher} {r.shape}: `{' '.join([*env_words(r.env), *r.flags])}`"
            + (
                "; no spares: a replacement starts right after the fault"
                " (on the killed host's place, on h2 for a host cut off)"
                if r.launcher == "torchrun" and r.shape == "fixed"
                else "; h2 a spare, standing by before the fault"
                if r.shape == "fixed"
                else "; 3 nodes started, one lost: back at world 2"
            )
            for r in results
        }
    )
    parts = ["\n".join(rows), "Flags:\n" + "\n".join(flag_lines)]
    if notes:
        parts.append("Not back:\n" + "\n".join(notes))
    return "\n\n".join(parts) + "\n"


# --- one run on the hosts ----------------------------------------------------------------


class NotBack(Exception):
    pass


def wait_for(
    what: str, check: Callable[[], bool], timeout_s: float, log: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise NotBack(
                f"setup: no {what} within {timeout_s:g}s; last line: {last_agent_line(log())}"
            )
        time.sleep(0.2)


def start_agent(job: object, host: str, launcher: str, cell: Cell, env: dict[str, str]) -> None:
    """``launcher``'s agent on ``host`` (its log goes on after a replacement)."""
    from tests.conftest import _env
    from tests.netns.hosts import HOSTS_SH, Job

    assert isinstance(job, Job)
    script = PROGRESS_LOOP if cell.script == "progress" else PLAIN_LOOP
    command = [
        "bash", str(HOSTS_SH), "exec", host, "env", f"GLOO_SOCKET_IFNAME=veth-{host}",
        *(f"{k}={v}" for k, v in env.items()),
        sys.executable, "-m", launcher_module(launcher), *flags(launcher, cell.shape),
        str(script), str(STEPS), str(STEP_S),
    ]  # fmt: skip
    job.ended_s.pop(host, None)
    with open(job.log(host), "ab") as out:
        job.agents[host] = subprocess.Popen(
            command, cwd=job.workdir, env=_env(), stdout=out, stderr=subprocess.STDOUT
        )


def run_once(
    launcher: str, cell: Cell, workdir: Path, bound_s: float, env: dict[str, str]
) -> tuple[float | None, str]:
    """One run on fresh hosts: (seconds from the fault to world 2 again, or None; why not)."""
    from tests.netns.hosts import hosts, netns_job

    with netns_job(workdir) as job:
        text = job.text
        try:
            if cell.shape == "elastic":
                for host in ("h0", "h1", "h2"):
                    start_agent(job, host, launcher, cell, env)
                wait_for(
                    f"step {STEPS_BEFORE} of world 3",
                    lambda: last_step(text(), 3, 0) >= STEPS_BEFORE, SETUP_S, text,
                )  # fmt: skip
                survivors = [h for h in ("h0", "h1", "h2") if h != cell.node]
            else:
                start_agent(job, "h0", launcher, cell, env)
                start_agent(job, "h1", launcher, cell, env)
                wait_for(
                    f"step {STEPS_BEFORE} of world 2",
                    lambda: last_step(text(), 2, 0) >= STEPS_BEFORE, SETUP_S, text,
                )  # fmt: skip
                survivors = [h for h in ("h0", "h1") if h != cell.node]
                if launcher == "ours":
                    start_agent(job, "h2", launcher, cell, env)
                    wait_for(
                        "h2 standing by",
                        lambda: STANDING_BY in job.log("h2").read_text(errors="replace"),
                        SETUP_S, text,
                    )  # fmt: skip
                    survivors.append("h2")
            fault_s = time.time()
            if cell.fault == "killed":
                job.kill_host(cell.node)
            else:
                hosts("cut", cell.node)
            spare = replacement(launcher, cell)
            if spare is not None:
                start_agent(job, spare, launcher, cell, env)
                survivors.append(spare)
            deadline = fault_s + bound_s
            while time.time() < deadline:
                job.poll()
                log = text()
                back_s = back_after(log, 2, fault_s)
                if back_s is not None and last_step(log, 2, back_s) >= STEPS_AFTER:
                    return round(back_s - fault_s, 2), ""
                if all(h in job.ended_s for h in survivors):
                    break
                time.sleep(0.2)
            job.poll()
            log = text()
            back_s = back_after(log, 2, fault_s)
            what = (
                f"world 2 started {back_s - fault_s:.1f}s after the fault but did not reach"
                f" step {STEPS_AFTER}"
                if back_s is not None
                else "no step of world 2 after the fault"
            )
            ended = (
                "every survivor exited"
                if all(h in job.ended_s for h in survivors)
                else (f"within {bound_s:g}s")
            )
            said = [
                f"{h} {agent_state(job, h)}: "
                + last_agent_line(job.log(h).read_text(errors="replace"))
                for h in survivors
            ]
            return None, f"{what} ({ended}); " + "; ".join(said)
        except NotBack as err:
            return None, str(err)


def agent_state(job: object, host: str) -> str:
    from tests.netns.hosts import Job

    assert isinstance(job, Job)
    code = job.agents[host].poll()
    return "running" if code is None else f"exit {code}"


# --- the matrix --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loss_matrix", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default=None, help="patterns of shape/node/fault/script")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--bound", type=float, default=BOUND_S, help="seconds after the fault")
    parser.add_argument("--output", type=Path, default=REPO / "bench/results/loss_matrix.json")
    parser.add_argument(
        "--torchrun-as-is",
        action="store_true",
        help=f"torchrun without {SHARE_STORE_OPT_OUT_ENV}=1",
    )
    parser.add_argument("--logs", type=Path, default=None, help="where the runs' logs go")
    args = parser.parse_args(argv)
    launchers = [name for name in args.launchers.split(",") if name]
    if any(name not in LAUNCHERS for name in launchers):
        parser.error(f"--launchers: {', '.join(LAUNCHERS)}")
    cells = selected(all_cells(), args.only)
    if not cells:
        parser.error(f"--only {args.only}: no cell")

    sys.path.insert(0, str(REPO))
    from tests.netns.hosts import available

    reason = available()
    if reason is not None:
        print(f"loss matrix: {reason}", file=sys.stderr)
        return 2
    logs = args.logs or Path(tempfile.mkdtemp(prefix="loss_matrix-"))
    results = {
        (launcher, cell): CellResult(
            launcher=launcher,
            shape=cell.shape,
            node=cell.node,
            node_role=ROLE[cell.node],
            fault=cell.fault,
            progress=cell.script == "progress",
            script=str(
                (PROGRESS_LOOP if cell.script == "progress" else PLAIN_LOOP).relative_to(REPO)
            ),
            flags=flags(launcher, cell.shape),
            env=launcher_env(launcher, args.torchrun_as_is),
            replacement=replacement(launcher, cell),
        )  # fmt: skip
        for cell in cells
        for launcher in launchers
    }
    command = "python -m bench.loss_matrix " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.time()

    def write() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "command": command.strip(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
            "bound_s": args.bound,
            "step_s": STEP_S,
            "steps_after": STEPS_AFTER,
            "cells": [asdict(r) for r in results.values() if r.values],
        }
        args.output.write_text(json.dumps(document, indent=2) + "\n")

    for repeat in range(args.repeats):
        for cell in cells:
            for launcher in launchers:
                result = results[(launcher, cell)]
                workdir = logs / f"{cell.key.replace('/', '-')}-{launcher}-{repeat + 1}"
                workdir.mkdir(parents=True, exist_ok=True)
                t0 = time.monotonic()
                value, why = run_once(launcher, cell, workdir, args.bound, result.env)
                result.values.append(value)
                result.reasons.append(why)
                result.logs.append(str(workdir))
                result.median = median(result.values)
                print(
                    f"[{time.monotonic() - t0:5.1f}s] {launcher:8} {cell.key:28} "
                    + (f"{value:.2f}s" if value is not None else f"not back: {why}"),
                    file=sys.stderr,
                    flush=True,
                )
                write()
    write()
    print(render_table([r for r in results.values() if r.values]))
    print(f"{command.strip()}: {time.time() - started:.0f}s; logs in {logs}; {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
