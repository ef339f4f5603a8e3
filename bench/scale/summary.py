"""A run's raw facts summed up into one record, and the Markdown table of the records.

Rates are per second of the steady-state window. A heartbeat is one successful CAS of the
rendezvous state (in steady state nothing else writes it); a late one came more than
:data:`LATE_FACTOR` keep-alive intervals after the node's previous one. The harness
itself is the bottleneck (``harness-bound``) where its threads wake up late (the 99th
percentile of the lag probe, in the window or while the first round forms, over
:data:`HARNESS_LAG_SHARE` of the keep-alive interval), where its processes and the store
together use nearly every CPU of the machine, or where a CAS's typical (p50) read-to-write
window is much longer than the CPU time its thread spent in it (:data:`THINK_INFLATION`
times: the rest is waiting for the GIL or a CPU, which a real agent on a host of its own
does not, and a longer window makes more conflicts); a p99 much longer is noted, and so
is, on a bound harness, an agents' monitor interval under :data:`QUIET_MONITOR_S`: each
check wakes a node's thread, which costs a harness of hundreds of node threads far more CPU
than the check itself. After a loss, threads that woke up :data:`STARVED_SHARE` of the
dead-node time late (keep-alive interval times attempts) or more bound the harness too: a
healthy node whose beats waited that long may be said dead by the harness, not the agent.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LATE_FACTOR = 1.5
HARNESS_LAG_SHARE = 0.10
CPU_SATURATED_SHARE = 0.90
THINK_INFLATION = 1.5  # the typical window: p50 wall over p50 CPU
SPIKE_INFLATION = 3.0  # p99
# agents that check this seldom read the state's counter as often (once a second either way)
QUIET_MONITOR_S = 1.0
STARVED_SHARE = 0.5  # of the dead-node time: a thread's lag after a loss that bounds a run
TORCH_DEAD_S = 15.0  # torch's keep-alive: 5 s, 3 attempts


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100, nearest rank); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def _merge_kinds(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for report in reports:
        for name, stats in report["kinds"].items():
            into = kinds.setdefault(
                name, {"calls": 0, "bytes_out": 0, "bytes_in": 0, "seconds": 0.0, "lat": []}
            )
            for key in ("calls", "bytes_out", "bytes_in", "seconds"):
                into[key] += stats[key]
            into["lat"].extend(stats["latencies_s"])
    return kinds


def store_traffic(reports: list[dict[str, Any]], seconds: float, live: int) -> dict[str, Any]:
    """Store calls and bytes per second, in all and per node, by call kind and purpose."""
    kinds = _merge_kinds(reports)
    calls = sum(k["calls"] for k in kinds.values())
    moved = sum(k["bytes_out"] + k["bytes_in"] for k in kinds.values())
    purposes: dict[str, int] = {}
    for report in reports:
        for name, count in report["purposes"].items():
            purposes[name] = purposes.get(name, 0) + count
    per_node = [ops for report in reports for ops, _ in report["per_node"]]
    return {
        "ops_per_s": calls / seconds,
        "ops_per_s_per_node": calls / seconds / max(live, 1),
        "bytes_per_s": moved / seconds,
        "bytes_per_s_per_node": moved / seconds / max(live, 1),
        "node_ops_per_s": {
            "min": min(per_node, default=0) / seconds,
            "median": statistics.median(per_node) / seconds if per_node else 0.0,
            "max": max(per_node, default=0) / seconds,
        },
        "by_kind": {
            name: {
                "per_s": k["calls"] / seconds,
                "bytes_out_per_s": k["bytes_out"] / seconds,
                "bytes_in_per_s": k["bytes_in"] / seconds,
                "latency_ms_mean": _ms(k["seconds"] / k["calls"]) if k["calls"] else None,
                "latency_ms_p50": _ms(percentile(k["lat"], 50)),
                "latency_ms_p99": _ms(percentile(k["lat"], 99)),
                "latency_ms_max": _ms(max(k["lat"], default=None)),
            }
            for name, k in sorted(kinds.items())
        },
        "by_purpose_per_s": {name: count / seconds for name, count in sorted(purposes.items())},
    }


def heartbeats(reports: list[dict[str, Any]], seconds: float, interval_s: float) -> dict[str, Any]:
    """The CAS of the state: rate, conflicts, and the heartbeats it made."""
    attempts = sum(r["cas_attempts"] for r in reports)
    conflicts = sum(r["cas_conflicts"] for r in reports)
    firsts = sum(r.get("first_attempts", 0) for r in reports)
    first_conflicts = sum(r.get("first_conflicts", 0) for r in reports)
    retried = attempts - firsts
    gaps = [g for r in reports for g in r["beat_gaps_s"]]
    retries = [n for r in reports for n in r["beat_retries"]]
    spans = [s for r in reports for s in r["beat_spans_s"]]
    late = sum(1 for g in gaps if g > LATE_FACTOR * interval_s)
    token_age = [t for r in reports for t in r.get("token_age_s", [])]
    think_wall = [t for r in reports for t in r.get("think_wall_s", [])]
    think_cpu = [t for r in reports for t in r.get("think_cpu_s", [])]
    return {
        "cas_per_s": attempts / seconds,
        "conflicts_per_s": conflicts / seconds,
        "conflict_rate": conflicts / attempts if attempts else None,
        # a first try writes over the state as last read, up to the handler's 1 s cache old;
        # a retry over the state the failed CAS answered, as old as the agent's own work
        "first_try_conflict_rate": first_conflicts / firsts if firsts else None,
        "retry_conflict_rate": (conflicts - first_conflicts) / retried if retried else None,
        "state_bytes": max((r["state_bytes"] for r in reports), default=0),
        "beats": len(spans),
        "gap_s_p50": percentile(gaps, 50),
        "gap_s_p99": percentile(gaps, 99),
        "gap_s_max": max(gaps, default=None),
        "late_share": late / len(gaps) if gaps else None,
        "retries_p50": percentile(retries, 50),
        "retries_p99": percentile(retries, 99),
        "retries_max": max(retries, default=None),
        "span_ms_p50": _ms(percentile(spans, 50)),
        "span_ms_p99": _ms(percentile(spans, 99)),
        "span_ms_max": _ms(max(spans, default=None)),
        "token_age_ms_p50": _ms(percentile(token_age, 50)),
        "token_age_ms_p99": _ms(percentile(token_age, 99)),
        "think_ms_p50": _ms(percentile(think_wall, 50)),
        "think_ms_p99": _ms(percentile(think_wall, 99)),
        "think_cpu_ms_p50": _ms(percentile(think_cpu, 50)),
        "think_cpu_ms_p99": _ms(percentile(think_cpu, 99)),
    }


def harness(raw: dict[str, Any]) -> dict[str, Any]:
    """The harness's own load in the window: its CPU, the store's, how late its threads woke."""
    window = raw["window"]
    seconds = window["seconds"]
    lags = [s for r in window["reports"] for s in r["lag_s"]]
    return {
        "harness_cores": sum(window["procs_cpu_s"]) / seconds,
        "harness_cores_max_proc": max(window["procs_cpu_s"], default=0.0) / seconds,
        "store_cores": window["store_cpu_s"] / seconds,
        "lag_ms_p50": _ms(percentile(lags, 50)),
        "lag_ms_p99": _ms(percentile(lags, 99)),
        "lag_ms_max": _ms(max(lags, default=None)),
        "form_lag_ms_p99": (raw.get("form", {}).get("harness") or {}).get("lag_ms_p99"),
        "threads": sum(r["threads"] for r in window["reports"]),
    }


def assess(record: dict[str, Any], cpus: int) -> None:
    """Whether the harness bounds the record's figures (``harness.bound``), why, and notes
    (see the module's docstring): from the record's own figures, so a saved record can be
    assessed again."""
    form_lag_ms = ((record.get("form") or {}).get("harness") or {}).get("lag_ms_p99")
    harness_ = record.setdefault("harness", {"form_lag_ms_p99": form_lag_ms})
    cas = (record.get("steady") or {}).get("cas") or {}
    interval_s = (record.get("settings") or {}).get("keep_alive_interval_s", 1.0)
    limit_ms = HARNESS_LAG_SHARE * interval_s * 1000
    reasons, notes = [], []
    lags = (
        (harness_.get("lag_ms_p99"), "in the window"),
        (harness_.get("form_lag_ms_p99"), "while the first round formed"),
    )
    for value, phase in lags:
        if value is not None and value > limit_ms:
            reasons.append(f"lag p99 {value:.0f} ms > {limit_ms:.0f} ms {phase}")
    progress = (record.get("loss") or {}).get("progress") or []
    reform_lag_s = max((p.get("lag_s_max", 0.0) for p in progress), default=None)
    harness_["reform_lag_s_max"] = reform_lag_s
    settings = record.get("settings") or {}
    dead_s = interval_s * settings.get("keep_alive_max_attempt", 1)
    if reform_lag_s is not None and reform_lag_s >= STARVED_SHARE * dead_s:
        reasons.append(
            f"threads woke up to {reform_lag_s:.1f} s late after the loss, against a dead-node"
            f" time of {dead_s:g} s: a healthy node's beats may have waited that long"
        )
        if record.get("impl") == "ours" and dead_s < TORCH_DEAD_S:
            notes.append(
                "a longer dead-node time keeps the harness's starvation under it:"
                " --ours-conf keep_alive_interval=5,keep_alive_max_attempt=3 (torch's values)"
                " re-formed 1,000 nodes on two CPUs (docs/bench.md)"
            )
    used = harness_.get("harness_cores", 0.0) + harness_.get("store_cores", 0.0)
    if used >= CPU_SATURATED_SHARE * cpus:
        reasons.append(f"harness + store use {used:.2f} of {cpus} CPUs")
    wall, cpu = cas.get("think_ms_p50"), cas.get("think_cpu_ms_p50")
    if wall is not None and cpu is not None and wall > THINK_INFLATION * cpu + 1:
        reasons.append(
            f"a CAS's read-to-write window p50 {wall:.1f} ms, of which the thread's CPU"
            f" {cpu:.1f} ms (conflicts inflated)"
        )
    wall, cpu = cas.get("think_ms_p99"), cas.get("think_cpu_ms_p99")
    if wall is not None and cpu is not None and wall > SPIKE_INFLATION * cpu + 5:
        notes.append(
            f"a CAS's read-to-write window p99 {wall:.0f} ms, of which the thread's CPU"
            f" {cpu:.1f} ms: spikes of waiting (late beats and drops may be the harness's)"
        )
    monitor_s = record.get("monitor_interval_s")
    if reasons and monitor_s is not None and monitor_s < QUIET_MONITOR_S:
        notes.append(
            f"each simulated agent checks every {monitor_s:g} s, a thread's wake-up each: most"
            f" of the harness's CPU in steady state; --monitor-interval {QUIET_MONITOR_S:g}"
            " makes the same store calls with less of it (docs/bench.md)"
        )
    harness_.update(bound=bool(reasons), bound_reasons=reasons, notes=notes)


def summarize(raw: dict[str, Any], cpus: int | None = None) -> dict[str, Any]:
    """The record of one run: its settings, formation, steady state, loss and the harness."""
    cpus = cpus or os.cpu_count() or 1
    record = {k: v for k, v in raw.items() if k not in ("window", "dropped", "lost", "verdicts")}
    interval_s = raw.get("settings", {}).get("keep_alive_interval_s", 1.0)
    window = raw.get("window")
    if window is not None:
        seconds = window["seconds"]
        live = sum(r["live_nodes"] for r in window["reports"])
        record["steady"] = {
            "seconds": seconds,
            "live_nodes": live,
            "store": store_traffic(window["reports"], seconds, live),
            "cas": heartbeats(window["reports"], seconds, interval_s),
            "rounds_joined": len(window["joins"]),
            "dropped": sorted({e["node"] for e in window["dropped"]}),
        }
        record["harness"] = harness(raw)
        assess(record, cpus)
    victim = raw.get("loss", {}).get("victim")
    record["false_drops"] = sorted({e["node"] for e in raw.get("dropped", [])} - {victim})
    # each one's longest gap between two heartbeats until it saw itself dropped: longer
    # than the dead-node time, its beats did not run (a harness process short of CPU)
    record["false_drop_beat_gaps_s"] = {
        str(e["node"]): e.get("beat_gap_s") for e in raw.get("dropped", []) if e["node"] != victim
    }
    victim_address = raw.get("loss", {}).get("victim_address")
    # the addresses of healthy nodes said dead: in a node's checks (a name: "address (agent
    # pid P)"), or by a liveness verdict at any time (an id: "address_pid_n"), while the
    # nodes joined a round too
    said = [name.split(" ")[0] for event in raw.get("lost", []) for name in event["names"]]
    said += [event["named"].split("_")[0] for event in raw.get("verdicts", [])]
    record["declared_dead_healthy"] = sorted(set(said) - {victim_address})
    go_at = raw.get("form", {}).get("go_at", 0.0)
    verdicts = [e | {"names": [e["named"]]} for e in raw.get("verdicts", [])]
    record["events"] = [
        {"ev": e["ev"], "node": e["node"], "s_after_go": round(e["t"] - go_at, 3)}
        | ({"names": e["names"]} if "names" in e else {})
        for e in sorted(
            raw.get("dropped", []) + raw.get("lost", []) + verdicts, key=lambda e: e["t"]
        )
    ]
    return record


def _num(value: float | None, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


LOAD_COLUMNS = (
    "impl",
    "nodes",
    "store ops/s",
    "ops/s per node",
    "store KiB/s",
    "KiB/s per node",
    "state KiB",
    "state CAS/s",
    "CAS conflicts",
    "retries p99",
    "store CPU",
    "KiB/s per node forming / re-forming",
)
LIVENESS_COLUMNS = (
    "impl",
    "nodes",
    "first round s",
    "beat gap p99 s",
    "late beats",
    "false drops / healthy said dead",
    "re-form s",
    "harness CPU",
    "lag p99 ms (window / forming)",
    "CAS read-to-write ms p50 / p99 (thread CPU)",
    "harness-bound",
)


def _header(columns: Sequence[str], machine: bool) -> list[str]:
    columns = ["machine", *columns] if machine else list(columns)
    left = 3 if machine else 2
    align = "|" + "---|" * left + "---:|" * (len(columns) - left)
    return ["| " + " | ".join(columns) + " |", align]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _first(record: dict[str, Any]) -> list[str]:
    machine = [record["machine"]] if "machine" in record else []
    return [*machine, record["impl"], str(record["nodes"])]


def load_row(record: dict[str, Any]) -> str:
    steady = record.get("steady") or {}
    store, cas = steady.get("store") or {}, steady.get("cas") or {}
    kib = 1024
    return _row(
        [
            *_first(record),
            _num(store.get("ops_per_s"), 0),
            _num(store.get("ops_per_s_per_node"), 2),
            _num(store["bytes_per_s"] / kib if store else None, 0),
            _num(store["bytes_per_s_per_node"] / kib if store else None, 1),
            _num(cas["state_bytes"] / kib if cas else None, 1),
            _num(cas.get("cas_per_s"), 1),
            _pct(cas.get("conflict_rate")),
            _num(cas.get("retries_p99"), 0),
            _num((record.get("harness") or {}).get("store_cores"), 2),
            f"{_phase_kib(record.get('form'))} / {_phase_kib(record.get('loss'))}",
        ]
    )


def _phase_kib(phase: dict[str, Any] | None) -> str:
    """KiB/s per node a phase (the first round forming, the round re-forming) moved."""
    traffic = (phase or {}).get("traffic") or {}
    per_node = traffic.get("bytes_per_s_per_node")
    return _num(None if per_node is None else per_node / 1024, 1)


def _drops(record: dict[str, Any]) -> str:
    """Healthy nodes that saw themselves dropped / that a peer said dead (at any time)."""
    said = record.get("declared_dead_healthy", [])
    return f"{len(record.get('false_drops', []))} / {len(said)}"


def liveness_row(record: dict[str, Any]) -> str:
    steady = record.get("steady") or {}
    cas = steady.get("cas") or {}
    harness_ = record.get("harness") or {}
    loss = record.get("loss") or {}
    reform = _num(loss.get("reformed_s"))
    if loss and not loss.get("reformed"):
        reform = "not in time"
    elif loss.get("told_at_once"):
        reform += " (told)"
    form = record.get("form") or {}
    form_lag = (form.get("harness") or {}).get("lag_ms_p99")
    return _row(
        [
            *_first(record),
            _num(form.get("all_in_s")) if form.get("formed", True) else "not in time",
            _num(cas.get("gap_s_p99"), 2),
            _pct(cas.get("late_share")),
            _drops(record),
            reform,
            _num(harness_.get("harness_cores"), 2),
            f"{_num(harness_.get('lag_ms_p99'), 0)} / {_num(form_lag, 0)}",
            f"{_num(cas.get('think_ms_p50'), 1)} / {_num(cas.get('think_ms_p99'), 0)}"
            f" ({_num(cas.get('think_cpu_ms_p50'), 1)} / {_num(cas.get('think_cpu_ms_p99'), 1)})",
            {True: "yes", False: "no"}.get(harness_.get("bound"), "-"),
        ]
    )


def render_table(records: Sequence[dict[str, Any]]) -> str:
    """Two Markdown tables (the store's load in steady state; liveness, rounds and the
    harness) and notes on harness-bound rows, rounds that did not form and errors."""
    machine = any("machine" in r for r in records)
    lines = [*_header(LOAD_COLUMNS, machine), *(load_row(r) for r in records), ""]
    lines += [*_header(LIVENESS_COLUMNS, machine), *(liveness_row(r) for r in records)]
    notes = []
    for record in records:
        name = " ".join(_first(record)[:-1]) + f" x {record['nodes']}"
        for reason in (record.get("harness") or {}).get("bound_reasons", []):
            notes.append(f"- {name}: harness-bound: {reason}")
        for note in (record.get("harness") or {}).get("notes", []):
            notes.append(f"- {name}: {note}")
        if not (record.get("form") or {}).get("formed", False):
            notes.append(f"- {name}: the first round did not form in time")
        for error in record.get("errors", [])[:3]:
            notes.append(f"- {name}: node {error['node']}: {error['error']}")
    return "\n".join(lines + ([""] + notes if notes else []))


def retable(paths: Sequence[str]) -> str:
    """The tables of several saved documents (``python -m bench.scale.summary A.json B.json``):
    each record assessed again on its own machine, labelled with it where there are several."""
    records = []
    for path in paths:
        document = json.loads(Path(path).read_text())
        machine = document.get("machine", {})
        label = f"{machine.get('cpus', '?')} CPUs, torch {machine.get('torch', '?')}"
        for record in document["records"]:
            if "harness_error" in record:
                continue
            assess(record, int(machine.get("cpus") or 1))
            records.append({**record, "machine": label} if len(paths) > 1 else record)
    return render_table(records)


if __name__ == "__main__":
    print(retable(sys.argv[1:]))
