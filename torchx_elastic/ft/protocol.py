"""What the groups' launchers and the Lighthouse role say to each other (standard library).

The Lighthouse role serves, on ``lighthouse_port + 1`` (:func:`registry_port`):

- ``POST /groups/<g>`` with ``{"node": <replica id>, "event": "started" | "ended", "rc": <int>}``:
  a node of replica group ``g`` started its agent, or its agent ended with exit code ``rc``;
  signed with the job's secret (:func:`signature`, in :data:`SIGNATURE_HEADER`) when the
  roles were given one, as the schedulers of torchx-elastic do: an unsigned report could
  end the Lighthouse (docs/security.md);
- ``GET /groups``: ``{"groups": {"<g>": {"state": ..., "nodes": {...}}}, "num_groups": R,
  "quorum": {"quorum_id": ..., "step": ..., "members": [...]} or null}``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import urllib.request
from typing import Optional

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
GROUP_ID_ENV = "REPLICA_GROUP_ID"
NUM_GROUPS_ENV = "NUM_REPLICA_GROUPS"
DEFAULT_LIGHTHOUSE_PORT = 29510
SIGNATURE_HEADER = "X-Torchx-Elastic-Signature"
REQUEST_TIMEOUT_S = 5.0
LIGHTHOUSE_ROLE = "lighthouse"  # the app's first role
_GROUP_ROLE = re.compile(r"group(\d+)")
_TRAILING_DIGITS = re.compile(r"(\d+)$")


def group_role_name(group: int) -> str:
    """The role of replica group ``group``: ``group0`` .. ``group<R-1>``."""
    return f"group{group}"


def role_group(role: str) -> Optional[int]:
    """The replica group a role runs (:func:`group_role_name`); None for any other role."""
    match = _GROUP_ROLE.fullmatch(role)
    return None if match is None else int(match[1])


def member_group(replica_id: str) -> Optional[int]:
    """The replica group of a quorum member: the trailing digits of the ``replica_id`` the
    script gave its ``Manager``, which is how torchft's own ``Manager`` numbers the groups
    (their global ranks); None when it ends in none."""
    match = _TRAILING_DIGITS.search(replica_id.partition(":")[0])
    return None if match is None else int(match[1])


def registry_port(lighthouse_port: int) -> int:
    """The port of the groups' registry: the one after torchft's Lighthouse."""
    return lighthouse_port + 1


def lighthouse_url(host: str, lighthouse_port: int) -> str:
    """``TORCHFT_LIGHTHOUSE``: torchft's Lighthouse (HTTP and gRPC on one port)."""
    return f"http://{host}:{lighthouse_port}"


def signature(secret: bytes, path: str, data: bytes) -> str:
    """A report's HMAC-SHA256 (of its path and body) with the job's secret."""
    return hmac.new(secret, path.encode() + b"\n" + data, hashlib.sha256).hexdigest()


def post_event(
    host: str,
    lighthouse_port: int,
    group: int,
    body: dict[str, object],
    secret: Optional[bytes] = None,
) -> None:
    """Tell the Lighthouse role about a node of ``group``, signed with ``secret`` if any
    (raises ``OSError`` when unreachable, ``urllib.error.HTTPError`` when refused)."""
    path = f"/groups/{group}"
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SIGNATURE_HEADER] = signature(secret, path, data)
    request = urllib.request.Request(
        f"http://{host}:{registry_port(lighthouse_port)}{path}",
        data=data,
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        response.read()


def get_groups(host: str, lighthouse_port: int) -> dict[str, object]:
    """The registry's view of every group (raises ``OSError`` when unreachable)."""
    url = f"http://{host}:{registry_port(lighthouse_port)}/groups"
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer
