"""The job's progress, or its wait for nodes, in ``torchx status`` on Slurm.

The rank-0 agent prints the ``[job progress]`` line (and, until its first round is complete,
``waiting for nodes: 1 of 2 joined; ...``) to its stderr, which Slurm writes to replica 0's
``slurm-<id>-<role>-0.err`` on the job's shared directory. Its lines carry no time stamp: the
file's last write stands for the newest line's time.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Optional

from torchx_elastic.schedulers.compat import slurm_output_file
from torchx_elastic.schedulers.progress_status import TAIL_LINES, progress_message

TAIL_BYTES = 256 * 1024


def tail_lines(path: str, count: int = TAIL_LINES) -> list[str]:
    """The last ``count`` lines of ``path`` (its last ``TAIL_BYTES``); [] when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-count:]


def progress_of(app_id: str, role: str, now: Optional[datetime] = None) -> Optional[str]:
    """The status line of replica 0 of ``role``: its progress, or what it waits for."""
    path = slurm_output_file(app_id, role, 0)
    try:
        written = datetime.fromtimestamp(os.stat(path).st_mtime, timezone.utc)
    except OSError:
        return None  # not started yet, or no shared directory here
    stamp = written.isoformat()
    lines = [f"{stamp} {line}" for line in tail_lines(path)]
    return progress_message(lines, now, where=os.path.basename(path))
