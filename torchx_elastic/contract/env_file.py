"""Env vars from a file the scheduler put in the container, for values kept out of its config.

The docker scheduler's ``secret_env_file`` reads a file of ``NAME=value`` lines (docker's
``--env-file`` format) when the job is submitted and copies it into each container, whose
``TORCHX_ELASTIC_ENV_FILE`` names it: the agent exports its variables to itself and its
workers, so the values are never in the container's config (``docker inspect``).
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, MutableMapping

from torchx_elastic.contract import ENV_FILE_ENV


def parse_env_file(text: str, host_env: Mapping[str, str]) -> Dict[str, str]:
    """docker's ``--env-file`` format: ``NAME=value`` lines (the value as written, no
    quotes removed), ``#`` comments and blank lines skipped, a bare ``NAME`` takes its value
    from ``host_env`` (left out when unset there)."""
    env: Dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        name, has_value, value = stripped.partition("=")
        if not name or name != name.strip() or " " in name:
            raise ValueError(f"line {number}: expected NAME=value, got {line!r}")
        if has_value:
            env[name] = value
        elif name in host_env:
            env[name] = host_env[name]
    return env


def load_env_file(environ: MutableMapping[str, str] = os.environ) -> None:
    """Export the variables of the file ``TORCHX_ELASTIC_ENV_FILE`` names, if it names one."""
    path = environ.get(ENV_FILE_ENV)
    if not path:
        return
    with open(path, encoding="utf-8") as f:
        environ.update(parse_env_file(f.read(), environ))
