"""A docker job's timeline: the agents' files copied out of its containers.

Each container's agent keeps its log directory in the container (``/tmp/torchx_elastic_*``,
the agent's default), and the engine serves a container's files while it exists, running
or stopped (``docker cp``, ``GET /containers/<id>/archive``; no exec, nothing runs in it).
This copies, from every container of the job, ``events.jsonl`` (merged), the summaries, and
per failed rank its error file and the tail of its stderr, into one local directory that
reads as a local_cwd job's. Once the containers are removed (``torchx delete``,
``docker rm``) nothing is left to draw.
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, cast

from torchx_elastic.contract.log_layout import (
    ATTEMPT_DIR_PREFIX,
    DEFAULT_LOG_DIR_PREFIX,
    EVENTS_FILE,
    RANK_DIR_PREFIX,
    RANK_ERROR_FILE,
    STDERR_FILE,
    SUMMARY_PREFIX,
    NodeLogs,
)
from torchx_elastic.timeline.log_dir import SourceError, timeline_of_dir
from torchx_elastic.timeline.model import Timeline

if TYPE_CHECKING:
    from docker import DockerClient

AGENT_DIRS_IN = "/tmp"  # where the agent's default log directory is made (tempfile)
AGENT_DIR_PREFIX = DEFAULT_LOG_DIR_PREFIX
STDERR_TAIL_BYTES = 64 * 1024
# a rank's error file and the tail of its stderr, in NodeLogs.rank_dir's layout
_RANK_FILE = re.compile(
    rf"{ATTEMPT_DIR_PREFIX}\d+/{RANK_DIR_PREFIX}\d+/"
    rf"({re.escape(RANK_ERROR_FILE)}|{re.escape(STDERR_FILE)})"
)


class _Chunks:
    """The archive's chunks as a file for ``tarfile`` in stream mode."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data


def copy_agent_files(chunks: Iterable[bytes], dest: str) -> int:
    """Copy the agents' files out of a tar stream of ``/tmp``; how many files were kept."""
    kept = 0
    with tarfile.open(fileobj=cast(IO[bytes], _Chunks(chunks)), mode="r|") as archive:
        for member in archive:
            parts = member.name.split("/")
            # tmp/torchx_elastic_xxx/<file...>
            if len(parts) < 3 or not parts[1].startswith(AGENT_DIR_PREFIX) or not member.isfile():
                continue
            inner = "/".join(parts[2:])
            name = parts[-1]
            wanted = (
                inner == EVENTS_FILE
                or (len(parts) == 3 and name.startswith(SUMMARY_PREFIX))
                or _RANK_FILE.fullmatch(inner)
            )
            source = archive.extractfile(member) if wanted else None
            if source is None:
                continue
            data = source.read()
            if name == STDERR_FILE:
                data = data[-STDERR_TAIL_BYTES:]
            path = os.path.join(dest, *inner.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # every node's events go into one file, as when the agents share a directory
            with open(path, "ab" if inner == EVENTS_FILE else "wb") as file:
                file.write(
                    data
                    if not data or data.endswith(b"\n") or name != EVENTS_FILE
                    else data + b"\n"
                )
            kept += 1
    return kept


def timeline_of_docker_job(app_id: str, client: DockerClient | None = None) -> Timeline:
    from torchx_elastic.schedulers.docker.request import (
        LABEL_APP_ID,
        LABEL_SCHEDULER,
        SCHEDULER_NAME,
    )
    from torchx_elastic.schedulers.docker.scheduler import connect

    engine: Any = client or connect()
    containers = engine.containers.list(
        all=True,
        filters={"label": [f"{LABEL_SCHEDULER}={SCHEDULER_NAME}", f"{LABEL_APP_ID}={app_id}"]},
    )
    if not containers:
        raise SourceError(
            f"no containers of {app_id} on this Docker engine: the agents' files lived in"
            " them, and nothing of the job is left to draw once they are removed"
        )
    dest = tempfile.mkdtemp(prefix=f"timeline_{app_id}_")
    for container in containers:
        chunks, _ = container.get_archive(AGENT_DIRS_IN)
        copy_agent_files(chunks, dest)
    if not os.path.exists(NodeLogs(dest).events):
        raise SourceError(
            f"the containers of {app_id} hold no agent event log under"
            f" {AGENT_DIRS_IN}/{AGENT_DIR_PREFIX}* (was the job started by an older agent,"
            " or with another --log-dir?)"
        )
    timeline = timeline_of_dir(dest, title=app_id)
    timeline.source = f"the {len(containers)} containers of {app_id} (files copied to {dest})"
    return timeline
