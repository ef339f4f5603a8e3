"""The rendezvous host lost while the job runs: what the watch, the loop and the failover
each do (rendezvous/failover.py has the move itself).

- The network watch's thread hears the host go silent: if the survivors of the last round
  make the job's minimum, it marks the rendezvous lost (the loop's waiting call returns at
  once), else it gives up with the reason.
- The loop's thread then (or when the store's connection fails) stops the workers, moves
  the rendezvous, says where to, and the watch follows it there.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import membership
from torchx_elastic.agent.rendezvous.failover import (
    Failover,
    HostLost,
    MovableRendezvous,
    NoSuccessor,
    RendezvousMoved,
)
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.supervision.network_watch import NetworkWatch


def can_move(config: AgentConfig) -> bool:
    """A c10d rendezvous over TCP of more than one node: the survivors move it to one of
    them (on one host, a survivor hosts it again at the endpoint). Whether they make the
    job's minimum, with the nodes standing by, is the failover's refusal, decided when the
    host is lost (a fixed-size job moves only where a spare makes it whole)."""
    tcp = config.rdzv.store_type == "tcp"
    return config.rdzv_backend == "c10d" and tcp and config.max_nodes > 1


class RendezvousMove:
    """Moves ``movable`` off a lost host: ``on_host_lost`` for the watch, ``move`` for the
    supervision loop (``last_round``: the loop's last round's addresses by node rank)."""

    def __init__(
        self, config: AgentConfig, signer: StoreSigner, movable: MovableRendezvous
    ) -> None:
        self.movable = movable
        self.watch: NetworkWatch | None = None
        self._last_round: Callable[[], dict[int, str]] = dict
        self._failover = Failover(config, signer, movable, self._follow)

    def attach(self, last_round: Callable[[], dict[int, str]]) -> None:
        """The loop's last round: its members' addresses by node rank."""
        self._last_round = last_round

    def close(self) -> None:
        """End the threads of the move (the beacon of a moved rendezvous, the movable's)."""
        self._failover.close()
        self.movable.close()

    def _follow(self, endpoint: Endpoint, hosting: bool) -> None:
        if self.watch is not None:
            self.watch.follow(endpoint, hosting)

    def on_host_lost(self, what: str) -> str | None:
        """The watch's news: None once the loop was told, else why the node gives up."""
        why_not = self._failover.refusal(self._last_round())
        if why_not is None:
            self.movable.lose(what)
        return why_not

    def move(self, lost: HostLost, last_round: dict[int, str]) -> str:
        """Move the rendezvous; the line that says so (:class:`NoSuccessor` if it cannot)."""
        this_addr = membership.this_node_address(self.movable) or ""
        old = self.movable.endpoint
        try:
            if isinstance(lost, RendezvousMoved):
                self._failover.join(lost.endpoint)
                return f"torchx-elastic: {lost}; this node joins the job there"
            endpoint, hosting = self._failover.move(last_round, this_addr)
        except NoSuccessor as err:
            raise NoSuccessor(
                f"the rendezvous host is lost: {lost}; {err}, so its workers were stopped and"
                " it exits so that the job can be restarted"
            ) from None
        where = "this node hosts it" if hosting else "its host is a node of the last round"
        if endpoint == old:  # one host: a survivor hosts it again where it was
            return (
                f"torchx-elastic: the rendezvous host is lost: {lost}; the rendezvous is hosted"
                f" again at {endpoint} ({where}) and the job re-forms without the lost host"
            )
        return (
            f"torchx-elastic: the rendezvous host is lost: {lost}; the rendezvous moves from"
            f" {old} to {endpoint} ({where}) and the job re-forms without the lost host"
        )


def movable_rendezvous(
    config: AgentConfig, signer: StoreSigner, handler: RendezvousHandler
) -> RendezvousMove | None:
    """The move of ``handler``'s rendezvous, where it can move (:func:`can_move`)."""
    if not can_move(config):
        return None
    return RendezvousMove(config, signer, MovableRendezvous(handler, config.rdzv_endpoint, signer))
