"""A node that never joined a round and meets the end of its job exits 0, saying so."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import AgentConfig, config_from_args
from torchx_elastic.agent.rendezvous.handler import JobAlreadyFinished, late_for_the_job


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
