"""The launch jobs' records and checks (``bench/phases.py`` reads them): standard library only, so a
job imports it before torch.

With ``BENCH_RECORD_FILE`` set, every rank appends ``<event> <rank> <unix time> <pid>``:
``proc`` (when its process was created), ``script`` (its first line ran), ``start`` (it
enters its work) and ``done`` (it is about to exit).
"""

import os
import time

RECORD_ENV = "BENCH_RECORD_FILE"


def process_start_unix_s() -> float:
    """When this process was created (a forked worker: its fork; a spawned one: its exec)."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as boot:
        btime = next(int(line.split()[1]) for line in boot if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def append_line(path: str, line: str) -> None:
    """``line`` at the end of ``path`` in one short ``O_APPEND`` write: the records of
    several processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def record(event: str, rank: int, at: float | None = None) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    stamp = time.time() if at is None else at
    append_line(path, f"{event} {rank} {stamp:.6f} {os.getpid()}")


def record_first_line() -> None:
    """The script's first line ran, and when its process was created."""
    if os.environ.get(RECORD_ENV):
        rank = int(os.environ.get("RANK", "-1"))
        record("script", rank)
        record("proc", rank, process_start_unix_s())


def check_world_size(world_size: int, expected: int | None) -> None:
    """Exit 1 (as an uncaught error would) when the job's world is not the expected one."""
    if expected is not None and world_size != expected:
        raise SystemExit(f"bench: world size {world_size}, expected {expected}")
