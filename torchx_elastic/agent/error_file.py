"""torch.distributed.elastic's error file: the one place that knows its name and format.

A worker writes its uncaught exception there (the bootstrap), the hang watchdog writes a
stalled rank's there, and the agent writes the job's root cause into its own (the file its
scheduler gave it). The format is what ``torch.distributed.elastic.multiprocessing.errors``
reads and writes: ``{"message": {"message": ..., "extraInfo": {"py_callstack": ...,
"timestamp": ...}}}``.

Standard library only: the bootstrap imports it before the user's first import.
"""

from __future__ import annotations

import json
import os
import time

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def error_data(message: str, callstack: str, timestamp_s: float | None = None) -> dict[str, object]:
    """The error file's content."""
    when = time.time() if timestamp_s is None else timestamp_s
    return {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(when))},
        }
    }


def write_error_file(
    path: str, message: str, callstack: str, timestamp_s: float | None = None
) -> None:
    """Write the error file atomically (``OSError`` when the directory cannot be written)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as file:
        json.dump(error_data(message, callstack, timestamp_s), file)
    os.replace(tmp, path)
