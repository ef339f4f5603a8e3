"""Env vars whose names look like credentials: a warning at submission, masked dry runs.

A value given with ``--env`` (the role's env) travels in plain text in what the scheduler
creates (a Job spec, a container's config) and in ``torchx run --dryrun`` output. Each
scheduler has a way to pass it that does not: ``secret_option`` names it in the warning.
The dry run prints the app (torchx's ``=== APPLICATION ===``) and the request: both masked.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, List

from torchx.specs import AppDef

logger = logging.getLogger(__name__)

CREDENTIAL_SUFFIXES = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MASK = "<masked>"


def looks_like_credential(name: str) -> bool:
    """``WANDB_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET``, ``DB_PASSWORD``, any case."""
    return name.upper().endswith(CREDENTIAL_SUFFIXES)


def credential_names(names: Iterable[str]) -> List[str]:
    return sorted({name for name in names if looks_like_credential(name)})


def warning_line(names: List[str], scheduler: str, secret_option: str) -> str:
    return (
        f"--env {', '.join(names)}: a credential in plain text in the {scheduler} job's"
        f" spec (its dry run masks it); pass it with {secret_option} instead"
    )


def warn_about_credentials(names: Iterable[str], scheduler: str, secret_option: str) -> None:
    """One warning line for every credential-looking name among ``names``."""
    found = credential_names(names)
    if found:
        logger.warning(warning_line(found, scheduler, secret_option))


def masked_app(app: AppDef) -> AppDef:
    """A copy of ``app`` whose credential-looking env values read ``MASK``."""
    roles = [
        dataclasses.replace(
            role,
            env={k: MASK if looks_like_credential(k) else v for k, v in role.env.items()},
        )
        for role in app.roles
    ]
    return dataclasses.replace(app, roles=roles)
