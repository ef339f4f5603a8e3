"""The one way a torchx-elastic program (the agent, an ft replica group, the Lighthouse)
ends on an error it can name: one line on stderr, ``torchx-elastic: error: <what>``, then
its exit code. Schedulers read the same prefix back from a replica's log (Kubernetes'
termination message), so it is spelled here once.

Standard library only (the contract).
"""

from __future__ import annotations

import sys
from typing import NoReturn

ERROR_PREFIX = "torchx-elastic: error:"


def error_line(message: object) -> str:
    """``torchx-elastic: error: <message>``."""
    return f"{ERROR_PREFIX} {message}"


def say_error(message: object) -> None:
    """Print the error line for ``message`` on stderr (flushed: the caller may leave with
    ``os._exit``)."""
    print(error_line(message), file=sys.stderr, flush=True)


def exit_with_error(message: object, code: int = 1) -> NoReturn:
    """Print the error line for ``message`` and exit with ``code`` (1: torchrun's code for
    a usage or rendezvous error)."""
    say_error(message)
    sys.exit(code)
