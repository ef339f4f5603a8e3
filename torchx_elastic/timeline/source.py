"""Where a timeline's records come from: a log directory, or a torchx app handle.

- a directory holding ``events.jsonl`` (the agent's ``--log-dir``), or one above it: a
  local_cwd job's directory (``<log_dir>/<session>/<app_id>``, the agents' files under
  ``torchelastic/<role>/``) or the ``log_dir`` of the run (searched for the app)
  (``log_dir.py``);
- ``local_cwd://<session>/<app_id>``: found under local_cwd's log directory (``./torchx_logs``
  unless ``--log-dir`` names another);
- ``docker://<session>/<app_id>``: copied out of the job's containers, running or stopped
  (``docker_source.py``);
- ``kubernetes://<session>/<namespace>:<app_id>`` (torchx's handle): what the cluster still
  holds (``kubernetes_source.py``).
"""

from __future__ import annotations

from torchx_elastic.contract.log_layout import LOCAL_LOG_ROOT
from torchx_elastic.timeline.log_dir import SourceError, find_log_dir, timeline_of_dir
from torchx_elastic.timeline.model import Timeline


def load(target: str, local_log_dir: str = LOCAL_LOG_ROOT) -> Timeline:
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
