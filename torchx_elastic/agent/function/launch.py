"""torch's ``launch_agent`` with our agent: run a function (or a program) as the workers.

The calling process is the agent, as with torch's ``elastic_launch``: it rendezvouses,
starts ``nproc_per_node`` workers, supervises them (restarts, hang watchdog, console) and
returns ``{global rank: return value}`` of this node's workers, or raises one
:class:`FunctionFailedError` naming the rank that failed first and its exception.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.launcher.api import LaunchConfig

from torchx_elastic.agent.config.launch import WorkerCommand
from torchx_elastic.agent.function.agent_run import Outcome, agent_config, run_agent
from torchx_elastic.agent.function.errors import FunctionFailedError
from torchx_elastic.agent.function.options import AgentOptions
from torchx_elastic.agent.workers import function_call
from torchx_elastic.agent.workers.cuda_fork import fork_hazard
from torchx_elastic.agent.workers.forkserver import ForkServer, WorkerExit
from torchx_elastic.agent.workers.processes import process_failure
from torchx_elastic.contract.agent_args import FORK, SPAWN, StartMethodError, check_start_method
from torchx_elastic.contract.log_layout import DEFAULT_LOG_DIR_PREFIX, NodeLogs

log = logging.getLogger(__name__)

Entrypoint = Callable[..., Any] | str
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def entrypoint_name(entrypoint: Entrypoint, args: Sequence[Any]) -> str:
    """torch's rule: a function's ``__name__``; for ``python`` the script; else the program."""
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", repr(entrypoint)))
    if entrypoint == sys.executable:
        return next((str(arg) for arg in args if not str(arg).startswith("-")), entrypoint)
    return entrypoint


def program_target(entrypoint: str, args: Sequence[Any]) -> WorkerCommand:
    """A program entrypoint as torch runs it: ``entrypoint *args``.

    ``sys.executable SCRIPT ...`` and ``sys.executable -m MODULE ...`` run through the
    bootstrap (so an uncaught exception reaches the root-cause report); anything else is
    executed as it is.
    """
    words = tuple(str(arg) for arg in args)
    if entrypoint == sys.executable and words and words[0] == "-m" and len(words) > 1:
        return WorkerCommand(words)
    if entrypoint == sys.executable and words and not words[0].startswith("-"):
        return WorkerCommand(words)
    return WorkerCommand(("--exec", entrypoint, *words))


def _exit_forked_worker(code: object) -> None:
    """A worker forked from the caller's copy ended: leave without running the caller's code
    (its frames above the launch, its atexit handlers) and without losing pending sends."""
    torch_distributed = sys.modules.get("torch.distributed")
    try:
        if torch_distributed is not None and torch_distributed.is_initialized():
            torch_distributed.destroy_process_group()  # flushes gloo's pending sends
    except Exception:  # noqa: BLE001 - the worker is done either way
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def start_fork_server(start_method: str) -> ForkServer | None:
    """A fork server forked from this process, or None (spawn) where none may be forked."""
    if start_method == SPAWN:
        return None
    hazard = fork_hazard()
    if hazard is not None:  # never a worker forked in a bad state
        log.warning("starting workers by spawn (start_method=%r): %s", start_method, hazard)
        return None
    try:
        return ForkServer(allow_threads=start_method == FORK, script_workers=False)
    except WorkerExit as worker_exit:  # in a worker forked from the server: its life ends
        _exit_forked_worker(worker_exit.code)
    except RuntimeError as err:  # other threads run: forking is not safe
        log.warning("starting workers by spawn (start_method=%r): %s", start_method, err)
    return None


@contextmanager
def signal_handlers_restored() -> Iterator[None]:
    """torch's worker contexts install SIGTERM/SIGINT/... handlers in the main thread and
    leave them: give the caller (a notebook, an application) its own handlers back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in _HANDLED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _failures(outcome: Outcome) -> dict[int, ProcessFailure]:
    summary = outcome.summary
    failed = [summary["root_cause"], *summary.get("other_causes", []), *summary.get("victims", [])]
    return {
        int(f["rank"]): process_failure(
            int(f["local_rank"]), int(f["pid"]), int(f["exitcode"]), str(f.get("error_path") or "")
        )
        for f in failed
    }


