"""The signals that stop the agent (torchrun's ``TORCHELASTIC_SIGNALS_TO_HANDLE``).

As torch's ``PContext.start()``, the first one raises ``SignalException`` (the agent then
stops its workers with the same signal and exits 128 + signal); unlike torch, the handlers
are in place from the start of the run (a node stopped while it waits for the rendezvous
still writes its summary; before that, from the agent's first line, a stop signal ends it
with one line and 128 + signal), and once the agent is stopping, further signals change nothing:
a scheduler signals every process of a node (Slurm: the whole step, on cancel, on requeue,
on a peer's failure under ``srun --kill-on-bad-exit``) and often more than once, and a
second exception in the middle of the shutdown would skip the summary and the report.

A stop is never lost: ``SignalException`` is an ``Exception``, so a broad ``except`` that
happens to run in the main thread when the signal lands (a store call around a lost host)
would swallow it, and the agent would wait on (seen in CI: a node stopped while it re-formed
waited out its join timeout). Until the stop is taken (:func:`absorb_stop_signals`, the first
thing its handlers do), the signal is delivered again to the main thread every
:data:`REDELIVER_S`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from torchx_elastic.agent.config.defaults import DEFAULT_SIGNALS
from torchx_elastic.agent.console.output.agent_line import say
from torchx_elastic.contract import SIGNALS_ENV

log = logging.getLogger(__name__)


def stop_signals() -> list[signal.Signals]:
    """The signals named by ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (torch's default if unset)."""
    found = []
    for name in os.environ.get(SIGNALS_ENV, DEFAULT_SIGNALS).split(","):
        sig = getattr(signal, name.strip(), None)
        if isinstance(sig, signal.Signals):
            found.append(sig)
    return found


def stopped_before_joining(sig: signal.Signals) -> str:
    """What a node stopped before its rendezvous started says (a Job that succeeded removes
    its pods still starting or waiting for the rank-0 host's name)."""
    return f"torchx-elastic: stopped by {sig.name} before joining"


def stopping(sig: signal.Signals, workers_grace_s: float | None) -> str:
    """What an agent stopped by a signal says, once: what its workers get, if any run."""
    if workers_grace_s is None:
        return f"torchx-elastic: stopped by {sig.name}"
    return (
        f"torchx-elastic: stopped by {sig.name}: the workers get {sig.name} and"
        f" {workers_grace_s:g}s to exit before SIGKILL"
    )


def _exit_handler(agent_pid: int) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != agent_pid:  # the fork server (and its workers) forked from here:
            signal.signal(signum, signal.SIG_DFL)  # the default action, as if never set
            os.kill(os.getpid(), signum)
            return
        say(stopped_before_joining(signal.Signals(signum)))
        os._exit(128 + signum)  # nothing to stop yet: a fork server dies with the agent

    return handler


REDELIVER_S = 1.0


class _Redelivery:
    """Delivers a stop signal again to the main thread until the stop is taken."""

    def __init__(self) -> None:
        self._taken = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, signum: int) -> None:
        if self._thread is not None or self._taken.is_set():
            return
        self._thread = threading.Thread(
            target=self._run, args=(signum, threading.main_thread().ident), daemon=True,
            name="stop-signal-redelivery",
        )  # fmt: skip
        self._thread.start()

    def _run(self, signum: int, main_thread: int | None) -> None:
        while main_thread is not None and not self._taken.wait(REDELIVER_S):
            name = signal.Signals(signum).name
            log.info("%s not taken yet (an except caught it): delivered again", name)
            signal.pthread_kill(main_thread, signum)

    def taken(self) -> None:
        self._taken.set()


_redelivery = _Redelivery()


def _raise(signum: int, frame: FrameType | None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException  # imported by now

    _redelivery.start(signum)
    raise SignalException(f"Process {os.getpid()} got signal: {signum}", signal.Signals(signum))


def _absorb(signum: int, frame: FrameType | None) -> None:
    log.info("already stopping; %s changes nothing", signal.Signals(signum).name)


def _install(handler: signal.Handlers | object) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (a function launched from a thread)
    for sig in stop_signals():
        signal.signal(sig, handler)  # type: ignore[arg-type]


def exit_on_stop_signals() -> None:
    """Until :func:`raise_on_stop_signals`: a stop signal exits at once, with one line (the
    agent is still importing torch or starting its fork server: nothing to stop yet)."""
    _install(_exit_handler(os.getpid()))


def raise_on_stop_signals() -> None:
    """The next stop signal raises ``SignalException`` in the main thread (again, until the
    stop is taken)."""
    global _redelivery
    _redelivery.taken()  # a process that launches again (a function launch) starts afresh
    _redelivery = _Redelivery()
    _install(_raise)


def absorb_stop_signals() -> None:
    """The agent is stopping (the stop is taken): later stop signals are logged and otherwise
    ignored."""
    _redelivery.taken()
    _install(_absorb)
