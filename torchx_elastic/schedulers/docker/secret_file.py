"""``secret_env_file``: credentials read at submission, copied into each container as a file.

The file (docker's ``--env-file`` format) is read by ``torchx run``, not by the dry run, and
goes into each container before it starts (``docker cp``), where the agent exports its
variables (``agent/env_file.py``): the values are not in the container's config
(``docker inspect``), the dry run, or the command line.
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Mapping

from torchx_elastic.contract import ENV_FILE_ENV
from torchx_elastic.contract.env_file import parse_env_file
from torchx_elastic.schedulers.docker.errors import DockerSchedulerError

CONTAINER_DIR = "/tmp"
FILE_NAME = "torchx-elastic-secret.env"
CONTAINER_PATH = f"{CONTAINER_DIR}/{FILE_NAME}"
FILE_MODE = 0o444  # whatever user the image runs as reads it


class SecretEnvFileError(DockerSchedulerError):
    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"secret_env_file {path}: {detail}")


def secret_archive(path: str, host_env: Mapping[str, str] = os.environ) -> bytes:
    """The tar archive (for ``put_archive`` into CONTAINER_DIR) of the variables of ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            env = parse_env_file(f.read(), host_env)
    except OSError as e:
        raise SecretEnvFileError(path, e.strerror or str(e)) from e
    except ValueError as e:
        raise SecretEnvFileError(path, str(e)) from e
    data = "".join(f"{name}={value}\n" for name, value in env.items()).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(FILE_NAME)
        info.size, info.mode = len(data), FILE_MODE
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def file_env() -> dict[str, str]:
    """The container's variable naming the file."""
    return {ENV_FILE_ENV: CONTAINER_PATH}
