"""First code of every worker: ``python -m torchx_elastic.agent.workers.bootstrap SCRIPT ARGS``.

Runs the user's script or module exactly as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS``
would (``__main__``, ``sys.argv``, ``__file__``, ``sys.path[0]``), or executes a program
(``--exec PROGRAM ARGS``, the agent's ``--no-python``), or calls a pickled Python function
(``--call CALL_FILE``, see :mod:`torchx_elastic.agent.workers.function_call`), and in addition:

- dies with the agent: the Linux parent-death signal is set, so a SIGKILLed agent leaves no
  orphaned workers behind;
- records an uncaught exception in ``TORCHELASTIC_ERROR_FILE`` (torch.distributed.elastic's
  error-file format) without the user decorating anything with ``@record``, its message
  ``not retried: ...`` when the job must not restart for it (contract/not_retried.py);
- dumps every thread's Python stack to stderr on ``DUMP_STACKS_SIGNAL`` (the hang watchdog).

Standard library only: it runs before the user's first import.
"""

from __future__ import annotations

import builtins
import faulthandler
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import traceback
import types
from types import TracebackType

from torchx_elastic.contract import AGENT_PID_ENV, ERROR_FILE_ENV
from torchx_elastic.contract.error_file import write_error_file
from torchx_elastic.contract.not_retried import NO_RETRY_ENV, NoRetryRule, not_retried

DUMP_STACKS_SIGNAL = signal.SIGRTMIN + 4
_CALL_MODULE = "torchx_elastic.agent.workers.function_call"
_PR_SET_PDEATHSIG = 1
_OWN_FILES = frozenset(
    # "<string>": the ``-c`` that starts the bootstrap in another interpreter (PYTHON_EXEC)
    {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>", "<string>"}
)


# How another interpreter (torchrun's ``PYTHON_EXEC``) runs this bootstrap: it may not have
# this package installed, so the package's folder is put on ``sys.path`` for the bootstrap's
# own imports only and taken off again before the user's code runs.
_RUN_FROM_FOLDER = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from torchx_elastic.agent.workers import bootstrap; "
    "sys.path.remove(bootstrap.PACKAGE_FOLDER); bootstrap.main()"
)
PACKAGE_FOLDER = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def command_args(python_exec: str | None) -> tuple[str, ...]:
    """The interpreter's arguments that run this bootstrap: ``-m`` in the agent's own
    interpreter, from the package's folder in another one (``PYTHON_EXEC``)."""
    if python_exec is None:
        return ("-m", __name__)
    return ("-c", _RUN_FROM_FOLDER, PACKAGE_FOLDER)


def die_with_parent(parent_pid_env: str, sig: int) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent (the process whose
    pid ``parent_pid_env`` holds) dies; exit at once if it is already gone."""
    parent_pid = os.environ.get(parent_pid_env)
    if not parent_pid or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != int(parent_pid):  # the parent died before prctl took effect
        os._exit(1)


def die_with_agent() -> None:
    """SIGKILL this worker when the agent that started it dies."""
    die_with_parent(AGENT_PID_ENV, signal.SIGKILL)


def record_error(exc: BaseException, tb: TracebackType | None) -> None:
    """Write the exception to the error file unless the script (e.g. ``@record``) did."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or os.path.exists(path):
        return
    message = f"{type(exc).__name__}: {exc}"
    try:
        if NoRetryRule.parse(os.environ.get(NO_RETRY_ENV, "")).exception_not_retried(exc):
            message = not_retried(message)
    except ValueError:
        pass  # the agent checked the list: one set by hand is only not used
    try:
        write_error_file(
            path,
            message,
            "".join(traceback.format_exception(type(exc), exc, tb)),
        )
    except OSError:
        pass  # the traceback still goes to stderr


def _is_own(filename: str, module: object) -> bool:
    if module == _CALL_MODULE:
        return True
    return filename in _OWN_FILES or os.path.abspath(filename) in _OWN_FILES


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's frames, as ``python script.py`` shows none."""
    while tb is not None and _is_own(
        tb.tb_frame.f_code.co_filename, tb.tb_frame.f_globals.get("__name__")
    ):
        tb = tb.tb_next
    return tb


def dump_stacks_on_signal() -> None:
    """The hang watchdog's request: every thread's Python stack goes to stderr.

    A real-time signal, so a script's own SIGUSR1/SIGUSR2 handlers (checkpoint on
    preemption, ...) are never triggered by the watchdog.
    """
    faulthandler.register(DUMP_STACKS_SIGNAL, all_threads=True, chain=False)


def run_script(script: str) -> None:
    """Run a script file as ``python script.py`` does (3.9 on): ``sys.argv[0]`` as given,
    ``__file__`` and the code's file name (what tracebacks show) the absolute path.
    (``runpy.run_path`` keeps the path as given in both and sets it as ``sys.argv[0]``.)"""
    path = os.path.abspath(script)
    with io.open_code(path) as file:
        code = compile(file.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __builtins__=builtins,
        __spec__=None,
        __package__=None,
        __cached__=None,
        __annotations__={},  # what the interpreter's own __main__ starts with
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def run(argv: list[str]) -> None:
    if argv[:1] == ["--exec"] and len(argv) >= 2:
        os.execvp(argv[1], argv[1:])  # --no-python: the parent-death signal survives exec
    if argv[:1] == ["--call"] and len(argv) == 2:
        from torchx_elastic.agent.workers import function_call

        function_call.run_call_file(argv[1])
    elif argv[:1] == ["-m"] and len(argv) >= 2:
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif argv:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        if os.path.isfile(script):
            run_script(script)
        else:  # a directory or zip file with a __main__.py
            runpy.run_path(script, run_name="__main__")
    else:
        raise SystemExit(
            "usage: python -m torchx_elastic.agent.workers.bootstrap"
            " (SCRIPT | -m MODULE | --exec PROGRAM) [ARGS...] | --call CALL_FILE"
        )


def main() -> None:
    die_with_agent()
    dump_stacks_on_signal()
    try:
        run(sys.argv[1:])
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - report, then exit as Python would
        tb = _user_frames(exc.__traceback__)
        record_error(exc, tb)
        traceback.print_exception(type(exc), exc, tb)
        sys.exit(1)


if __name__ == "__main__":
    main()
