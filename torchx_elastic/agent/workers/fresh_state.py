"""A forked worker's process-wide state, made what a fresh ``python SCRIPT`` would see.

The fork server is a copy of the agent: it shares the agent's logging set-up, warning
registries, standard streams, random states and torch's seed. A worker forked from it must
see none of that: what it can observe of the process is what a new interpreter that
imported the same modules would show (tests/fidelity compares the two, state by state).
What stays shared by design (docs/agent.md, "How workers start"): the modules the server
imported, with what their import did (torch's loggers, warning filters), the interpreter's
start-up (``sys.flags``, the hash seed) and the frozen garbage collector generation.

Standard library only: torch and numpy are reseeded only when already imported.
"""

from __future__ import annotations

import io
import logging
import os
import random
import sys
import warnings

OWN_PACKAGE = "torchx_elastic"


def _ours(obj: object) -> bool:
    return type(obj).__module__.split(".", 1)[0] == OWN_PACKAGE


def forget_own_logging() -> None:
    """No logger, handler or filter of this package is left: the agent's loggers are
    removed, torch's keep only what torch's import gave them."""
    manager = logging.Logger.manager
    for name in [name for name in manager.loggerDict if name.split(".", 1)[0] == OWN_PACKAGE]:
        del manager.loggerDict[name]
    for logger in [logging.root, *manager.loggerDict.values()]:
        if not isinstance(logger, logging.Logger):
            continue
        for handler in [h for h in logger.handlers if _ours(h)]:
            logger.removeHandler(handler)
        for filter_ in [f for f in logger.filters if _ours(f)]:
            logger.removeFilter(filter_)
    logging.root.setLevel(logging.root.level)  # drops every logger's cached level


def fresh_root_logger() -> None:
    """The root logger of a new interpreter: no handler, no filter, level WARNING, nothing
    disabled, so a script's ``logging.basicConfig`` configures it as it would anywhere."""
    root = logging.root
    for handler in list(root.handlers):
        root.removeHandler(handler)  # not closed: it writes to the server's streams
    for filter_ in list(root.filters):
        root.removeFilter(filter_)
    logging.disable(logging.NOTSET)
    root.setLevel(logging.WARNING)  # and drops every logger's cached level


def fresh_warning_registries() -> None:
    """Warnings the agent was given (each module's ``__warningregistry__``, the ``once``
    registry) show again in the worker, as they would in a new interpreter."""
    getattr(warnings, "onceregistry", {}).clear()
    filters = list(warnings.filters)
    warnings.filterwarnings("default", append=True)  # a change marks every registry stale
    warnings.filters[:] = filters  # type: ignore[index]  # a list, typed as a Sequence


def fresh_stdio() -> None:
    """Standard streams on descriptors 0-2 as the interpreter makes them at start-up
    (CPython's ``create_stdio``): its encoding and error handlers, ``-u``/``PYTHONUNBUFFERED``,
    stdout line-buffered on a terminal, stderr always, ``sys.__stdout__`` the same object."""
    template = sys.__stdout__ or sys.stdout
    encoding = getattr(template, "encoding", None) or "utf-8"
    errors = getattr(template, "errors", None) or "strict"
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # the worker's, as a spawn's
    streams = []
    for fd, mode in ((0, "r"), (1, "w"), (2, "w")):
        writing = mode == "w"
        buffering = 0 if unbuffered and writing else -1
        binary = open(fd, mode + "b", buffering, closefd=False)  # noqa: SIM115
        stream = io.TextIOWrapper(
            binary,
            encoding=encoding,
            errors="backslashreplace" if fd == 2 else errors,
            newline="\n",
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
            write_through=unbuffered,
        )
        stream.mode = mode  # type: ignore[misc]  # as the interpreter's own
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def fresh_random_states() -> None:
    """Seeds of its own, as each new interpreter draws: Python's, numpy's and torch's CPU
    generator (siblings forked from one server would otherwise draw the same numbers)."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()


def fresh_torch_threads() -> None:
    """torch's intra-op threads as a new interpreter sets them from ``OMP_NUM_THREADS``."""
    threads = os.environ.get("OMP_NUM_THREADS")
    torch = sys.modules.get("torch")
    if threads and threads.isdigit() and torch is not None:
        torch.set_num_threads(int(threads))


def as_fresh_interpreter(script_worker: bool) -> None:
    """Everything above, in a worker just forked from the server. A function's worker
    (``script_worker`` False) is a fork of the caller, as ``multiprocessing``'s fork is:
    it keeps the caller's logging and warnings, and loses only what this package added."""
    forget_own_logging()
    if script_worker:
        fresh_root_logger()
        fresh_warning_registries()
    fresh_stdio()
    fresh_random_states()
    fresh_torch_threads()
