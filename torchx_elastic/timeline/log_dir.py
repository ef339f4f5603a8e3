"""A timeline from the agents' log directory, and the error of a source that has none.

Every source ends here: a local directory as it is, a docker job's files once copied out of
its containers (``docker_source.py``); the Kubernetes source (``kubernetes_source.py``)
draws from the API server instead and shares only :class:`SourceError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from torchx_elastic.contract.events import read_events
from torchx_elastic.contract.log_layout import (
    AGENTS_LOG_SUBDIR,
    ATTEMPT_DIR_PREFIX,
    EVENTS_FILE,
    LocalAppLogs,
    NodeLogs,
)
from torchx_elastic.timeline.failures import classifier
from torchx_elastic.timeline.model import Timeline, build

_SEARCH_DEPTH = 5


class SourceError(Exception):
    """The records cannot be found; the message says where it looked and what to do."""


def _event_dirs(top: str) -> Iterator[str]:
    top_depth = top.rstrip(os.sep).count(os.sep)
    for directory, subdirs, files in os.walk(top):
        if EVENTS_FILE in files:
            yield directory
            subdirs[:] = []
        elif directory.count(os.sep) - top_depth >= _SEARCH_DEPTH:
            subdirs[:] = []
        else:
            subdirs[:] = [d for d in subdirs if not d.startswith(ATTEMPT_DIR_PREFIX)]


def find_log_dir(path: str, app_id: str | None = None) -> str:
    """The agents' log directory at or under ``path`` (of ``app_id`` when given)."""
    if not os.path.isdir(path):
        raise SourceError(f"{path}: no such directory")
    found = sorted(_event_dirs(path))
    if app_id is not None:
        found = [d for d in found if app_id in d.split(os.sep)]
    if not found:
        what = f" of {app_id}" if app_id else ""
        local = LocalAppLogs("<log_dir>/<session>/<app_id>").agents("<role>").root
        raise SourceError(
            f"no {EVENTS_FILE}{what} in {path}: give the agents' log directory (their"
            f" --log-dir; local_cwd: {local})"
        )
    if len(found) > 1:
        raise SourceError(
            f"{len(found)} jobs' event logs under {path}; name one:\n  " + "\n  ".join(found)
        )
    return found[0]


def timeline_of_dir(log_dir: str, title: str | None = None) -> Timeline:
    """The timeline of the agents' log directory ``log_dir``."""
    records = read_events(NodeLogs(log_dir).events)
    return build(
        records,
        title=title or _title(log_dir),
        source=log_dir,
        classify_failures=classifier(log_dir),
    )


def _title(log_dir: str) -> str:
    """``<app_id>/<role>`` for torchx's layout (``.../<app_id>/torchelastic/<role>``)."""
    parts = os.path.abspath(log_dir).split(os.sep)
    if len(parts) >= 3 and parts[-2] == AGENTS_LOG_SUBDIR:
        return f"{parts[-3]} ({parts[-1]})"
    return parts[-1] or log_dir
