"""torchx-elastic's ``local_cwd`` for torchx's plugin registry (its development line).

torchx scans ``torchx_plugins.schedulers`` and lists plugins before its builtins, module by
module in name order: this module comes first, so ``local_cwd`` stays torchx's default
scheduler. torchx 0.7 has no registry and reads our entry points instead (pyproject.toml).
"""

from __future__ import annotations

from typing import Any

from torchx.plugins import register
from torchx.schedulers.api import Scheduler

from torchx_elastic.schedulers import local_cwd as _local_cwd


@register.scheduler(name="local_cwd")
def local_cwd(session_name: str, **kwargs: Any) -> Scheduler:
    return _local_cwd.create_scheduler(session_name, **kwargs)
