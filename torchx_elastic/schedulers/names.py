"""Names every scheduler of torchx-elastic shares: the rank-0 host variable and DNS labels."""

from __future__ import annotations

import re

# the variable that torchx's ``rank0_env`` macro names: every replica of a job gets the host
# of replica 0 in it (the agent's rendezvous endpoint is ``${TORCHX_RANK0_HOST:-localhost}``)

DNS_LABEL_MAX = 63
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_NOT_DNS = re.compile(r"[^a-z0-9]+")


def dns_label(text: str, max_length: int = DNS_LABEL_MAX, fallback: str = "app") -> str:
    """``text`` as an RFC 1035 label: lowercase alphanumerics and '-', starting with a letter.

    Every run of other characters becomes one '-' (``My_App.v2`` is ``my-app-v2``); a label
    that would not start with a letter gets ``fallback`` in front (``7up`` is ``app-7up``).
    """
    label = _NOT_DNS.sub("-", text.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"{fallback}-{label}" if label else fallback
    return label[:max_length].rstrip("-")


def is_dns_label(text: str) -> bool:
    return len(text) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(text) is not None
