"""The base of the agent's rendezvous layers: a ``RendezvousHandler`` around another.

Each layer of the stack the agent drives (handler.py's docstring draws it) is a
:class:`WrappedRendezvous`: torch's public ``RendezvousHandler`` interface, each call handed
to the handler it wraps unless the layer adds to it, and nothing else of the wrapped handler
reachable through it (no attribute forwarding). Besides torch's interface the layers answer
four questions of the stack itself: :attr:`~WrappedRendezvous.hosts_store`,
:meth:`~WrappedRendezvous.abandon`, :meth:`~WrappedRendezvous.keyed_liveness` and
:meth:`~WrappedRendezvous.torch_handler` (torch's own handler at the bottom, whose private
state ``agent/compat.py`` alone reads).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo


class WrappedRendezvous(RendezvousHandler):
    """A ``RendezvousHandler`` that hands every call to the handler it wraps; subclasses
    add to the calls they override."""

    def __init__(self, handler: RendezvousHandler) -> None:
        self.handler = handler

    # -- torch's RendezvousHandler interface -----------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        return self.handler.next_rendezvous()

    def get_backend(self) -> str:
        return self.handler.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self.handler.use_agent_store

    def is_closed(self) -> bool:
        return self.handler.is_closed()

    def set_closed(self) -> None:
        self.handler.set_closed()  # type: ignore[no-untyped-call]

    def num_nodes_waiting(self) -> int:
        return self.handler.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self.handler.get_run_id()

    def shutdown(self) -> bool:
        return self.handler.shutdown()

    # -- the stack's own questions ---------------------------------------------------

    @property
    def hosts_store(self) -> bool:
        """Whether this node's agent hosts the rendezvous store (a ``StoreHost`` layer
        below this one, handler.py)."""
        return isinstance(self.handler, WrappedRendezvous) and self.handler.hosts_store

    def abandon(self) -> None:
        """This node leaves this rendezvous for the job's moved one (failover.py): a layer
        still waiting in it stops (waiting.py's first round)."""
        if isinstance(self.handler, WrappedRendezvous):
            self.handler.abandon()

    def keyed_liveness(self) -> Any:
        """The ``KeyedLiveness`` of this rendezvous (keyed_liveness.py, above this module),
        where it has one (c10d over TCP, by default); None under torch's own handler
        (``--rdzv-conf handler=torch``)."""
        inner = self.handler
        return inner.keyed_liveness() if isinstance(inner, WrappedRendezvous) else None

    def torch_handler(self) -> RendezvousHandler:
        """The handler at the bottom of the stack: the agent's own rendezvous
        (rounds/handler.py), or torch's."""
        inner = self.handler
        return inner.torch_handler() if isinstance(inner, WrappedRendezvous) else inner
