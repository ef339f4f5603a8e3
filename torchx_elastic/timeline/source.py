"""Where a timeline's records come from: a log directory, or a torchx app handle.

- a directory holding ``events.jsonl`` (the agent's ``--log-dir``), or one above it: a
  local_cwd job's directory (``<log_dir>/<session>/<app_id>``, the agents' files under
  ``torchelastic/<role>/``) or the ``log_dir`` of the run (searched for the app);
- ``local_cwd://<session>/<app_id>``: found under local_cwd's log directory (``./torchx_logs``
  unless ``--log-dir`` names another);
- ``docker://<session>/<app_id>``: copied out of the job's containers, running or stopped
  (``docker_source.py``);
- ``kubernetes://<session>/<namespace>:<app_id>`` (torchx's handle): what the cluster still
  holds (``kubernetes_source.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from torchx_elastic.contract import (
    AGENTS_LOG_SUBDIR,
    ATTEMPT_DIR_PREFIX,
    EVENTS_FILE,
    agents_log_dir,
)
from torchx_elastic.contract import events as ev
from torchx_elastic.contract.events import read_events
from torchx_elastic.timeline.failures import classifier
from torchx_elastic.timeline.model import Timeline, build

log = logging.getLogger(__name__)

DEFAULT_LOCAL_LOG_DIR = "torchx_logs"  # local_cwd's default ``log_dir``
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
        raise SourceError(
            f"no {EVENTS_FILE}{what} in {path}: give the agents' log directory (their"
            f" --log-dir; local_cwd: {agents_log_dir('<log_dir>/<session>/<app_id>', '<role>')})"
        )
    if len(found) > 1:
        raise SourceError(
            f"{len(found)} jobs' event logs under {path}; name one:\n  " + "\n  ".join(found)
        )
    return found[0]


def timeline_of_dir(log_dir: str, title: str | None = None) -> Timeline:
    """The timeline of the agents' log directory ``log_dir``."""
    records = read_events(os.path.join(log_dir, EVENTS_FILE))
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


def load(target: str, local_log_dir: str = DEFAULT_LOCAL_LOG_DIR) -> Timeline:
    """The timeline of a log directory or an app handle (see the module's docstring)."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        return timeline_of_dir(find_log_dir(target))
    app_id = rest.rsplit("/", 1)[-1]  # kubernetes: namespace:job
    if scheme == "local_cwd":
        return timeline_of_dir(find_log_dir(local_log_dir, app_id), title=app_id)
    if scheme == "docker":
        from torchx_elastic.timeline.docker_source import timeline_of_docker_job

        return timeline_of_docker_job(app_id)
    if scheme == "kubernetes":
        from torchx_elastic.timeline.kubernetes_source import timeline_of_kubernetes_job

        return timeline_of_kubernetes_job(app_id)
    raise SourceError(
        f"{target}: not a log directory nor an app handle of local_cwd, docker or kubernetes"
    )


def restarted_or_failed(log_dir: str) -> bool:
    """Whether the agents of ``log_dir`` restarted their workers or failed (cheap: no torch)."""
    try:
        records = read_events(os.path.join(log_dir, EVENTS_FILE))
    except OSError:
        return False
    return any(
        r.get("event") in (ev.RESTART, ev.FAILURE, ev.HANG)
        or (r.get("event") == ev.EXIT and r.get("exit_code") not in (0, None))
        for r in records
    )
