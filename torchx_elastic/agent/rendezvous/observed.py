"""A rendezvous handler that tells a listener about every completed round.

It wraps the handler the agent created and is a ``RendezvousHandler`` itself (torch's public
interface), so whatever loop drives the rendezvous, torch's agent or our own, every
``next_rendezvous()`` also hands the round's store, this node's rank and the number of
nodes to the listener (the cross-node progress exchange). Everything else is the wrapped
handler's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo

from torchx_elastic.agent import compat

log = logging.getLogger(__name__)

RoundListener = Callable[[Any, int, int], None]  # (the round's torch Store, rank, nodes)


class WrappedRendezvous(RendezvousHandler):
    """A ``RendezvousHandler`` that hands every call to the handler it wraps; subclasses
    add to the calls they override."""

    def __init__(self, handler: RendezvousHandler) -> None:
        self.handler = handler

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

    def __getattr__(self, name: str) -> Any:
        # whatever else torch's handlers offer (torch adds methods between releases)
        if name == "handler":  # not set yet (copy, pickle): no endless recursion
            raise AttributeError(name)
        return getattr(self.handler, name)


class ObservedRendezvous(WrappedRendezvous):
    def __init__(self, handler: RendezvousHandler, on_round: RoundListener) -> None:
        super().__init__(handler)
        self._on_round = on_round

    def next_rendezvous(self) -> RendezvousInfo:
        info = self.handler.next_rendezvous()
        try:
            self._on_round(*compat.round_placement(info))
        except Exception:  # the listener is an extra: never fail a rendezvous for it
            log.exception("rendezvous round listener failed")
        return info
