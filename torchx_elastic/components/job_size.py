"""The ``-j [MIN:]NxM`` job size of ``dist.torchrun``, ``dist.ddp`` and ``dist.spmd``.

Accepts what torchx's ``parse_nnodes`` accepts, with the same meaning:

- ``M``: one node with M processes;
- ``NxM``: N nodes with M processes each;
- ``MIN:MAXxM``: elastic, MIN to MAX nodes with M processes each. ``MIN`` may be 0 (a job that
  waits for resources: the scheduler may start it with none of its nodes up).

With a named host that has GPUs (``dist.spmd``; ``dist.torchrun`` with ``-h``), a bare ``N``
or ``MIN:MAX`` counts nodes and the processes per node are the host's GPU count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Tuple

from torchx_elastic.components.errors import ComponentArgumentError
from torchx_elastic.contract.agent_args import NodeRangeError, parse_node_range

_FORMS = re.compile(r"(?:(?:(?P<min>[0-9]+):)?(?P<max>[0-9]+)x)?(?P<nproc>[0-9]+)")
_NODES_ONLY = re.compile(r"(?:(?P<min>[0-9]+):)?(?P<max>[0-9]+)")

ACCEPTED_FORMS = (
    "accepted forms: 'M' (1 node x M processes, e.g. '4'), "
    "'NxM' (N nodes x M processes per node, e.g. '2x4'), "
    "'MIN:MAXxM' (elastic, MIN to MAX nodes x M processes, e.g. '2:4x8'); "
    "process counts and MAX are whole numbers >= 1, MIN is 0 or more and MIN <= MAX"
)


class JobSizeError(ComponentArgumentError):
    """A ``-j`` value that is not one of the accepted forms."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"invalid -j {text!r}: {reason}; {ACCEPTED_FORMS}")


@dataclass(frozen=True)
class JobSize:
    """Nodes (min..max) and worker processes per node."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int

    @classmethod
    def parse(cls, text: str, gpus_per_node: int = 0) -> JobSize:
        """Parse ``M``, ``NxM`` or ``MIN:MAXxM``.

        With ``gpus_per_node > 0`` (a GPU host) a bare number or ``MIN:MAX`` counts
        nodes and the processes per node are the GPU count.
        """
        if gpus_per_node > 0:
            nodes_only = _NODES_ONLY.fullmatch(text)
            if nodes_only:
                return cls._checked(text, nodes_only["min"], nodes_only["max"], str(gpus_per_node))
        match = _FORMS.fullmatch(text)
        if not match:
            raise JobSizeError(text, "not of the form [MIN:]NxM")
        return cls._checked(text, match["min"], match["max"], match["nproc"])

    @classmethod
    def parse_on_host(cls, text: str, host: str, gpus_per_node: int) -> JobSize:
        """``-j`` of a job on the named host ``host``: a bare count is a node count.

        As torchx: the processes per node come from the host's GPUs; a host without GPUs
        needs them given (``NxM``).
        """
        if _NODES_ONLY.fullmatch(text) and gpus_per_node < 1:
            raise JobSizeError(
                text,
                f"a bare node count takes the processes per node from the host's GPUs and"
                f" {host} has none; give them: -j {text}xM (e.g. -j {text}x8)",
            )
        return cls.parse(text, gpus_per_node)

    @classmethod
    def _checked(cls, text: str, low: str | None, high: str | None, nproc: str) -> JobSize:
        if int(nproc) < 1:
            raise JobSizeError(text, "processes per node must be at least 1")
        nodes = high if high is not None else "1"
        try:
            min_nodes, max_nodes = parse_node_range(nodes if low is None else f"{low}:{nodes}", 0)
        except NodeRangeError as err:
            raise JobSizeError(text, err.reason) from None
        return cls(min_nodes, max_nodes, int(nproc))

    @property
    def is_elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    @property
    def nnodes(self) -> str:
        """The agent's ``--nnodes`` value: ``N`` or ``MIN:MAX``.

        A rendezvous needs at least one node (the agent's own): a MIN of 0, which only
        tells the scheduler it may start the job with none of its nodes up, is 1 here.
        """
        low = max(self.min_nodes, 1)
        if low != self.max_nodes:
            return f"{low}:{self.max_nodes}"
        return str(self.max_nodes)

    def __str__(self) -> str:
        if self.is_elastic:
            return f"{self.min_nodes}:{self.max_nodes}x{self.nproc_per_node}"
        return f"{self.max_nodes}x{self.nproc_per_node}"


def parse_nnodes(j: str) -> Tuple[int, int, int, str]:
    """torchx's ``torchx.components.dist.parse_nnodes``, with this module's errors.

    ``(min_nnodes, max_nnodes, nproc_per_node, nnodes_rep)``: ``nnodes_rep`` is the node
    part of ``j`` as written (``"1"`` for a bare process count).
    """
    size = JobSize.parse(j)
    nodes, has_nodes, _ = j.rpartition("x")
    return size.min_nodes, size.max_nodes, size.nproc_per_node, nodes if has_nodes else "1"
