"""The ``docker`` scheduler: one container per replica on a network of the job's own.

Split in request building (``request``), run options (``options``), states (``status``),
logs (``logs``) and the engine calls (``scheduler``). docker-py is imported lazily.
"""

from torchx_elastic.schedulers.docker.scheduler import DockerScheduler, create_scheduler

__all__ = ["DockerScheduler", "create_scheduler"]
