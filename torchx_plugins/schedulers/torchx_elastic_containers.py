"""torchx-elastic's ``docker`` and ``kubernetes`` for torchx's plugin registry (development line).

``kubernetes`` replaces torchx's builtin of that name; ``docker`` sits beside torchx's own
``local_docker``. torchx 0.7 reads our entry points instead (pyproject.toml).
"""

from __future__ import annotations

from typing import Any

from torchx.plugins import register
from torchx.schedulers.api import Scheduler

from torchx_elastic.schedulers import docker as _docker
from torchx_elastic.schedulers import kubernetes as _kubernetes


@register.scheduler(name="docker")
def docker(session_name: str, **kwargs: Any) -> Scheduler:
    return _docker.create_scheduler(session_name, **kwargs)


@register.scheduler(name="kubernetes")
def kubernetes(session_name: str, **kwargs: Any) -> Scheduler:
    return _kubernetes.create_scheduler(session_name, **kwargs)
