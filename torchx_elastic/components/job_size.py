"""The ``-j [MIN:]NxM`` job size of ``dist.ddp`` and ``dist.spmd``."""

from __future__ import annotations

import re
from dataclasses import dataclass

_FORMS = re.compile(r"(?:(?:(?P<min>[0-9]+):)?(?P<max>[0-9]+)x)?(?P<nproc>[0-9]+)")
_NODES_ONLY = re.compile(r"(?:(?P<min>[0-9]+):)?(?P<max>[0-9]+)")

ACCEPTED_FORMS = (
    "accepted forms: 'M' (1 node x M processes, e.g. '4'), "
    "'NxM' (N nodes x M processes per node, e.g. '2x4'), "
    "'MIN:MAXxM' (elastic, MIN to MAX nodes x M processes, e.g. '2:4x8'); "
    "node and process counts are whole numbers >= 1 and MIN <= MAX"
)


class JobSizeError(ValueError):
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

        With ``gpus_per_node > 0`` (``dist.spmd`` on a GPU host) a bare number or
        ``MIN:MAX`` counts nodes and the processes per node are the GPU count.
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
    def _checked(cls, text: str, low: str | None, high: str | None, nproc: str) -> JobSize:
        max_nodes = int(high) if high is not None else 1
        min_nodes = int(low) if low is not None else max_nodes
        size = cls(min_nodes, max_nodes, int(nproc))
        if size.nproc_per_node < 1:
            raise JobSizeError(text, "processes per node must be at least 1")
        if size.max_nodes < 1 or size.min_nodes < 1:
            raise JobSizeError(text, "node counts must be at least 1")
        if size.min_nodes > size.max_nodes:
            raise JobSizeError(text, f"MIN nodes ({min_nodes}) is above MAX nodes ({max_nodes})")
        return size

    @property
    def is_elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    @property
    def nnodes(self) -> str:
        """The agent's ``--nnodes`` value: ``N`` or ``MIN:MAX``."""
        if self.is_elastic:
            return f"{self.min_nodes}:{self.max_nodes}"
        return str(self.max_nodes)

    def __str__(self) -> str:
        return f"{self.nnodes}x{self.nproc_per_node}"
