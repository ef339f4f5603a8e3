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
from dataclasses import dataclass

_MAX_BYTES = 16 * 1024 * 1024


def error_data(
    message: str,
    callstack: str,
    timestamp_s: float | None = None,
    error_code: int | None = None,
) -> dict[str, object]:
    """The error file's content (``errorCode``: a process's exit code, as torch's
    ``ProcessFailure`` writes it, where one is given)."""
    when = time.time() if timestamp_s is None else timestamp_s
    error: dict[str, object] = {"message": message}
    if error_code is not None:
        error["errorCode"] = error_code
    error["extraInfo"] = {"py_callstack": callstack, "timestamp": str(int(when))}
    return {"message": error}


def write_error_file(
    path: str, message: str, callstack: str, timestamp_s: float | None = None
) -> None:
    """Write the error file atomically (``OSError`` when the directory cannot be written)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as file:
        json.dump(error_data(message, callstack, timestamp_s), file)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ErrorFileContent:
    """What a worker left in its error file; ``problem`` says why it could not be used."""

    message: str = ""
    traceback: str = ""
    timestamp_s: float | None = None
    problem: str = ""  # e.g. "empty", "not JSON (...)": the file is there but unreadable


def _parse(data: object) -> ErrorFileContent | None:
    """torch's format (``message`` a dict with ``extraInfo``, or a plain string)."""
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    try:
        if isinstance(message, dict):
            extra = message.get("extraInfo") or {}
            if not isinstance(extra, dict):
                return None
            timestamp = extra.get("timestamp")
            return ErrorFileContent(
                str(message.get("message", "")),
                str(extra.get("py_callstack", "")),
                None if timestamp is None else float(timestamp),
            )
        if isinstance(message, str):
            timestamp = data.get("timestamp")
            return ErrorFileContent(message, "", None if timestamp is None else float(timestamp))
    except (TypeError, ValueError):
        return None
    return None


def parse_error_json(text: str | bytes) -> ErrorFileContent | None:
    """The content of torch's error-file JSON ``text`` (an error file, a container's
    termination message); None when it is not one."""
    try:
        return _parse(json.loads(text))
    except ValueError:
        return None


def read_error_file(path: str) -> ErrorFileContent | None:
    """The error file at ``path``; None when there is none. Never raises: an empty, partial,
    foreign or unreadable file gives a content with ``problem`` set (a worker killed while
    ``@record`` writes its file leaves it empty)."""
    if not path or not os.path.lexists(path):
        return None
    if not os.path.isfile(path):  # a directory, a FIFO (open would block), a dangling link
        return ErrorFileContent(problem="not a regular file")
    try:
        with open(path, "rb") as file:
            raw = file.read(_MAX_BYTES + 1)
    except OSError as err:
        return ErrorFileContent(problem=f"cannot be read ({err.strerror or err})")
    if not raw.strip():
        return ErrorFileContent(problem="empty")
    if len(raw) > _MAX_BYTES:
        return ErrorFileContent(problem=f"larger than {_MAX_BYTES // 1024 // 1024} MiB")
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except ValueError as err:
        return ErrorFileContent(problem=f"not JSON ({err})")
    content = _parse(data)
    if content is None:
        return ErrorFileContent(problem="not in torch's error-file format")
    return content
