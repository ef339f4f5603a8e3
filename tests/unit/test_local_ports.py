"""local_cwd moves a role's rendezvous port that another program listens on."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import pytest

from torchx_elastic.schedulers.local_ports import move_taken_ports, port_taken

ENDPOINT = "${TORCHX_RANK0_HOST:-localhost}"


@dataclass
class Replica:
    args: list[str] = field(default_factory=list)


def _agent(port: int) -> Replica:
    return Replica(
        ["python", "-m", "torchx_elastic.agent", "--rdzv-endpoint", f"{ENDPOINT}:{port}"]
    )


def test_a_taken_port_moves_in_every_replica_of_the_role_and_the_rest_stays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as other:
        other.bind(("", 0))
        other.listen()
        taken = other.getsockname()[1]
        assert port_taken(taken)
        roles = {
            "trainer": [_agent(taken), _agent(taken)],
            "single": [_agent(0)],
            "user": [Replica(["bash", "-c", f"torchrun --rdzv-endpoint localhost:{taken}"])],
        }
        move_taken_ports(roles)
    moved = {r.args[-1] for r in roles["trainer"]}
    assert len(moved) == 1
    [endpoint] = moved
    host, _, port = endpoint.rpartition(":")
    assert host == ENDPOINT and int(port) != taken and not port_taken(int(port))
    assert roles["single"][0].args[-1] == f"{ENDPOINT}:0"  # a one-node job picks its own
    assert roles["user"][0].args[-1] == f"torchrun --rdzv-endpoint localhost:{taken}"
    assert capsys.readouterr().err == (
        f"torchx-elastic: the rendezvous port {taken} is taken on this machine (another"
        f" job's?): role trainer uses port {port}; --rdzv_port chooses another\n"
    )


def test_a_free_port_stays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("", 0))
        free = probe.getsockname()[1]
    roles = {"trainer": [_agent(free)]}
    move_taken_ports(roles)
    assert roles["trainer"][0].args[-1] == f"{ENDPOINT}:{free}"
    assert capsys.readouterr().err == ""
