"""One harness process: many simulated nodes, a thread each, torch imported once.

``python -m bench.scale.nodes JOB_JSON IMPL FIRST COUNT``: builds nodes FIRST ..
FIRST+COUNT-1 of the job (each with its own store client and handler, one after the
other), says ``ready`` and waits for the coordinator's commands on stdin, one a line:

- ``go <unix time>``: every node joins the first round at that moment;
- ``window_start`` / ``window_end``: counters from zero / what the nodes did since, with
  this process's CPU time and the lag of its threads;
- ``lose <node> <tell> <unix time>``: that node vanishes (its store calls never return: no
  keep-alive, no leave); ``tell`` 1: every other node starts a new round at once (torchrun's
  agent learns of a lost node only from its workers' failure: the best case for it); how far
  the survivors got since that time is reported as ``forming``;
- ``stacks <node> ...``: where the threads of those nodes wait, and every thread of the
  process grouped by its innermost frames (``stacks``: a round that did not re-form);
- ``stop``: the last report, then exit.

It answers with JSON lines on its stdout (torch's and the agent's own output goes to
stderr): ``ready``, ``joined`` (a node returned from a round), ``dropped`` (a healthy node
saw itself left out of the rendezvous), ``lost`` (our agent declared peers dead, in its
checks), ``verdict`` (its liveness wrote that a node is dead, at any time: while it joins a
round too), ``forming``, ``stacks``, ``error``, ``window`` and ``final``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Any, TextIO

from bench.scale.counting import CountingStore, NodeCounters, NodeStopped
from bench.scale.impls import (
    Job,
    SimNode,
    dropped_from_round,
    forming_view,
    settings_of,
    state_round,
)

LAG_PROBE_S = 0.02  # the lag probe's sleep
STACK_BYTES = 512 * 1024  # thousands of threads: smaller stacks than the default 8 MiB


def node_address(index: int) -> str:
    """A loopback address of its own for every node (``127.0.0.2`` on): the agents name
    peers by address and pid, and all nodes of one process share the pid. Only
    ``127.0.0.1`` listens (the store), so a probe of a peer's address is refused at once,
    as by a peer host without a store."""
    index += 1  # 127.0.0.1 is the store's
    return f"127.{index // 65025}.{index // 255 % 255}.{index % 255 + 1}"


class Emitter:
    """JSON lines to the coordinator, whole, from any thread."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class LagProbe:
    """How late a thread of this process wakes up from a short sleep (GIL and CPU)."""

    recent: list[float] = []  # the last samples (for the reports while forming)

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._thread = threading.Thread(target=self._run, name="lag-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> list[float]:
        done, self.samples = self.samples, []
        return done

    def _run(self) -> None:
        while True:
            start = time.perf_counter()
            time.sleep(LAG_PROBE_S)
            lag = time.perf_counter() - start - LAG_PROBE_S
            self.samples.append(lag)
            LagProbe.recent = [*LagProbe.recent[-49:], lag]


class NodeRunner:
    """A node's agent loop: the first round at ``go``, then a check every monitor interval
    and a new round when the check asks for one."""

    def __init__(self, index: int, node: SimNode, job: Job, emit: Emitter) -> None:
        self.index = index
        self.node = node
        self._job = job
        self._emit = emit
        self.go = threading.Event()
        self.told = threading.Event()  # torch: its workers failed, the agent re-forms
        self._said_dropped = False
        self.last_join_started = 0.0  # when it started the last round it returned from
        self.thread = threading.Thread(target=self._run, name=f"node-{index}", daemon=True)

    def _run(self) -> None:
        try:
            self.go.wait()
            time.sleep(self._job.join_delay_s(self.index))
            self._join("first")
            self._loop()
        except NodeStopped:
            return
        except Exception as err:  # noqa: BLE001 (said to the coordinator: a failed node)
            if not self.node.store.frozen:
                self._emit("error", node=self.index, error=f"{type(err).__name__}: {err}")

    def _loop(self) -> None:
        while True:
            time.sleep(self._job.monitor_interval_s)
            if self.node.store.frozen:
                return
            if self.told.is_set():
                self.told.clear()
                self._join("told")
                continue
            reason, names = self.node.tick()
            if reason is None:
                if not self._said_dropped and dropped_from_round(self.node.handler):
                    self._said_dropped = True  # torch's agent does not look: it trains on
                    self._emit_dropped()
                continue
            if reason == "lost":
                self._emit("lost", node=self.index, names=names, t=time.time())
            elif reason == "dropped":
                self._emit_dropped()
            self._join(reason)

    def _emit_dropped(self) -> None:
        gap_s = round(self.node.store.longest_beat_gap_s(), 2)
        self._emit("dropped", node=self.index, t=time.time(), beat_gap_s=gap_s)

    def _join(self, reason: str) -> None:
        started = time.time()
        rank, world = self.node.join()
        self.node.store.new_round()
        self.last_join_started = started
        self._said_dropped = False
        self._emit(
            "joined",
            node=self.index,
            round=state_round(self.node.handler),
            rank=rank,
            world=world,
            started=started,
            t=time.time(),
            reason=reason,
        )


def build_nodes(job: Job, impl: str, first: int, count: int) -> list[SimNode]:
    from torch.distributed import TCPStore

    from bench.scale.impls import OursNode, TorchNode, ours_config

    config = ours_config(job) if impl == "ours" else None
    nodes: list[SimNode] = []
    for index in range(first, first + count):
        client = TCPStore(
            job.host, job.port, is_master=False, multi_tenant=True, timeout=_timeout()
        )
        store = CountingStore(client, job.state_key)
        addr = node_address(index)
        if impl == "ours":
            nodes.append(OursNode(job, store, addr, config))
        else:
            nodes.append(TorchNode(job, store, addr))
    return nodes


def _timeout() -> Any:
    from datetime import timedelta

    return timedelta(seconds=60)  # the agent's and torch's read_timeout


def summary_of(lag: list[float]) -> dict[str, float | int | None]:
    ordered = sorted(lag)

    def at(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 5) if ordered else None

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": at(1.0)}


def window_report(
    nodes: list[SimNode], lag: list[float], cpu_s: float, wall_s: float
) -> dict[str, Any]:
    """What the nodes of this process did in the window, merged, and per node in short."""
    kinds: dict[str, dict[str, Any]] = {}
    purposes: dict[str, int] = {}
    merged = NodeCounters()
    per_node: list[list[int]] = []
    live = 0
    for node in nodes:
        counters = node.store.reset()
        if node.store.frozen:
            continue
        live += 1
        calls = sum(k.calls for k in counters.kinds.values())
        moved = sum(k.bytes_out + k.bytes_in for k in counters.kinds.values())
        per_node.append([calls, moved])
        for name, stats in counters.kinds.items():
            into = kinds.setdefault(
                name, {"calls": 0, "bytes_out": 0, "bytes_in": 0, "seconds": 0.0, "latencies_s": []}
            )
            into["calls"] += stats.calls
            into["bytes_out"] += stats.bytes_out
            into["bytes_in"] += stats.bytes_in
            into["seconds"] += stats.seconds
            into["latencies_s"].extend(round(s, 6) for s in stats.latencies_s)
        for purpose, calls in counters.purposes.items():
            purposes[purpose] = purposes.get(purpose, 0) + calls
        merged.cas_attempts += counters.cas_attempts
        merged.cas_conflicts += counters.cas_conflicts
        merged.first_attempts += counters.first_attempts
        merged.first_conflicts += counters.first_conflicts
        merged.state_bytes = max(merged.state_bytes, counters.state_bytes)
        merged.beat_gaps_s += counters.beat_gaps_s
        merged.beat_retries += counters.beat_retries
        merged.beat_spans_s += counters.beat_spans_s
        merged.token_age_s += counters.token_age_s
        merged.think_wall_s += counters.think_wall_s
        merged.think_cpu_s += counters.think_cpu_s
    return {
        "live_nodes": live,
        "kinds": kinds,
        "purposes": purposes,
        "cas_attempts": merged.cas_attempts,
        "cas_conflicts": merged.cas_conflicts,
        "first_attempts": merged.first_attempts,
        "first_conflicts": merged.first_conflicts,
        "state_bytes": merged.state_bytes,
        "beat_gaps_s": [round(s, 4) for s in merged.beat_gaps_s],
        "beat_retries": merged.beat_retries,
        "beat_spans_s": [round(s, 5) for s in merged.beat_spans_s],
        "token_age_s": [round(s, 5) for s in merged.token_age_s],
        "think_wall_s": [round(s, 6) for s in merged.think_wall_s],
        "think_cpu_s": [round(s, 6) for s in merged.think_cpu_s],
        "per_node": per_node,
        "lag_s": [round(s, 5) for s in lag],
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "threads": threading.active_count(),
    }


def phase_traffic(nodes: list[SimNode]) -> dict[str, Any]:
    """What this process's live nodes did since the counters' last reset, summed: calls and
    bytes in all, of the rendezvous state (its blob and counter) and of each call kind; the
    most state bytes one node moved; the state's compare-and-sets and their conflicts."""
    counted = [node.store.counters for node in nodes if not node.store.frozen]
    state_bytes = [c.purpose_bytes["state"] for c in counted]
    kind_bytes: dict[str, int] = {}
    for counters in counted:
        for name, stats in counters.kinds.items():
            kind_bytes[name] = kind_bytes.get(name, 0) + stats.bytes_out + stats.bytes_in
    return {
        "live_nodes": len(counted),
        "calls": sum(k.calls for c in counted for k in c.kinds.values()),
        "bytes": sum(k.bytes_out + k.bytes_in for c in counted for k in c.kinds.values()),
        "state_calls": sum(c.purposes["state"] for c in counted),
        "state_bytes": sum(state_bytes),
        "state_bytes_max": max(state_bytes, default=0),
        "kind_bytes": kind_bytes,
        "cas_attempts": sum(c.cas_attempts for c in counted),
        "cas_conflicts": sum(c.cas_conflicts for c in counted),
        # a CAS's read to its write on the same thread: wall time, and the thread's CPU in it
        "think_wall_s": [round(s, 5) for c in counted for s in c.think_wall_s],
        "think_cpu_s": [round(s, 5) for c in counted for s in c.think_cpu_s],
    }


FORMING_REPORT_S = 5.0
STACK_FRAMES = 14  # of a straggler's thread, the innermost frames said


def report_forming(
    nodes: list[SimNode], runners: dict[int, NodeRunner], emit: Emitter, since: float
) -> None:
    """Every :data:`FORMING_REPORT_S` until its nodes (but a lost one) returned from a round
    they started to join at ``since`` or later (the first round, or after a loss): how far
    the rendezvous got, as this process's first live node last read it, and the CAS so far."""
    live = [i for i, node in enumerate(nodes) if not node.store.frozen]
    if not live:
        return
    first = nodes[live[0]]

    def back() -> int:
        return sum(
            runner.last_join_started >= since
            for runner in runners.values()
            if not runner.node.store.frozen
        )

    while back() < len(live):
        time.sleep(FORMING_REPORT_S)
        try:
            view = forming_view(first.handler, first.store._inner)  # noqa: SLF001
        except Exception as err:  # noqa: BLE001 (a report, not the run)
            view = {"view_error": f"{type(err).__name__}: {err}"}
        emit(
            "forming",
            t=time.time(),
            since=since,
            **view,
            joined=back(),
            cas_attempts=sum(node.store.counters.cas_attempts for node in nodes),
            cas_conflicts=sum(node.store.counters.cas_conflicts for node in nodes),
            lag_s_max=max(LagProbe.recent, default=0.0),
        )


def stacks_of(runners: dict[int, NodeRunner], stragglers: list[int]) -> dict[str, Any]:
    """Where the threads of nodes that did not come back wait (each one's innermost frames),
    and the threads of the whole process grouped by their innermost frame, with counts."""
    import traceback

    frames = sys._current_frames()  # noqa: SLF001

    def innermost(ident: int | None) -> list[str]:
        frame = frames.get(ident) if ident is not None else None
        if frame is None:
            return []
        stack = traceback.extract_stack(frame)[-STACK_FRAMES:]
        return [f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in stack]

    nodes = {str(i): innermost(runners[i].thread.ident) for i in stragglers if i in runners}
    threads: dict[str, int] = {}
    for thread in threading.enumerate():
        stack = innermost(thread.ident)
        key = f"{thread.name.rstrip('0123456789')}: {' < '.join(reversed(stack[-4:]))}"
        threads[key] = threads.get(key, 0) + 1
    return {"nodes": nodes, "threads": dict(sorted(threads.items(), key=lambda kv: -kv[1]))}


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def serve(nodes: list[SimNode], runners: dict[int, NodeRunner], emit: Emitter) -> None:
    """The coordinator's commands, until ``stop``."""
    probe = LagProbe()
    probe.start()
    window_cpu_s = window_wall_s = 0.0
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        command = words[0]
        if command == "go":
            time.sleep(max(0.0, float(words[1]) - time.time()))
            for node in nodes:
                node.store.reset()  # counted from here: the first round's traffic
            for runner in runners.values():
                runner.go.set()
            threading.Thread(
                target=report_forming, args=(nodes, runners, emit, float(words[1])), daemon=True
            ).start()
        elif command == "mark":  # the end of a phase: this process's lag and CPU in it
            lag = probe.take()
            emit("mark", phase=words[1], lag_s=summary_of(lag), cpu_s=_cpu_s())
        elif command == "window_start":
            for node in nodes:
                node.store.reset()
            probe.take()
            window_cpu_s, window_wall_s = _cpu_s(), time.monotonic()
        elif command == "window_end":
            cpu_s, wall_s = _cpu_s() - window_cpu_s, time.monotonic() - window_wall_s
            emit("window", **window_report(nodes, probe.take(), cpu_s, wall_s))
        elif command == "lose":
            victim, tell = int(words[1]), words[2] == "1"
            if victim in runners:
                runners[victim].node.store.freeze()
            for node in nodes:
                node.store.reset()  # counted from here: the re-forming round's traffic
            threading.Thread(
                target=report_forming, args=(nodes, runners, emit, float(words[3])), daemon=True
            ).start()
            if tell:
                for index, runner in runners.items():
                    if index != victim:
                        runner.told.set()
        elif command == "count":  # the traffic since the last reset (a phase's)
            emit("count", phase=words[1], **phase_traffic(nodes))
        elif command == "stacks":
            emit("stacks", **stacks_of(runners, [int(w) for w in words[1:]]))
        elif command == "stop":
            break
    emit("final", cpu_s=_cpu_s(), threads=threading.active_count())


def _said_dead(emit: Emitter, index: int, named: str) -> None:
    emit("verdict", node=index, named=named, t=time.time())


def main(argv: list[str]) -> None:
    job = Job(**json.loads(argv[0]))
    impl, first, count = argv[1], int(argv[2]), int(argv[3])
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever torch or the agent prints goes to stderr, not the protocol
    emit = Emitter(protocol)
    threading.stack_size(STACK_BYTES)
    sys.setswitchinterval(job.switch_interval_s)
    started = time.monotonic()
    nodes = build_nodes(job, impl, first, count)
    runners = {first + i: NodeRunner(first + i, node, job, emit) for i, node in enumerate(nodes)}
    for index, runner in runners.items():
        runner.node.store.on_verdict = functools.partial(_said_dead, emit, index)
    for runner in runners.values():
        runner.thread.start()
    emit(
        "ready",
        setup_s=time.monotonic() - started,
        settings=settings_of(nodes[0].handler),
        addresses=[node_address(i) for i in runners],
        agent_package=os.path.dirname(sys.modules["torchx_elastic"].__file__ or ""),
    )
    serve(nodes, runners, emit)
    for node in nodes:
        node.store.release()
    sys.stdout.flush()
    os._exit(0)  # the nodes' threads (torch's keep-alive timers among them) end with it


if __name__ == "__main__":
    main(sys.argv[1:])