def raise_for_outcome(outcome: Outcome, name: str, log_dir: str) -> None:
    """The caller's exception for a run that did not succeed."""
    summary = outcome.summary
    if outcome.exit_code == 0:
        return
    if summary.get("state") == "STOPPED" and outcome.exit_code > 128:
        sig = signal.Signals(outcome.exit_code - 128)
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        raise SignalException(f"the launch of {name} was stopped by {sig.name}", sig)
    if summary.get("root_cause"):
        raise FunctionFailedError(name, _failures(outcome), summary["root_cause"], log_dir)
    raise RuntimeError(
        f"the launch of {name} failed (exit code {outcome.exit_code}) but no worker did;"
        f" see the agent's messages above and the logs in {log_dir}"
    )


def collect_results(call_file: str, attempt: int, nproc_per_node: int, name: str) -> dict[int, Any]:
    """Every local worker's return value by global rank, from the last attempt's files."""
    try:
        results = function_call.read_results(call_file, attempt)
    except Exception as err:  # noqa: BLE001 - unpickling runs arbitrary imports
        raise function_call.CallPicklingError(
            f"a return value of {name} cannot be unpickled in the caller: {err}; return"
            " objects whose classes the caller can import"
        ) from err
    if len(results) < nproc_per_node:
        log.warning(
            "%d of %d workers of %s sent no return value (ended by os._exit?); ranks that did: %s",
            nproc_per_node - len(results),
            nproc_per_node,
            name,
            sorted(results),
        )
    return dict(sorted(results.items()))


def _log_dir(config: LaunchConfig, run_id: str) -> str:
    """A new directory for this launch under the config's log root (as torch's logs)."""
    root = config.logs_specs.root_log_dir if config.logs_specs is not None else None
    if not root or root == os.devnull:
        return tempfile.mkdtemp(prefix=DEFAULT_LOG_DIR_PREFIX)
    os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"{run_id}_", dir=root)


def launch_agent(
    config: LaunchConfig,
    entrypoint: Entrypoint,
    args: Sequence[Any],
    options: AgentOptions | None = None,
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` on ``config.nproc_per_node`` workers of this node; see
    :func:`torchx_elastic.launcher.elastic_launch`."""
    if not callable(entrypoint) and not isinstance(entrypoint, str):
        raise TypeError(f"entrypoint {entrypoint!r} is neither a function nor a program name (str)")
    try:
        start_method = check_start_method(config.start_method)
    except StartMethodError as err:
        raise ValueError(f"start_method={err}") from None
    name = entrypoint_name(entrypoint, args)
    run_id = config.run_id or str(uuid.uuid4().int)  # torch's launcher: a random one
    call_dir = tempfile.mkdtemp(prefix="torchx_elastic_call_")
    try:
        if callable(entrypoint):
            call_file = os.path.join(call_dir, "call.pkl")
            function_call.write_call(function_call.make_call(entrypoint, args), call_file)
            worker = WorkerCommand(("--call", call_file))
        else:
            call_file = ""
            worker = program_target(entrypoint, args)
        log_dir = _log_dir(config, run_id)
        agent = agent_config(config, options or AgentOptions(), worker, log_dir, run_id)
        fork_server = start_fork_server(start_method) if callable(entrypoint) else None
        try:
            with signal_handlers_restored():
                outcome = run_agent(agent, fork_server)
        finally:
            if fork_server is not None:
                fork_server.close()
        raise_for_outcome(outcome, name, log_dir)
        attempt = int(outcome.summary.get("attempt", 0))
        if not call_file:
            return dict.fromkeys(NodeLogs(log_dir).ranks_of_attempt(attempt))
        return collect_results(call_file, attempt, config.nproc_per_node, name)
    finally:
        shutil.rmtree(call_dir, ignore_errors=True)
