"""One run: the store, the harness processes, the phases, and the raw facts of each.

Phases: every node builds its handler (``setup``); all join the first round at one moment
(``form``: until every node is in a round of all the nodes); ``settle`` seconds later a
steady-state ``window``; then one node vanishes (``loss``: until every survivor is in a
round without it). Everything measured is in the record :func:`run` returns
(summed up by :mod:`bench.scale.summary`).
"""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.scale.impls import Job
from bench.scale.summary import percentile

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
# a launcher's variables from an enclosing job must not reach the simulated agents
_INHERITED_PREFIXES = ("PET_", "TORCHELASTIC_", "TORCHX_")
STRAGGLERS_SHOWN = 20  # of the survivors not back in time, the stacks of this many


class HarnessError(Exception):
    """The harness could not run (not a measured failure of a rendezvous)."""


@dataclass
class Options:
    impl: str
    nodes: int
    window_s: float = 30.0
    settle_s: float | None = None  # None: two keep-alive intervals and a second
    procs: int = 0  # 0: one per CPU, at most one per 16 nodes
    monitor_interval_s: float = 0.1  # torchrun's and our agent's default
    conf: dict[str, str] = field(default_factory=dict)
    min_nodes: int | None = None  # None: nodes - 1, so the round re-forms without one
    progress: bool = True
    loss: bool = True
    setup_timeout_s: float = 600.0
    form_timeout_s: float = 300.0
    reform_timeout_s: float = 180.0
    log_dir: Path | None = None
    join_spread_s: float = 0.0
    switch_interval_s: float = 0.005  # Python's
    root: Path = REPO  # where the simulated agents import torchx_elastic and bench from


def process_count(options: Options) -> int:
    if options.procs > 0:
        return min(options.procs, options.nodes)
    return max(1, min(os.cpu_count() or 1, math.ceil(options.nodes / 16)))


