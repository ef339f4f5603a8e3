"""Agents' log directories written by hand, as the agents write them (event_records names)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchx_elastic.contract import events as ev
from torchx_elastic.contract.error_file import write_error_file
from torchx_elastic.contract.log_layout import NodeLogs

T0 = 1_800_000_000.0
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 12, in <module>\n'
    '    raise ValueError("bad batch on rank 1")\n'
    "ValueError: bad batch on rank 1\n"
)


def record(event: str, time_s: float, node: int, pid: int, **fields: Any) -> dict[str, Any]:
    return {
        "time": "",
        "time_s": time_s,
        "event": event,
        "host": f"host{node}",
        "agent_pid": pid,
        "node": node,
        **fields,
    }


def write_events(log_dir: Path, records: list[dict[str, Any]], extra_lines: str = "") -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + extra_lines
    Path(NodeLogs(str(log_dir)).events).write_text(text)


def generated_job(
    nodes: int, procs: int, progress_samples: int, crash_rank: int = 1
) -> list[dict[str, Any]]:
    """A ``nodes x procs`` job: attempt 0 fails at +10 s (``crash_rank`` exit code 1, every
    other rank loses its peer), one restart, attempt 1 succeeds; progress in between."""
    records: list[dict[str, Any]] = []
    world = nodes * procs
    end_s = T0 + 20 + progress_samples * 0.5
    for node in range(nodes):
        pid = 100 + node
        ranks = list(range(node * procs, (node + 1) * procs))
        records.append(
            record(
                ev.RENDEZVOUS,
                T0 + 0.1 * node / nodes,
                node,
                pid,
                attempt=0,
                group_world_size=nodes,
                ranks=ranks,
                master="host0:29500",
            )
        )
        records.append(
            record(ev.START, T0 + 1, node, pid, attempt=0, pids={str(r): 1000 + r for r in ranks})
        )
        failures = {
            str(r): {
                "local_rank": r - node * procs,
                "pid": 1000 + r,
                "exitcode": 1 if r == crash_rank else -15,
            }
            for r in ranks
        }
        records.append(
            record(ev.FAILURE, T0 + 10 + 0.01 * node, node, pid, attempt=0, failures=failures)
        )
        records.append(
            record(ev.RESTART, T0 + 10 + 0.01 * node, node, pid, attempt=1, reason="failure")
        )
        records.append(
            record(
                ev.RENDEZVOUS,
                T0 + 12,
                node,
                pid,
                attempt=1,
                group_world_size=nodes,
                ranks=ranks,
                master="host0:29501",
            )
        )
        records.append(
            record(ev.START, T0 + 13, node, pid, attempt=1, pids={str(r): 2000 + r for r in ranks})
        )
        records.append(
            record(
                ev.EXIT,
                end_s,
                node,
                pid,
                exit_code=0,
                state="SUCCEEDED",
                attempt=1,
                root_cause_rank=None,
                summary=None,
            )
        )
    for index in range(progress_samples):
        records.append(
            record(
                ev.PROGRESS,
                T0 + 14 + index * 0.5,
                0,
                100,
                step=index,
                total=progress_samples,
                slowest_rank=world - 1,
                slowest_node=nodes - 1,
                fastest_rank=0,
                fastest_node=0,
                fastest_step=index + 1,
                rate_per_s=2.0,
                ranks_reporting=world,
                ranks=world,
            )
        )
    return records


def write_crash_files(log_dir: Path, crash_rank: int = 1) -> None:
    """The crashed rank's error file (its traceback) and its stderr."""
    logs = NodeLogs(str(log_dir))
    write_error_file(
        logs.rank_error_file(0, crash_rank), "ValueError: bad batch on rank 1", TRACEBACK, T0 + 9
    )
    Path(logs.rank_stderr(0, crash_rank)).write_text(TRACEBACK)
