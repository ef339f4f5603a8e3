"""The job's secret as a node is given it: what proves that a node belongs to the job
(docs/security.md).

The scheduler creates one per job (:func:`torchx_elastic.contract.new_secret`) and hands it
to every node through the environment (``SECRET_ENV``) or a file (``SECRET_FILE_ENV``), never
on the command line, where ``ps`` shows it. Read here by every program of a node that checks
it: the agent (its rendezvous store), an ft replica group and the Lighthouse. What the agent
does without one is its own (``agent/rendezvous/job_secret.py``).

Standard library only (the contract).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from torchx_elastic.contract import SECRET_ENV, SECRET_FILE_ENV


def read_secret(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret this node was given; None when none; ``ValueError`` when the file given
    cannot be read or is empty."""
    environ = os.environ if environ is None else environ
    text = environ.get(SECRET_ENV, "").strip()
    if text:
        return text.encode()
    path = environ.get(SECRET_FILE_ENV, "")
    if not path:
        return None
    try:
        data = Path(path).read_bytes().strip()
    except OSError as err:
        raise ValueError(
            f"{SECRET_FILE_ENV}={path}: cannot read the job's secret ({err.strerror})"
        ) from None
    if not data:
        raise ValueError(f"{SECRET_FILE_ENV}={path}: the file is empty; write the secret in it")
    return data


def hide_from_workers() -> None:
    """The workers do not need the secret: it leaves the agent's environment."""
    os.environ.pop(SECRET_ENV, None)
