"""The stack of rendezvous layers (rendezvous/handler.py's docstring): each forwards torch's
public ``RendezvousHandler`` interface and the stack's own questions, nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousHandler

from tests.agent.test_waiting_units import config
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.rendezvous import membership
from torchx_elastic.agent.rendezvous.failover import MovableRendezvous
from torchx_elastic.agent.rendezvous.handler import StoreHost, hosts_store
from torchx_elastic.agent.rendezvous.observed import ObservedRendezvous
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry, RollCall
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.waiting import ExplainedRendezvous
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous

ENDPOINT = Endpoint("n0", 29500)


@dataclass(frozen=True)
class Node:  # torch's _NodeDesc, as compat reads it
    addr: str
    pid: int


class TorchHandler(RendezvousHandler):
    """torch's c10d handler as the agent reads it: its public interface, and the private
    state only ``agent/compat.py`` reads."""

    def __init__(self) -> None:
        self._this_node = Node("n0", 5)
        state = SimpleNamespace(participants={self._this_node: 0}, wait_list=())
        self._state_holder = SimpleNamespace(state=state)
        self.shut_down = False

    def next_rendezvous(self) -> Any:
        raise NotImplementedError

    def get_backend(self) -> str:
        return "c10d"

    @property
    def use_agent_store(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 2

    def get_run_id(self) -> str:
        return "job"

    def shutdown(self) -> bool:
        self.shut_down = True
        return True


def explained(bottom: RendezvousHandler) -> ExplainedRendezvous:
    me = NodeEntry("n0", 5, "job", "n0", "2", 1, 0, "c10d")
    call = RollCall(HashStore(), me, StoreSigner(None))
    return ExplainedRendezvous(bottom, call, config("2"), True, 600)


def test_the_stack_forwards_torchs_interface_and_nothing_private() -> None:
    bottom = TorchHandler()
    movable = MovableRendezvous(StoreHost(explained(bottom)), ENDPOINT)
    top = ObservedRendezvous(movable, lambda store, rank, nodes: None)
    try:
        assert (top.get_backend(), top.get_run_id(), top.use_agent_store) == ("c10d", "job", True)
        assert (top.is_closed(), top.num_nodes_waiting()) == (False, 2)
        assert top.torch_handler() is bottom
        assert hosts_store(top) and not movable.armed  # StoreHost, however wrapped since
        assert not hasattr(top, "shut_down")  # nothing of the bottom forwarded
        # torch's handler tells nobody's membership through its public interface
        assert membership.round_members(top) == {} and membership.this_node_address(top) is None
        assert top.shutdown() and bottom.shut_down
    finally:
        movable.close()
    assert not hosts_store(ObservedRendezvous(explained(bottom), lambda *_: None))
    assert not hosts_store(bottom)


class Abandoned(WrappedRendezvous):
    def __init__(self, handler: RendezvousHandler) -> None:
        super().__init__(handler)
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True


def test_a_moved_rendezvous_abandons_the_layers_it_leaves() -> None:
    """The first round still waiting at the lost host's rendezvous (waiting.py) stops,
    through the layers above it."""
    left = Abandoned(TorchHandler())
    movable = MovableRendezvous(StoreHost(left), ENDPOINT)
    try:
        movable.move_to(TorchHandler(), Endpoint("n1", 29500))
        assert left.abandoned and not hosts_store(movable)
        assert movable.torch_handler() is movable.handler
    finally:
        movable.close()
