"""A local job's rendezvous port, moved when another program has it.

Every job of ``dist.ddp`` on this machine has the rendezvous port 29500 unless told another
(``--rdzv_port``, as torchx's). A second multi-node job started while the first runs would
find that port taken and join the first job's store: it runs, with a warning, until the first
job ends and its store with it, then fails with C++ traces (torchrun's jobs do the same). All
of a local job's replicas are on this machine, so the scheduler can see the port is taken and
give the role a free one before its agents start, and say so.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Protocol

from torchx_elastic.contract.agent_args import RDZV_ENDPOINT_FLAG


class Replica(Protocol):
    args: list[str]


def port_taken(port: int) -> bool:
    """Whether a program listens on ``port`` on this machine (a port of a connection that
    just closed is free: the rendezvous store binds it with SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OverflowError:  # not a port: the agent says so
            return False
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
    return port


def _endpoint_index(args: Sequence[str]) -> int | None:
    """Where the agent's ``HOST:PORT`` is in a replica's arguments (None: none there)."""
    for index, arg in enumerate(args[:-1]):
        if arg == RDZV_ENDPOINT_FLAG and args[index + 1].rpartition(":")[2].isdigit():
            return index + 1
    return None


def move_taken_ports(roles: Mapping[str, Sequence[Replica]]) -> None:
    """Each role whose agents' rendezvous port (not 0: a one-node job picks its own) is
    taken gets a free one, in the arguments of all its replicas."""
    for role, replicas in roles.items():
        endpoints = [(r, i) for r in replicas if (i := _endpoint_index(r.args)) is not None]
        if not endpoints:
            continue
        port = int(endpoints[0][0].args[endpoints[0][1]].rpartition(":")[2])
        if port == 0 or not port_taken(port):
            continue
        moved = free_port()
        for replica, index in endpoints:
            replica.args[index] = f"{replica.args[index].rpartition(':')[0]}:{moved}"
        print(
            f"torchx-elastic: the rendezvous port {port} is taken on this machine (another"
            f" job's?): role {role} uses port {moved}; --rdzv_port chooses another",
            file=sys.stderr,
        )
