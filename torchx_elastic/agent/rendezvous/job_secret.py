"""The job's secret: what proves that a node belongs to the job (docs/security.md).

The scheduler creates one per job and hands it to every node through the environment
(``TORCHX_ELASTIC_RDZV_SECRET``) or a file (``TORCHX_ELASTIC_RDZV_SECRET_FILE``), never on
the command line, where ``ps`` shows it; ``contract/job_secret.py`` reads it. A single-node
job makes its own; a multi-node job started without one runs unauthenticated, as torchrun
does, and says so once.
"""

from __future__ import annotations

import logging
import secrets

from torchx_elastic.contract import SECRET_ENV, SECRET_FILE_ENV

log = logging.getLogger(__name__)

UNAUTHENTICATED_WARNING = (
    "this multi-node rendezvous is NOT authenticated: any process that reaches the store port"
    " can join the job and run code in its agents; give every node the same secret in "
    f"{SECRET_ENV} or {SECRET_FILE_ENV} (docs/security.md)"
)


def job_secret(given: bytes | None, agents: int) -> bytes | None:
    """The secret this node uses: the one given; a fresh one where the job has one agent
    (one node, no spares: it is the only member); None, said once, for a job of several
    agents without one."""
    if given:
        return given
    if agents == 1:
        return secrets.token_bytes(32)
    log.warning(UNAUTHENTICATED_WARNING)
    return None
