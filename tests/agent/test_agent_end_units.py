"""What an agent's end leaves of its rendezvous (supervision/launcher.py ``supervise``): a run
stopped by a signal leaves the rendezvous open for the other nodes, as torchrun's does, and
ends its own heartbeats there; compat.stop_heartbeats waits for none of them. A node that
never joined a round leaves it as it found it, unless its join timed out."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousParameters,
    RendezvousTimeoutError,
    dynamic_rendezvous,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.rendezvous.diagnosis import Problem, RendezvousDiagnosis
from torchx_elastic.agent.supervision import launcher


def _one_node_round() -> Any:
    """torch's handler, in a complete one-node round, heartbeating every second."""
    store = HashStore()
    params = RendezvousParameters(
        "c10d", "localhost:0", "job", 1, 1, local_addr="127.0.0.1", keep_alive_interval=1
    )
    backend = C10dRendezvousBackend(store, "job")
    handler = dynamic_rendezvous.create_handler(store, backend, params)
    handler.next_rendezvous()
    return handler


def test_heartbeats_of_a_rendezvous_left_open_stop_without_waiting_and_nothing_joins_them() -> None:
    """A heartbeat stuck on a lost host does not hold the agent up, the timer's thread ends
    after it, and no finalizer is left to join that thread where the handler is collected."""
    handler = _one_node_round()
    timer = handler._keep_alive_timer
    stuck, release = threading.Event(), threading.Event()

    def stuck_heartbeat() -> None:
        stuck.set()
        release.wait(60)

    timer._ctx.function, timer._ctx.args = stuck_heartbeat, ()
    assert stuck.wait(30)
    compat.stop_heartbeats(handler)
    assert timer._thread.is_alive()  # returned while the heartbeat is still stuck
    assert not timer._finalizer.alive
    release.set()
    timer._thread.join(30)
    assert not timer._thread.is_alive()


class _Ended:
    """A supervisor of a node that never joined a round, whose run raised ``error``."""

    def __init__(self, handler: Any, error: BaseException) -> None:
        self.handler = handler
        self.error = error
        self.last_round = None
        self.attempt = 0

    def run(self) -> Any:
        raise self.error


class _Closes:
    def close(self) -> None:
        pass


def test_a_run_stopped_by_a_signal_leaves_the_rendezvous_open_and_ends_its_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left to the process's exit, torch's timer was joined by its finalizer wherever the
    garbage collector dropped the handler: on the timer's own thread that failed with
    "cannot join current thread", a traceback at the end of a cancelled Slurm job."""
    monkeypatch.setattr(launcher, "absorb_stop_signals", lambda: None)  # pytest's own stay
    handler = _one_node_round()
    no_config: Any = None  # supervise reads none of it on this path
    stopped: Any = _Ended(handler, SignalException("stopped", signal.SIGTERM))
    closes: Any = _Closes()
    end = launcher.supervise(no_config, stopped, closes, closes, None)
    assert (end.code, end.shutdown_rendezvous) == (128 + signal.SIGTERM, False)
    assert not handler._keep_alive_timer._finalizer.alive
    assert not handler._state_holder.state.closed  # the other nodes go on without it
    handler._keep_alive_timer._thread.join(30)
    assert not handler._keep_alive_timer._thread.is_alive()


MISMATCH = Problem("nodes disagree on --nnodes: 3 on h1 (pid 6), 2 on h0 (pid 5)", "start ...")


@pytest.mark.parametrize(
    ("cause", "closed"), [(None, False), (RendezvousTimeoutError("join timeout"), True)]
)
def test_a_node_that_never_joined_closes_the_rendezvous_only_where_its_join_timed_out(
    cause: BaseException | None, closed: bool
) -> None:
    """A node started with other settings (or at another job's endpoint) closed the
    rendezvous as it failed: a job already running ended at its next round, and the peer
    that would have named the mismatch found the rendezvous closed and said "the job this
    node came for has finished" (CI). A join that timed out closes it, as torchrun's does."""
    handler = _one_node_round()
    diagnosis = RendezvousDiagnosis(Endpoint("localhost", 29500), MISMATCH)
    diagnosis.__cause__ = cause
    no_config: Any = None
    ended: Any = _Ended(handler, diagnosis)
    closes: Any = _Closes()
    with pytest.raises(RendezvousDiagnosis):
        launcher.supervise(no_config, ended, closes, closes, None)
    handler._state_holder.sync()
    assert handler._state_holder.state.closed is closed
    assert not handler._keep_alive_timer._finalizer.alive
