"""torchx-elastic's ``slurm`` for torchx's plugin registry (its development line): it replaces
torchx's builtin of that name. torchx 0.7 reads our entry points instead (pyproject.toml)."""

from __future__ import annotations

from typing import Any

from torchx.plugins import register
from torchx.schedulers.api import Scheduler

from torchx_elastic.schedulers import slurm as _slurm


@register.scheduler(name="slurm")
def slurm(session_name: str, **kwargs: Any) -> Scheduler:
    return _slurm.create_scheduler(session_name, **kwargs)
