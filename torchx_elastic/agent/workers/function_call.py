"""A Python function as a worker: the call file the caller writes, the result file a worker writes.

Both sides of both files are here, below the function launch (``agent/function/``) that
writes the call: the worker's bootstrap runs it. The caller (:mod:`torchx_elastic.launcher`)
pickles the function and its arguments once into a *call file* in a directory of its own;
every worker runs ``python -m torchx_elastic.agent.workers.bootstrap --call CALL_FILE``,
which unpickles the call, runs it and pickles the return value into
``results/attempt_<k>/rank_<r>.pkl`` next to the call file (``k``:
``TORCHELASTIC_RESTART_COUNT``, ``r``: ``RANK``). An exception raised by the function ends the
worker like an uncaught exception in a script (the bootstrap writes torch's error file), so
the agent's supervision, restarts and root-cause report are the same as for a script.

Functions and arguments are pickled by reference, as ``multiprocessing`` does: a worker
started as a fresh interpreter (spawn) first prepares itself as ``multiprocessing``'s spawn
does (the caller's ``sys.path``, working directory, and its main script re-run as
``__mp_main__``), so a function defined in the ``__main__`` of a script unpickles there.

Standard library only: the bootstrap imports it in every function worker.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchx_elastic.contract import RANK_DIR_PREFIX, RESTART_COUNT_ENV
from torchx_elastic.contract.log_layout import NodeLogs

RESULTS_DIR = "results"
_PROTOCOL = pickle.HIGHEST_PROTOCOL
# set while a worker re-runs the caller's main script as __mp_main__: a launch from there
# (a script without an ``if __name__ == "__main__":`` guard) would start workers recursively
importing_main = False


class CallPicklingError(TypeError):
    """The function or an argument cannot be pickled for the workers."""


@dataclass(frozen=True)
class Call:
    """What every worker runs: ``function(*args)``, pickled."""

    preparation: dict[str, Any]
    payload: bytes


def describe(value: object) -> str:
    """``generator object`` / ``mymod.Thing object``: a value's type for messages."""
    kind = type(value)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return f"{name} object"


def _pickle(value: object, what: str) -> bytes:
    try:
        return pickle.dumps(value, protocol=_PROTOCOL)
    except Exception as err:  # noqa: BLE001 - pickle raises many kinds
        raise CallPicklingError(
            f"{what} ({describe(value)}) cannot be pickled to send it to the workers: {err}."
            " A worker gets the function and its arguments by pickle: use a function defined"
            " at the top level of a module or script (not a lambda or a nested function) and"
            " arguments that pickle (no open files, locks, generators, sockets)"
        ) from err


def preparation_data() -> dict[str, Any]:
    """What a fresh interpreter needs to unpickle the caller's functions (multiprocessing's)."""
    from multiprocessing import spawn

    if importing_main:
        raise RuntimeError(
            "a function launch was started while a worker was importing the caller's main"
            ' script; start the launch under `if __name__ == "__main__":` in that script'
            " (as with multiprocessing's spawn)"
        )
    data: dict[str, Any] = spawn.get_preparation_data("torchx-elastic-worker")
    data.pop("authkey", None)  # not needed: workers talk to no multiprocessing manager
    return data


def make_call(function: Callable[..., Any], args: Sequence[Any]) -> Call:
    """The call of ``function(*args)``; :class:`CallPicklingError` names what does not pickle."""
    name = getattr(function, "__qualname__", repr(function))
    try:
        payload = pickle.dumps((function, tuple(args)), protocol=_PROTOCOL)
    except Exception:  # noqa: BLE001 - find the culprit to name it (pickled once otherwise)
        _pickle(function, f"the function {name}")
        for index, arg in enumerate(args):
            _pickle(arg, f"argument {index} of {name}")
        payload = _pickle((function, tuple(args)), f"the call of {name}")
    return Call(preparation_data(), payload)


def write_call(call: Call, path: str) -> None:
    with open(path, "wb") as file:
        pickle.dump(call, file, protocol=_PROTOCOL)


def result_path(call_file: str, attempt: int | str, rank: int | str) -> str:
    results = os.path.join(os.path.dirname(call_file), RESULTS_DIR)
    return os.path.join(NodeLogs(results).attempt_dir(attempt), f"{RANK_DIR_PREFIX}{rank}.pkl")


def _is_fresh_interpreter() -> bool:
    """True when this worker process was started for the call (spawn), False when it was
    forked from the caller (its ``__main__`` is the caller's already)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == "torchx_elastic.agent.workers.bootstrap"


def _prepare(preparation: dict[str, Any]) -> None:
    global importing_main
    from multiprocessing import spawn

    importing_main = True
    try:
        spawn.prepare(preparation)
    finally:
        importing_main = False


def _write_result(path: str, value: object) -> None:
    rank = os.environ.get("RANK", "?")
    try:
        data = pickle.dumps(value, protocol=_PROTOCOL)
    except Exception as err:  # noqa: BLE001 - pickle raises many kinds
        raise CallPicklingError(
            f"the return value of rank {rank} ({describe(value)}) cannot be pickled to send it"
            f" back to the caller: {err}; return a value that pickles (numbers, strings, lists,"
            " dicts, tensors, ...)"
        ) from None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as file:
        file.write(data)
    os.replace(tmp, path)


def _unpickle_call(call: Call) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    try:
        function, args = pickle.loads(call.payload)
    except Exception as err:  # noqa: BLE001 - unpickling runs arbitrary imports
        raise CallPicklingError(
            f"rank {os.environ.get('RANK', '?')} cannot unpickle the function or its"
            f" arguments: {type(err).__name__}: {err}. A worker started by spawn imports them"
            " by name, as multiprocessing does: define them in a module the workers can"
            ' import, or in the main script (its launch under `if __name__ == "__main__":`);'
            " what a notebook or the REPL defines cannot be imported"
        ) from err
    return function, tuple(args)


def run_call_file(call_file: str) -> None:
    """In the worker: run the call and write its return value to this rank's result file."""
    with open(call_file, "rb") as file:
        call: Call = pickle.load(file)
    if _is_fresh_interpreter():
        _prepare(call.preparation)
    else:  # a fork of the caller: its arguments, as multiprocessing's fork keeps them
        sys.argv = list(call.preparation.get("sys_argv", sys.argv))
    function, args = _unpickle_call(call)
    path = result_path(call_file, os.environ.get(RESTART_COUNT_ENV, "0"), os.environ["RANK"])
    try:
        value = function(*args)
    except SystemExit as exit_:
        if exit_.code in (None, 0):
            _write_result(path, None)  # a worker that ends early on purpose returns None
        raise
    _write_result(path, value)


def read_results(call_file: str, attempt: int) -> dict[int, Any]:
    """Global rank -> return value, from the result files of ``attempt``."""
    directory = os.path.dirname(result_path(call_file, attempt, 0))
    results: dict[int, Any] = {}
    if not os.path.isdir(directory):
        return results
    for name in os.listdir(directory):
        stem, ext = os.path.splitext(name)
        if ext != ".pkl" or not stem.startswith(RANK_DIR_PREFIX):
            continue
        with open(os.path.join(directory, name), "rb") as file:
            results[int(stem[len(RANK_DIR_PREFIX) :])] = pickle.load(file)
    return results
