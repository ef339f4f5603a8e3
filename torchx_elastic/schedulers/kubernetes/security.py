"""The container's security context: Pod Security "restricted" unless a run option asks more.

The default passes the ``restricted`` level that shared clusters enforce per namespace
(``pod-security.kubernetes.io/enforce=restricted``): a non-root user (the image's numeric
``USER``, which the kubelet checks), every capability dropped, the runtime's default seccomp
profile and no privilege escalation. ``run_as_root`` (an image that needs root) passes
``baseline``; ``privileged`` (host devices: ``--mounts type=device``) only ``privileged``.
"""

from __future__ import annotations

from typing import Any, Dict

from torchx_elastic.schedulers.errors import UserError
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions

Manifest = Dict[str, Any]

RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


def device_mount_refused(path: str) -> UserError:
    return UserError(
        f"device mount {path} needs a privileged container (Kubernetes has no --device):"
        " run with -cfg privileged=True (the pods then pass only Pod Security 'privileged')"
        " or use a device plugin"
    )


def security_context(options: KubernetesOptions) -> Manifest:
    """The container's ``securityContext`` for these run options."""
    if options.privileged:
        return {"privileged": True}
    context: Manifest = {
        "allowPrivilegeEscalation": False,
        "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP),
    }
    if options.run_as_root:
        context["runAsUser"] = 0
        return context
    return {**context, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


# the kubelet's words when runAsNonRoot meets an image that runs as root (or a user name)
_NON_ROOT_REFUSALS = ("runAsNonRoot and image will run as root", "image has non-numeric user")
RUN_AS_ROOT_HINT = "the image runs as root or a named user: -cfg run_as_root=True runs it as root"


def with_hint(message: str) -> str:
    """A container's waiting message, with the run option that helps when one does."""
    if any(text in message for text in _NON_ROOT_REFUSALS):
        return f"{message} ({RUN_AS_ROOT_HINT})"
    return message
