"""What ``--nproc-per-node cpu|gpu|xpu|auto|<backend>`` counts, as torchrun counts it, without
this process touching a device driver.

torchrun asks ``torch.cuda.is_available()`` / ``device_count()`` (``torch.accelerator`` for
``auto``) in its own process: its workers are fresh interpreters. The agent forks its workers
(the fork server), and a process forked after the CUDA driver was initialized cannot use CUDA
(``Cannot re-initialize CUDA in forked subprocess``): torch marks every fork of a process that
asked CUDA for its devices. So the devices are counted in a short-lived child, forked from this
process when that is safe (no other thread runs; the child is not itself a bad fork), else a
fresh interpreter (``sys.executable -c``); the child's driver state dies with it.

CPUs follow torchrun (``torch._utils.cpu_count``): those this process may run on (its
affinity: ``taskset``, cgroup cpusets), not every core of the machine; ``auto`` without an
accelerator counts them too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

_CHILD_CODE = "from torchx_elastic.agent.config.devices import child_main; child_main()"


class CountError(Exception):
    """The child could not count the devices; the message says why."""


def cpu_count() -> int:
    """The CPUs this process may run on (``len(os.sched_getaffinity(0))``), as torchrun."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0)) or 1
    return os.cpu_count() or 1


def accelerator_count(kind: str) -> int | None:
    """:func:`~torchx_elastic.agent.compat.accelerator_count` of ``kind``, counted in a
    short-lived child: 0 when that kind has none, None when torch has no such kind."""
    if hasattr(os, "fork") and threading.active_count() == 1:
        report = _report_from_fork(kind)
        if not report.get("bad_fork"):
            return _count(report)
    return _count(_report_from_interpreter(kind))


def _count(report: dict[str, Any]) -> int | None:
    if "error" in report:
        raise CountError(str(report["error"]))
    count = report["count"]
    return None if count is None else int(count)


def report(kind: str) -> dict[str, Any]:
    """What a counting child sends back: ``{"count": N or None}``, ``{"bad_fork": True}``
    (this child cannot ask CUDA: it was forked after CUDA was asked) or ``{"error": TEXT}``."""
    try:
        from torchx_elastic.agent import compat

        if compat.in_bad_cuda_fork():
            return {"bad_fork": True}
        return {"count": compat.accelerator_count(kind)}
    except Exception as err:  # noqa: BLE001 - sent to the parent, which says it
        return {"error": f"{type(err).__name__}: {err}"}


def child_main() -> None:
    """The fresh interpreter's side: ``report(sys.argv[1])`` as one JSON line on stdout."""
    print(json.dumps(report(sys.argv[1])), flush=True)


def _report_from_fork(kind: str) -> dict[str, Any]:
    for stream in (sys.stdout, sys.stderr):  # else the child would write them out again
        stream.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: covered by the tests' runs, not measured
        try:
            os.close(read_end)
            data = json.dumps(report(kind)).encode()
            os.write(write_end, data)
            sys.stderr.flush()  # torch's own warnings, as torchrun prints them
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    try:
        return dict(json.loads(b"".join(chunks)))
    except ValueError:
        return {"error": f"the counting child ended without an answer (wait status {status})"}


def _report_from_interpreter(kind: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_CODE, kind], stdout=subprocess.PIPE, check=False
    )
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        return {
            "error": f"the counting interpreter ended without an answer (exit {done.returncode})"
        }
