"""Stopping a local_cwd job when ``torchx run`` is stopped (SIGTERM, Ctrl-C).

torchx's local scheduler closes a job (its runner does, as the signal's exception leaves
``torchx run``) with SIGTERM to each replica's process group and SIGKILL 10 s later (torchx
0.7): an agent then has no time to give its workers torchrun's grace (30 s, for a checkpoint
saved on SIGTERM) nor to write its exit event and node summary. Here the agents get SIGTERM
and up to :func:`stop_bound_s`: their workers' grace (the agent's ``--term-timeout-s``, else
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s, as the agent reads them) plus
``AGENTS_MARGIN_S`` for the agents' own shutdown; only what is left then is killed. A second
SIGINT or SIGTERM meanwhile (Ctrl-C again) kills every replica's process group at once; the
workers die with their agent (and their own children with the agent's janitor).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from torchx.schedulers.local_scheduler import SignalException

from torchx_elastic.contract import SHUTDOWN_TIMEOUT_ENV

DEFAULT_GRACE_S = 30.0  # torchrun's (torch's shutdown timeout)
AGENTS_MARGIN_S = 30.0  # after the workers' grace: the agents' exit event, summaries, exit
GRACE_FLAG = "--term-timeout-s"


def workers_grace_s(args: Sequence[str], env: Mapping[str, str]) -> float:
    """The seconds an agent started with ``args`` and ``env`` gives its workers between
    SIGTERM and SIGKILL (a value it would refuse counts as the default: it would not run)."""
    given: str | None = None
    for i, arg in enumerate(args):
        if arg == GRACE_FLAG and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith(GRACE_FLAG + "="):
            given = arg.partition("=")[2]
    if given is None:
        given = env.get(SHUTDOWN_TIMEOUT_ENV, os.environ.get(SHUTDOWN_TIMEOUT_ENV))
    try:
        return max(0.0, float(given)) if given is not None else DEFAULT_GRACE_S
    except ValueError:
        return DEFAULT_GRACE_S


def stop_bound_s(grace_s: float, margin_s: float = AGENTS_MARGIN_S) -> float:
    """How long a stopped job's agents may take before what is left of it is killed."""
    return grace_s + margin_s


def stopping_line(grace_s: float, bound_s: float) -> str:
    return (
        f"torchx-elastic: stopping the job: its workers get SIGTERM and {grace_s:g}s to finish,"
        f" its agents up to {bound_s:g}s in all; Ctrl-C again stops it at once"
    )


def killed_line(bound_s: float) -> str:
    return (
        f"torchx-elastic: the job's processes were still running {bound_s:g}s after the stop:"
        " killed"
    )


STOPPED_AT_ONCE = "torchx-elastic: stopped again: the job's processes are killed now"


def _signal_groups(procs: Sequence[subprocess.Popen[bytes]], sig: signal.Signals) -> None:
    for proc in procs:  # each replica leads a session (process group) of its own
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def stop_replicas(
    procs: Sequence[subprocess.Popen[bytes]], grace_s: float, margin_s: float = AGENTS_MARGIN_S
) -> None:
    """SIGTERM to each running replica's group, then wait up to :func:`stop_bound_s`; kill
    what is left then, or at once on a second SIGINT or SIGTERM. Each step says so in one
    line on stderr."""
    running = [proc for proc in procs if proc.poll() is None]
    if not running:
        return
    _signal_groups(running, signal.SIGTERM)
    bound_s = stop_bound_s(grace_s, margin_s)
    print(stopping_line(grace_s, bound_s), file=sys.stderr, flush=True)
    deadline = time.monotonic() + bound_s
    try:
        for proc in running:  # blocked in waitpid: a signal interrupts it at once
            proc.wait(max(0.0, deadline - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        print(killed_line(bound_s), file=sys.stderr, flush=True)
    except (SignalException, KeyboardInterrupt):  # torchx raises the former for both
        print(STOPPED_AT_ONCE, file=sys.stderr, flush=True)
    _signal_groups(running, signal.SIGKILL)


FOLLOWERS_DRAIN_S = 5.0  # after a stop, how long the log followers may take to print the rest


class Followers:
    """The log followers of a job that are still reading: ``torchx run``'s are daemon
    threads, so a stopped run waits for them to print the agents' last lines before it
    exits (the stop's own lines, a checkpoint's "saved")."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def follow(self, lines: Iterable[str]) -> Iterator[str]:
        with self._idle:
            self._count += 1
        try:
            yield from lines
        finally:
            with self._idle:
                self._count -= 1
                self._idle.notify_all()

    def wait_done(self, timeout_s: float = FOLLOWERS_DRAIN_S) -> None:
        """Until every follower has read to its end, or ``timeout_s``."""
        with self._idle:
            self._idle.wait_for(lambda: self._count == 0, timeout_s)
