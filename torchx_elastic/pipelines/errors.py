"""What a step says when the API server refused it a permission."""

from __future__ import annotations

FORBIDDEN = 403
ROLE_HINT = (
    " (the step's service account needs the Role in docs/pipelines-role.yaml:"
    " jobs, services, secrets, networkpolicies, pods and pods/log in the job's namespace)"
)


def with_role_hint(error: Exception) -> str:
    """``error``, and what to grant when the API server refused a permission."""
    forbidden = getattr(error, "status", None) == FORBIDDEN
    return f"{error}{ROLE_HINT}" if forbidden else str(error)
