"""A rendezvous handler that tells a listener about every completed round.

It wraps the handler the agent created and is a ``RendezvousHandler`` itself (torch's public
interface), so whatever loop drives the rendezvous, torch's agent or our own, every
``next_rendezvous()`` also hands the round's store, this node's rank and the number of
nodes to the listener (the cross-node progress exchange). Everything else is the wrapped
handler's. It is the top of the rendezvous stack (handler.py's docstring).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo

from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous

log = logging.getLogger(__name__)

RoundListener = Callable[[Any, int, int], None]  # (the round's torch Store, rank, nodes)


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
