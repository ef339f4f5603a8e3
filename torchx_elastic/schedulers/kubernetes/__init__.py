"""The kubernetes scheduler: Indexed Jobs with a headless Service (default) or Volcano Jobs.

Registered as torchx's ``kubernetes`` scheduler; see ``docs/kubernetes.md``.
``kubernetes`` (the client) is imported only when a cluster is talked to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler


def create_scheduler(
    session_name: str,
    client: Optional[ApiClient] = None,
    namespace: Optional[str] = None,
    **kwargs: Any,
) -> KubernetesScheduler:
    """torchx's factory: ``client`` (an ``ApiClient``) and ``docker_client`` (the engine
    that builds and pushes workspace images) may be injected, e.g. by tests."""
    from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler

    return KubernetesScheduler(
        session_name,
        client=client,
        namespace=namespace,
        docker_client=kwargs.get("docker_client"),
    )
