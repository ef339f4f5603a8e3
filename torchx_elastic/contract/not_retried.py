"""Failures that end the job at once, without a restart (torch issue 133877).

A worker failure is *not retried* when the worker

- raises :class:`NotRetried` (or a subclass of it), importable as ``torchx_elastic.NotRetried``;
- exits with :data:`NOT_RETRIED_EXIT_CODE` (78, ``EX_CONFIG`` of BSD's sysexits: a configuration
  error, which no restart mends);
- raises an exception of a class named in the agent's ``--no-retry-on`` (the components'
  ``--no_retry_on``), e.g. ``ValueError,mypkg.ConfigError``: an instance of it or of a subclass,
  as ``except`` decides;
- exits with an exit code listed there (``--no-retry-on 2``: argparse's usage error).

The worker's bootstrap decides for exceptions (``isinstance``, in the worker) and writes its
error file's message as ``not retried: ValueError: ...``; the agent decides for exit codes, and
by the class name in the error file when the script wrote that file itself (torch's
``@record``). The agent hands the list to the workers in :data:`NO_RETRY_ENV`, only when given.

Standard library only: the bootstrap imports it before the user's first import.
"""

from __future__ import annotations

import builtins
import re
import sys
from dataclasses import dataclass

NO_RETRY_ENV = "TORCHX_ELASTIC_NO_RETRY_ON"
NOT_RETRIED_PREFIX = "not retried: "
NOT_RETRIED_EXIT_CODE = 78
_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(:|$)")


class NotRetried(Exception):
    """Raise it (or a subclass) in a worker: the job fails at once, with no restart and
    its root cause reading ``not retried: NotRetried: <your message>``."""


@dataclass(frozen=True)
class NoRetryRule:
    """The exception classes (as named) and exit codes that are not retried."""

    names: tuple[str, ...] = ()
    exit_codes: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> NoRetryRule:
        """``ValueError,mypkg.ConfigError,2``; ``ValueError`` with a clear message on a bad
        entry."""
        names: list[str] = []
        codes: set[int] = set()
        for entry in (e.strip() for e in text.split(",")) if text.strip() else ():
            if entry.isdigit():
                if not 0 < int(entry) <= 255:
                    raise ValueError(f"{entry!r} is not the exit code of a failure (1-255)")
                codes.add(int(entry))
            elif _NAME.match(entry):
                names.append(entry)
            else:
                raise ValueError(
                    f"{entry!r} is neither an exception class (ValueError, mypkg.ConfigError)"
                    " nor an exit code (1-255)"
                    if entry
                    else "an empty entry; give exception classes and exit codes, comma-separated"
                )
        return cls(tuple(names), frozenset(codes))

    def text(self) -> str:
        """What :meth:`parse` reads back (what the workers get in :data:`NO_RETRY_ENV`)."""
        return ",".join([*self.names, *map(str, sorted(self.exit_codes))])

    def exit_code_not_retried(self, code: int) -> bool:
        return code == NOT_RETRIED_EXIT_CODE or code in self.exit_codes

    def exception_not_retried(self, exc: BaseException) -> bool:
        """``exc`` is an instance of :class:`NotRetried` or of a class named here (looked up
        where the worker has it: a class whose module was never imported has no instance)."""
        if isinstance(exc, NotRetried) or _has_class_named(type(exc), "NotRetried"):
            return True
        for name in self.names:
            cls = _loaded_class(name)
            if (cls is not None and isinstance(exc, cls)) or _has_class_named(type(exc), name):
                return True
        return False

    def message_not_retried(self, message: str, traceback: str) -> bool:
        """An error file written without this rule (torch's ``@record``) names a class of it:
        the message's ``Name: ...`` or the traceback's last line ``pkg.mod.Name: ...``."""
        lines = [message, *traceback.strip().splitlines()[-1:]]
        for line in lines:
            match = _EXCEPTION_LINE.match(line.strip())
            if match is None:
                continue
            qualified = match.group(1)
            for name in (*self.names, NotRetried.__name__):
                if qualified == name or qualified.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]:
                    return True
        return False


RETRY_ALL = NoRetryRule()  # no class named, no exit code listed: the defaults only


def _loaded_class(name: str) -> type | None:
    module, _, attr = name.rpartition(".")
    owner = sys.modules.get(module) if module else builtins
    cls = getattr(owner, attr, None)
    return cls if isinstance(cls, type) else None


def _has_class_named(cls: type, name: str) -> bool:
    return any(
        name in (c.__name__, c.__qualname__, f"{c.__module__}.{c.__qualname__}")
        for c in cls.__mro__
    )


def not_retried(message: str) -> str:
    """``message`` as a failure that is not retried reads."""
    return message if message.startswith(NOT_RETRIED_PREFIX) else NOT_RETRIED_PREFIX + message


def is_not_retried(message: str) -> bool:
    return message.startswith(NOT_RETRIED_PREFIX)
