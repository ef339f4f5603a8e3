"""A node that never joined a round and meets the end of its job exits 0, saying so."""

from __future__ import annotations

import datetime
import gc
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig, config_from_args
from torchx_elastic.agent.rendezvous.diagnosis import RendezvousDiagnosis, store_client
from torchx_elastic.agent.rendezvous.handler import (
    JobAlreadyFinished,
    handler_on_store,
    late_for_the_job,
)
from torchx_elastic.agent.rendezvous.parameters import rendezvous_parameters
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner


def config(nnodes: str) -> AgentConfig:
    argv = ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29500"]
    return config_from_args(build_parser().parse_args([*argv, "--rdzv-id", "job", "train.py"]))


def test_a_closed_rendezvous_is_the_end_of_any_job() -> None:
    for nnodes in ("2", "1:3"):
        assert late_for_the_job(RendezvousClosedError(), config(nnodes))


def test_a_host_gone_is_the_end_only_of_an_elastic_job() -> None:
    gone = RendezvousConnectionError("The connection to the C10d store has failed.")
    assert late_for_the_job(gone, config("1:3"))
    # a fixed-size job needs this node: it fails, and its scheduler starts it again
    assert not late_for_the_job(gone, config("2"))
    assert not late_for_the_job(RendezvousTimeoutError(), config("1:3"))


def test_the_two_messages() -> None:
    c = config("1:3")
    closed = JobAlreadyFinished(c.rdzv_endpoint, "job", RendezvousClosedError())
    assert str(closed) == (
        "the job this node came for has finished: its rendezvous (run id 'job' at n0:29500)"
        " is closed, so this node exits without training"
    )
    gone = JobAlreadyFinished(c.rdzv_endpoint, "job", RendezvousConnectionError("x"))
    assert str(gone) == (
        "the job this node came for has finished: the host of its rendezvous (run id 'job' at"
        " n0:29500) went away before this node joined a round (an elastic job ends so; a lost"
        " host leaves the job to the nodes that joined), so this node exits without training"
    )


def test_a_store_that_goes_away_as_a_late_node_reaches_it_ends_its_elastic_job() -> None:
    """A real store whose host exited right after this node connected (pod 0 of an elastic
    job that succeeded): torch's connection error reaches the caller, which tells a late
    node from a failure; before, it was a rendezvous failure and the late pod failed."""
    c = config("1:3")
    host = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=5))
    client = TCPStore(
        "127.0.0.1", host.port, is_master=False, timeout=datetime.timedelta(seconds=5)
    )
    del host
    gc.collect()
    params = rendezvous_parameters(c)
    with pytest.raises(RendezvousConnectionError) as gone:
        handler_on_store(client, params, c.rdzv, StoreSigner(None), c.rdzv_endpoint)
    assert late_for_the_job(gone.value, c)
    assert not late_for_the_job(gone.value, config("2"))


@pytest.fixture
def never_answers() -> Iterator[Callable[[], Any]]:
    """A store handshake that does not complete while the test runs."""
    test_over = threading.Event()
    yield test_over.wait
    test_over.set()


def test_a_host_gone_during_the_store_handshake_is_the_end_of_an_elastic_job(
    never_answers: Callable[[], Any],
) -> None:
    """Pod 0 of an elastic job exits as a late pod connects: its address vanishes without a
    reset, the handshake never completes, and then nothing takes a connection there."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    endpoint = Endpoint("127.0.0.1", port)
    gone = "went away while this node connected"
    with pytest.raises(RendezvousConnectionError, match=gone) as err:
        store_client(never_answers, endpoint, answer_s=0.2)
    assert late_for_the_job(err.value, config("1:3"))
    assert not late_for_the_job(err.value, config("2"))


def test_a_program_that_takes_connections_but_never_answers_is_not_a_store(
    never_answers: Callable[[], Any],
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        endpoint = Endpoint("127.0.0.1", other.getsockname()[1])
        said: list[str] = []
        with pytest.raises(RendezvousDiagnosis, match="is not a rendezvous store"):
            store_client(never_answers, endpoint, answer_s=0.2, report=said.append)
        assert said == [
            f"rendezvous at {endpoint}: the program there took the connection but has not"
            " answered as a rendezvous store for 0.1s (its host is starting or short of CPU,"
            f" or another program took the port); waiting until {said[0][-8:]}"
        ]


def test_the_silence_of_a_program_on_the_port_is_said_before_half_the_wait(
    never_answers: Callable[[], Any],
) -> None:
    """A long wait for the store's answer (30 s by default) is said after ``said_s``."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        endpoint = Endpoint("127.0.0.1", other.getsockname()[1])
        said: list[str] = []
        started = time.monotonic()
        with pytest.raises(RendezvousDiagnosis, match="is not a rendezvous store"):
            store_client(never_answers, endpoint, answer_s=1.0, report=said.append, said_s=0.2)
        assert len(said) == 1 and "has not answered as a rendezvous store for 0.2s" in said[0]
        assert time.monotonic() - started >= 1.0


def test_a_store_host_that_resets_the_handshake_and_goes_is_the_end_of_an_elastic_job() -> None:
    """Pod 0 exits just as a late pod's handshake reaches it: the client's error (a reset)
    is the host going away once nothing takes a connection there, not a failure."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]

    def reset() -> None:
        raise RuntimeError("recvValue failed: Connection reset by peer")

    with pytest.raises(RendezvousConnectionError, match="went away while this node connected"):
        store_client(reset, Endpoint("127.0.0.1", port), answer_s=0.2)


def test_a_handshake_error_from_a_live_host_is_passed_on() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()

        def refused_by_the_store() -> None:
            raise RuntimeError("the store refused this client")

        with pytest.raises(RuntimeError, match="the store refused this client"):
            store_client(refused_by_the_store, Endpoint("127.0.0.1", other.getsockname()[1]))