def clean_env(impl: str, root: Path = REPO) -> dict[str, str]:
    from torchx_elastic.contract import SECRET_ENV, SHARE_STORE_OPT_OUT_ENV, new_secret

    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a vanished node's peers would log C++ frames
    env.pop(SHARE_STORE_OPT_OUT_ENV, None)
    if impl == "ours":
        # as schedulers start the agent: a job secret (the state is signed), and torch's
        # shared store of the workers off (compat.next_round sets it around each round;
        # set for the whole process, the threads' rounds do not race on it)
        env[SECRET_ENV] = new_secret()
        env[SHARE_STORE_OPT_OUT_ENV] = "1"
    return env


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NodeProcs:
    """The harness processes and the JSON lines they send, as one queue."""

    def __init__(self, job: Job, options: Options, env: dict[str, str], log_dir: Path) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[Path] = []
        count = process_count(options)
        job_json = json.dumps(asdict(job))
        for i in range(count):
            first = options.nodes * i // count
            last = options.nodes * (i + 1) // count
            log = log_dir / f"{options.impl}-{options.nodes}-proc{i}.log"
            self.logs.append(log)
            command = [sys.executable, "-m", "bench.scale.nodes", job_json, options.impl]
            proc = subprocess.Popen(
                [*command, str(first), str(last - first)],
                cwd=options.root,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log.open("w"),
                text=True,
                bufsize=1,
            )
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(i, proc.stdout), daemon=True).start()

    def _read(self, index: int, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["proc"] = index
            self.events.put(event)
        self.events.put({"ev": "exit", "proc": index})

    def send(self, line: str) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write(line + "\n")
                    proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    pass

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def tail(self, lines: int = 5) -> list[str]:
        """The last lines each process wrote to its log (for a failed run's notes)."""
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            out += [f"{log.name}: {line}" for line in text[-lines:]]
        return out

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class StoreServer:
    def __init__(self, env: dict[str, str], root: Path = REPO) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.scale.store_server"],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise HarnessError("the store server did not start (see its stderr above)")
        self.facts: dict[str, Any] = json.loads(line)
        self.port = int(self.facts["port"])

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class RunState:
    """What the harness processes said so far."""

    def __init__(self, procs: NodeProcs, nodes: int) -> None:
        self.procs = procs
        self.nodes = nodes
        self.ready: dict[int, dict[str, Any]] = {}
        self.joins: dict[int, list[dict[str, Any]]] = {}
        self.windows: dict[int, dict[str, Any]] = {}
        self.finals: dict[int, dict[str, Any]] = {}
        self.dropped: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.verdicts: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.forming: list[dict[str, Any]] = []
        self.stacks: list[dict[str, Any]] = []
        self.counts: list[dict[str, Any]] = []
        self.marks: dict[str, dict[int, dict[str, Any]]] = {}
        self.exited: set[int] = set()

    def _take(self, event: dict[str, Any]) -> None:
        kind = event["ev"]
        if kind == "joined":
            self.joins.setdefault(event["node"], []).append(event)
        elif kind == "ready":
            self.ready[event["proc"]] = event
        elif kind == "window":
            self.windows[event["proc"]] = event
        elif kind == "final":
            self.finals[event["proc"]] = event
        elif kind == "dropped":
            self.dropped.append(event)
        elif kind == "lost":
            self.lost.append(event)
        elif kind == "verdict":
            self.verdicts.append(event)
        elif kind == "error":
            self.errors.append(event)
        elif kind == "forming":
            self.forming.append(event)
        elif kind == "stacks":
            self.stacks.append(event)
        elif kind == "count":
            self.counts.append(event)
        elif kind == "mark":
            self.marks.setdefault(event["phase"], {})[event["proc"]] = event
        elif kind == "exit":
            self.exited.add(event["proc"])

    def wait_for(self, done: Any, timeout_s: float) -> bool:
        """Take what the processes say until ``done()`` (False: not by ``timeout_s``, or
        every process is gone)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or len(self.exited) == len(self.procs.procs):
                return False
            try:
                self._take(self.procs.events.get(timeout=min(left, 0.2)))
            except queue.Empty:
                continue
        return True

    def sleep(self, seconds: float) -> None:
        self.wait_for(lambda: False, seconds)

    def failed_nodes(self) -> set[int]:
        return {int(e["node"]) for e in self.errors}

    def in_round(self, nodes: set[int], world: int, since: float) -> dict[int, dict[str, Any]]:
        """Of ``nodes``, those that returned from a round of ``world`` nodes that they
        started to join at ``since`` or later: their first such join."""
        found = {}
        for node in nodes:
            for join in self.joins.get(node, []):
                if join["world"] == world and join["started"] >= since:
                    found[node] = join
                    break
        return found


def rank_conflicts(joins: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the ranks of joins that returned from one round (by round
    number): two nodes of one rank, a rank outside the round's size, or nodes that were
    told different sizes of it (a round decided twice, differently)."""
    said = []
    rounds: dict[Any, list[dict[str, Any]]] = {}
    for join in joins:
        rounds.setdefault(join.get("round"), []).append(join)
    for number, of_round in sorted(rounds.items(), key=lambda kv: str(kv[0])):
        worlds = sorted({j["world"] for j in of_round})
        if len(worlds) > 1:
            said.append(f"round {number}: sizes {worlds}")
        ranks = [j["rank"] for j in of_round]
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        if twice:
            said.append(f"round {number}: ranks {twice[:5]} given twice")
        outside = sorted({j["rank"] for j in of_round if not 0 <= j["rank"] < j["world"]})
        if outside:
            said.append(f"round {number}: ranks {outside[:5]} outside the round's size")
    return said


def _say(options: Options, text: str) -> None:
    """A phase's end, on stderr (a long run shows where it is)."""
    print(f"bench.scale: {options.impl} x {options.nodes}: {text}", file=sys.stderr, flush=True)


def _setup(state: RunState, options: Options, record: dict[str, Any]) -> None:
    count = len(state.procs.procs)
    if not state.wait_for(lambda: len(state.ready) == count, options.setup_timeout_s):
        tail = "; ".join(state.procs.tail())
        raise HarnessError(f"{len(state.ready)} of {count} harness processes ready: {tail}")
    record["setup_s"] = max(r["setup_s"] for r in state.ready.values())
    record["settings"] = state.ready[0]["settings"]
    record["agent_package"] = state.ready[0]["agent_package"]
    _say(options, f"{options.nodes} nodes built in {record['setup_s']:.1f} s")


def _mark(state: RunState, phase: str) -> dict[str, Any]:
    """Each live process's lag and CPU time since the last mark: the worst of them."""
    live = [i for i, proc in enumerate(state.procs.procs) if proc.poll() is None]
    state.procs.send(f"mark {phase}")
    state.wait_for(lambda: all(i in state.marks.get(phase, {}) for i in live), 60)
    marks = state.marks.get(phase, {}).values()
    return {
        "lag_ms_p99": _worst_ms(m["lag_s"]["p99"] for m in marks),
        "lag_ms_max": _worst_ms(m["lag_s"]["max"] for m in marks),
    }


def _worst_ms(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return round(max(found) * 1000, 1) if found else None


def _progress(state: RunState, since: float) -> list[dict[str, Any]]:
    """What the processes said of a round forming since ``since``, every few seconds."""
    said = [e for e in state.forming if e["since"] == since]
    hidden = ("ev", "t", "since")
    return [
        {k: v for k, v in e.items() if k not in hidden} | {"s": round(e["t"] - since, 1)}
        for e in said
    ]


def _traffic(state: RunState, since: float) -> dict[str, Any]:
    """The store traffic of every live node since ``since`` (the harness processes count from
    the phase's start), a second per node: calls and bytes in all and of the state."""
    seconds = max(time.time() - since, 1e-3)
    live = [proc for proc in state.procs.procs if proc.poll() is None]
    before = len(state.counts)
    state.procs.send("count phase")
    state.wait_for(lambda: len(state.counts) - before >= len(live), 60)
    found = state.counts[before:]
    nodes = sum(e["live_nodes"] for e in found)
    per_node_s = max(nodes, 1) * seconds

    def total(name: str) -> int:
        return sum(int(e[name]) for e in found)

    return {
        "seconds": round(seconds, 2),
        "live_nodes": nodes,
        "calls_per_s_per_node": total("calls") / per_node_s,
        "bytes_per_s_per_node": total("bytes") / per_node_s,
        "state_calls_per_s_per_node": total("state_calls") / per_node_s,
        "state_bytes_per_s_per_node": total("state_bytes") / per_node_s,
        "state_bytes_per_s_max_node": max((e["state_bytes_max"] for e in found), default=0)
        / seconds,
        "bytes_per_s_per_node_by_kind": {
            kind: sum(e["kind_bytes"].get(kind, 0) for e in found) / per_node_s
            for kind in sorted({k for e in found for k in e["kind_bytes"]})
        },
        "cas_attempts": total("cas_attempts"),
        "cas_conflicts": total("cas_conflicts"),
        "think_ms": _percentiles_ms([s for e in found for s in e["think_wall_s"]]),
        "think_cpu_ms": _percentiles_ms([s for e in found for s in e["think_cpu_s"]]),
    }


def _percentiles_ms(seconds: list[float]) -> dict[str, float | None]:
    """p50 and p99 of ``seconds``, in milliseconds."""
    found = {q: percentile(seconds, q) for q in (50, 99)}
    return {f"p{q}": None if v is None else round(v * 1000, 2) for q, v in found.items()}


def _stragglers(state: RunState, late: set[int]) -> dict[str, Any]:
    """Where the threads of the nodes ``late`` wait (at most :data:`STRAGGLERS_SHOWN` of them),
    and every harness process's threads grouped by their innermost frames."""
    shown = sorted(late)[:STRAGGLERS_SHOWN]
    live = [proc for proc in state.procs.procs if proc.poll() is None]
    before = len(state.stacks)
    state.procs.send("stacks " + " ".join(map(str, shown)))
    state.wait_for(lambda: len(state.stacks) - before >= len(live), 30)
    found = state.stacks[before:]
    return {
        "late": len(late),
        "nodes": {n: s for e in found for n, s in e["nodes"].items()},
        "threads": [{"proc": e["proc"], "threads": e["threads"]} for e in found],
    }


def _form(state: RunState, options: Options, server: StoreServer, record: dict[str, Any]) -> float:
    everyone = set(range(options.nodes))
    _mark(state, "setup")
    store_cpu_s = server.cpu_s()
    go_at = time.time() + 1.0
    state.procs.send(f"go {go_at}")
    formed = state.wait_for(
        lambda: (
            len(state.in_round(everyone, options.nodes, go_at)) == options.nodes
            or everyone <= state.failed_nodes()
        ),
        options.form_timeout_s,
    )
    joins = state.in_round(everyone, options.nodes, go_at)
    formed = formed and len(joins) == options.nodes
    firsts = [js[0] for js in state.joins.values() if js]
    traffic = _traffic(state, go_at)
    record["form"] = {
        "go_at": go_at,
        "formed": formed,
        "all_in_s": max(j["t"] for j in joins.values()) - go_at if formed else None,
        "first_join_s": sorted(round(j["t"] - go_at, 3) for j in firsts),
        "first_join_worlds": sorted({j["world"] for j in firsts}),
        "start_lag_s": max((j["started"] - go_at for j in firsts), default=None),
        "rank_conflicts": rank_conflicts(firsts),
        "harness": _mark(state, "form"),
        "store_cores": (server.cpu_s() - store_cpu_s) / max(time.time() - go_at, 1e-3),
        "traffic": traffic,
        "progress": _progress(state, go_at),
    }
    all_in_s = record["form"]["all_in_s"]
    _say(options, f"first round in {all_in_s:.1f} s" if formed else "no first round")
    return go_at


def _window(state: RunState, options: Options, server: StoreServer, record: dict[str, Any]) -> None:
    settle_s = options.settle_s
    if settle_s is None:
        settle_s = 2 * record["settings"]["keep_alive_interval_s"] + 1.0
    state.sleep(settle_s)
    live = [i for i, proc in enumerate(state.procs.procs) if proc.poll() is None]
    server_cpu, procs_cpu = server.cpu_s(), [proc_cpu_s(pid) for pid in state.procs.pids()]
    started = time.time()
    state.procs.send("window_start")
    _say(options, f"window of {options.window_s:g} s")
    state.sleep(options.window_s)
    state.procs.send("window_end")
    ended = time.time()
    server_cpu = server.cpu_s() - server_cpu
    procs_cpu = [
        proc_cpu_s(pid) - cpu for pid, cpu in zip(state.procs.pids(), procs_cpu, strict=True)
    ]
    state.wait_for(lambda: all(i in state.windows for i in live), 120)
    record["window"] = {
        "started": started,
        "seconds": ended - started,
        "store_cpu_s": server_cpu,
        "procs_cpu_s": procs_cpu,
        "reports": [state.windows[i] for i in sorted(state.windows)],
        "joins": [j for js in state.joins.values() for j in js if started <= j["started"] <= ended],
        "dropped": [e for e in state.dropped if started <= e["t"] <= ended],
        "lost": [e for e in state.lost if started <= e["t"] <= ended],
    }


def _victim(state: RunState) -> int:
    """The node of the highest rank in the latest round (not node 0, which sums up the
    job's progress in ours)."""
    latest = {node: js[-1] for node, js in state.joins.items() if js}
    return max(latest, key=lambda node: latest[node]["rank"])


def _loss(state: RunState, options: Options, record: dict[str, Any]) -> None:
    from bench.scale.nodes import node_address

    victim = _victim(state)
    survivors = set(range(options.nodes)) - {victim} - state.failed_nodes()
    lost_at = time.time()
    state.procs.send(f"lose {victim} {1 if options.impl == 'torch' else 0} {lost_at}")
    world = options.nodes - 1
    reformed = state.wait_for(
        lambda: len(state.in_round(survivors, world, lost_at)) == len(survivors),
        options.reform_timeout_s,
    )
    joins = state.in_round(survivors, world, lost_at)
    late = survivors - set(joins)
    traffic = _traffic(state, lost_at)
    address = node_address(victim)
    named = [
        e["t"] - lost_at
        for e in state.lost
        if e["t"] >= lost_at and any(n.startswith(address + " ") for n in e["names"])
    ]
    record["loss"] = {
        "lost_at": lost_at,
        "victim": victim,
        "victim_address": address,
        "told_at_once": options.impl == "torch",
        "reformed": reformed,
        "reformed_s": max(j["t"] for j in joins.values()) - lost_at if reformed else None,
        "survivors_in_new_round": len(joins),
        "rank_conflicts": rank_conflicts(
            [j for js in state.joins.values() for j in js if j["started"] >= lost_at]
        ),
        "survivors": len(survivors),
        "detected_first_s": min(named, default=None),
        "detected_last_s": max(named, default=None),
        "detections": len(named),
        "traffic": traffic,
        "progress": _progress(state, lost_at),
        "stragglers": _stragglers(state, late) if late else None,
    }
    reformed_s = record["loss"]["reformed_s"]
    _say(options, f"re-formed in {reformed_s:.1f} s" if reformed else "not re-formed")


def run(options: Options) -> dict[str, Any]:
    """One measured run of ``options.impl`` with ``options.nodes`` nodes: the raw record."""
    import tempfile

    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = clean_env(options.impl, options.root)
    min_nodes = options.min_nodes or max(1, options.nodes - 1)
    server = StoreServer(env, options.root)
    job = Job(
        HOST,
        server.port,
        f"scale-{options.impl}-{options.nodes}",
        options.nodes,
        min_nodes,
        dict(options.conf),
        options.monitor_interval_s,
        options.progress,
        options.join_spread_s,
        options.switch_interval_s,
    )
    record: dict[str, Any] = {
        "impl": options.impl,
        "nodes": options.nodes,
        "min_nodes": min_nodes,
        "procs": process_count(options),
        "monitor_interval_s": options.monitor_interval_s,
        "join_spread_s": options.join_spread_s,
        "switch_interval_s": options.switch_interval_s,
        "conf": dict(options.conf),
        "progress": options.progress and options.impl == "ours",
        "store_server": server.facts,
        "log_dir": str(log_dir),
    }
    procs = NodeProcs(job, options, env, log_dir)
    state = RunState(procs, options.nodes)
    try:
        _setup(state, options, record)
        _form(state, options, server, record)
        if record["form"]["formed"]:
            _window(state, options, server, record)
            if options.loss:
                _loss(state, options, record)
    finally:
        procs.send("stop")
        state.wait_for(lambda: len(state.finals) + len(state.exited) >= len(procs.procs), 30)
        procs.close()
        server.close()
        record["dropped"] = state.dropped
        record["lost"] = state.lost
        record["verdicts"] = state.verdicts
        record["errors"] = state.errors
        if state.errors or not record.get("form", {}).get("formed"):
            record["log_tail"] = procs.tail()
    return record
