"""Whether the kernel's OOM killer ended a rank: its kill counts before and after an attempt.

A rank that runs out of memory leaves no traceback: the kernel's OOM killer (of a container's
or pod's memory limit, or of the whole host) sends it SIGKILL, and torchrun reports no more
than "Signal 9 (SIGKILL)". The kernel counts those kills:

- in the memory cgroup of this node's processes (cgroup v2 ``memory.events``, v1
  ``memory.oom_control``: ``oom_kill``; the limit in ``memory.max`` or
  ``memory.limit_in_bytes``), where the workers are (the agent does not move them);
- on the whole host (``/proc/vmstat``: ``oom_kill``), for a cgroup that does not count (the
  root cgroup of cgroup v1).

The agent reads both when an attempt starts and again when it failed: a rank killed by SIGKILL
while a count rose was most likely killed for memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_KEY = "oom_kill"
_NO_LIMIT_BYTES = 1 << 62  # cgroup v1 reads "no limit" as about 2**63 rounded to a page


@dataclass(frozen=True)
class OomCounts:
    """The kernel's OOM kills so far: in this process's memory cgroup (None: unreadable) and
    on the host; ``limit_bytes``: the cgroup's memory limit (None: none)."""

    cgroup: int | None = None
    host: int | None = None
    limit_bytes: int | None = None


def _count(path: str) -> int | None:
    """The ``oom_kill`` value of a flat-keyed kernel file ("key value" lines)."""
    try:
        with open(path) as file:
            for line in file:
                key, _, value = line.partition(" ")
                if key == _KEY:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _limit(path: str) -> int | None:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= _NO_LIMIT_BYTES:
        return None  # "max" (v2) or no limit (v1)
    return int(text)


def _cgroup_files(root: str) -> list[tuple[str, str]]:
    """(count file, limit file) of this process's memory cgroup, most likely first: its own
    path under the mount, then the mount itself (a container sees its cgroup there)."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as file:
            lines = file.read().splitlines()
    except OSError:
        return []
    mount = os.path.join(root, "sys/fs/cgroup")
    found = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        relative = path.lstrip("/")
        if controllers == "" and os.path.exists(os.path.join(mount, "cgroup.controllers")):
            for directory in (os.path.join(mount, relative), mount):  # cgroup v2
                found.append(
                    (
                        os.path.join(directory, "memory.events"),
                        os.path.join(directory, "memory.max"),
                    )
                )
        elif "memory" in controllers.split(",") and relative:  # v1's root cgroup never counts
            v1 = os.path.join(mount, "memory")
            for directory in (os.path.join(v1, relative), v1):
                found.append(
                    (
                        os.path.join(directory, "memory.oom_control"),
                        os.path.join(directory, "memory.limit_in_bytes"),
                    )
                )
    return found


def read_counts(root: str = "/") -> OomCounts:
    """The counts now (``root``: where ``/proc`` and ``/sys`` are, for tests)."""
    host = _count(os.path.join(root, "proc/vmstat"))
    for count_file, limit_file in _cgroup_files(root):
        count = _count(count_file)
        if count is not None:
            return OomCounts(count, host, _limit(limit_file))
    return OomCounts(None, host)


def _size(limit_bytes: int) -> str:
    if limit_bytes >= 1 << 30:
        return f"{limit_bytes / (1 << 30):.1f} GiB"
    return f"{limit_bytes >> 20} MiB"


def kills_between(before: OomCounts, after: OomCounts) -> tuple[int, str]:
    """How many processes the OOM killer killed from ``before`` to ``after``, and where: in
    the cgroup where it counts (the kernel counts a kill of the whole host's OOM there too),
    else on the host; (0, '') when it killed none or no count could be read twice."""
    if before.cgroup is not None and after.cgroup is not None:
        limit = f", limit {_size(after.limit_bytes)}" if after.limit_bytes else ""
        kills, where = after.cgroup - before.cgroup, f"in this node's memory cgroup{limit}"
    elif before.host is not None and after.host is not None:
        kills, where = after.host - before.host, "on this host"
    else:
        return 0, ""
    return (kills, where) if kills > 0 else (0, "")


def out_of_memory(kills: int, where: str) -> str:
    """What a rank killed by the OOM killer failed of (its message in the report)."""
    plural = "" if kills == 1 else "s"
    return (
        f"out of memory: the kernel's OOM killer sent SIGKILL ({kills} kill{plural} during the"
        f" attempt {where}); give each node more memory, or use less per process (a smaller"
        " batch, fewer processes per node)"
    )
