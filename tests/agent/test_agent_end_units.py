"""What an agent's end leaves of its rendezvous (supervision/launcher.py ``supervise``): a run
stopped by a signal leaves the rendezvous open for the other nodes, as torchrun's does, and
ends its own heartbeats there. A node that
never joined a round leaves it as it found it, unless its join timed out."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousTimeoutError

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.rdzv_settings import RendezvousSettings
from torchx_elastic.agent.rendezvous.diagnosis import Problem, RendezvousDiagnosis
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.supervision import launcher


def _one_node_round() -> Any:
    """The agent's rendezvous with its keyed liveness, in a complete one-node round."""
    params = RendezvousParameters(
        "c10d", "localhost:0", "job", 1, 1, local_addr="127.0.0.1", keep_alive_interval=1
    )
    settings = RendezvousSettings.parse(params.config)
    endpoint = Endpoint("localhost", 0)
    handler = handler_on_store(HashStore(), params, settings, StoreSigner(None), endpoint)
    handler.next_rendezvous()
    return handler


def _beating(handler: Any) -> bool:
    return any(t.is_alive() for t in handler.keyed_liveness()._threads)


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
    """The beats end with the run (the other nodes drop this one after the dead-after
    time), and the rendezvous stays open for them."""
    monkeypatch.setattr(launcher, "absorb_stop_signals", lambda: None)  # pytest's own stay
    handler = _one_node_round()
    no_config: Any = None  # supervise reads none of it on this path
    stopped: Any = _Ended(handler, SignalException("stopped", signal.SIGTERM))
    closes: Any = _Closes()
    end = launcher.supervise(no_config, stopped, closes, closes, None)
    assert (end.code, end.shutdown_rendezvous) == (128 + signal.SIGTERM, False)
    assert not _beating(handler)
    assert not handler.is_closed()  # the other nodes go on without it


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
    assert handler.is_closed() is closed
    assert not _beating(handler)
