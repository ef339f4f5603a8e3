"""The rendezvous host lost: who succeeds it, how a waiting call returns, the move itself
(two nodes on loopback addresses with real stores; no processes)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousHandler

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig, config_from_args
from torchx_elastic.agent.rendezvous import membership
from torchx_elastic.agent.rendezvous.failover import (
    Failover,
    HostLost,
    MovableRendezvous,
    NoSuccessor,
    successors,
)
from torchx_elastic.agent.rendezvous.handler import StoreHost, hosts_store
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.supervision.network_watch import NetworkWatch
from torchx_elastic.agent.supervision.rendezvous_move import RendezvousMove, can_move

# the nodes call torch's stores from threads of their own: they end with the test
pytestmark = pytest.mark.usefixtures("threads_ended")

LOST = Endpoint("h0", 29500)
# a store call that no answer ends returns after this (a bound on a hang, not a speed)
READ_TIMEOUT_S = 120.0
JOIN_S = 60.0


def config(*argv: str) -> AgentConfig:
    args = ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h0:29500"]
    return config_from_args(build_parser().parse_args([*args, *argv, "train.py"]))


def test_the_successor_is_the_lowest_ranked_member_that_is_not_the_lost_host() -> None:
    members = {2: "h2", 0: "h0.cluster.local", 1: "h1"}
    assert successors(members, LOST, set()) == ["h1", "h2"]
    # a member published by address: matched by what the endpoint resolved to while it was up
    assert successors({0: "127.0.0.1", 1: "h1"}, Endpoint("lost", 1), {"127.0.0.1"}) == ["h1"]


def test_a_move_needs_the_jobs_minimum_of_nodes_among_the_survivors() -> None:
    failover = Failover(config(), StoreSigner(None), MovableRendezvous(Handler(), LOST))
    assert failover.refusal({0: "h0", 1: "h1", 2: "h2"}) is None
    assert failover.refusal({0: "h0", 1: "h1"}) == (
        "the 1 other node(s) of its last round and the 0 standing by are fewer than the"
        " job's minimum of 2"
    )
    with pytest.raises(NoSuccessor, match="fewer than the job's minimum of 2"):
        failover.move({0: "h0", 1: "h1"}, "h1")


def test_an_elastic_c10d_job_between_hosts_or_any_on_one_host_moves_its_rendezvous() -> None:
    assert can_move(config())
    # a fixed-size job too: a spare standing by may make it whole (the refusal decides)
    assert can_move(config("--nnodes", "3"))
    assert not can_move(config("--rdzv-backend", "static", "--node-rank", "0"))
    # one host: whatever its node range (a spare may make a fixed-size job whole again)
    assert can_move(config("--rdzv-endpoint", "localhost:29500"))
    assert can_move(config("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500"))
    assert not can_move(config("--nnodes", "1", "--rdzv-endpoint", "127.0.0.1:29500"))


def test_on_one_host_the_survivors_and_the_nodes_standing_by_make_the_minimum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On loopback every member has the endpoint's address: the lost host is one of the
    last round, and a spare standing by (torch's redundancy list) counts."""
    handler = Handler()
    fixed = config("--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500")
    movable = MovableRendezvous(handler, Endpoint("127.0.0.1", 29500))
    failover = Failover(fixed, StoreSigner(None), movable)
    members = {0: "127.0.0.1", 1: "127.0.0.1"}
    assert failover.refusal(members) == (
        "the 1 other node(s) of its last round and the 0 standing by are fewer than the job's"
        " minimum of 2"
    )
    with pytest.raises(NoSuccessor, match="fewer than the job's minimum of 2"):
        failover.move(members, "127.0.0.1")
    monkeypatch.setattr(membership, "standbys_seen", lambda handler: (1, False))
    assert failover.refusal(members) is None
    # a node that stood by follows only a job whose round it saw
    with pytest.raises(NoSuccessor, match="this node saw no round of the job"):
        failover.move({}, "127.0.0.1")
    # elastic above its minimum: the survivors make it
    elastic = config("--nnodes", "2:3", "--rdzv-endpoint", "127.0.0.1:29500")
    failover = Failover(elastic, StoreSigner(None), MovableRendezvous(Handler(), movable.endpoint))
    assert failover.refusal({0: "127.0.0.1", 1: "127.0.0.1", 2: "127.0.0.1"}) is None


class Handler(RendezvousHandler):
    """A handler whose ``num_nodes_waiting`` waits on ``release`` or raises ``error``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.error: BaseException | None = None
        self.waiting = threading.Event()  # a call is in num_nodes_waiting
        self.answered = False  # and returned (released, or its own read timed out)

    def num_nodes_waiting(self) -> int:
        if self.error is not None:
            raise self.error
        self.waiting.set()
        self.release.wait(READ_TIMEOUT_S)
        self.answered = True
        return 0

    def next_rendezvous(self) -> Any:
        raise NotImplementedError

    def get_backend(self) -> str:
        return "c10d"

    def is_closed(self) -> bool:
        if self.error is not None:
            raise self.error
        return False

    def set_closed(self) -> None:
        pass

    def get_run_id(self) -> str:
        return "job"

    def shutdown(self) -> bool:
        return True


def test_a_call_waiting_on_the_lost_host_returns_when_the_loss_is_known() -> None:
    handler = Handler()
    movable = MovableRendezvous(handler, LOST)

    def lose_while_the_call_waits() -> None:
        if handler.waiting.wait(JOIN_S):
            movable.lose("h0:29500 did not answer for 20s")

    threading.Thread(target=lose_while_the_call_waits, daemon=True).start()
    with pytest.raises(HostLost, match="h0:29500 did not answer for 20s"):
        movable.num_nodes_waiting()
    assert not handler.answered  # the loss ended the call, not the store's read timeout
    with pytest.raises(HostLost):  # every later call too, until it moves
        movable.num_nodes_waiting()
    assert movable.shutdown() is False  # nothing to close on a lost host
    handler.release.set()
    moved = Handler()
    moved.release.set()
    movable.move_to(moved, Endpoint("h1", 29500))
    assert movable.num_nodes_waiting() == 0 and movable.endpoint == Endpoint("h1", 29500)
    movable.close()


def test_a_failed_store_connection_is_a_lost_host() -> None:
    """A host that ends the job on purpose leaves last (closing.py): its store goes away
    under a running peer only when its agent died. The supervision loop's check that the
    store still answers (its workers failed with a peer: the host's loss, not the script's
    failure, when the store is gone) says so too."""
    handler = Handler()
    handler.error = RendezvousConnectionError("The connection to the C10d store has failed.")
    movable = MovableRendezvous(handler, LOST)
    for call in (movable.num_nodes_waiting, movable.is_closed):
        with pytest.raises(
            HostLost, match=r"^the connection to the rendezvous store at h0:29500 failed$"
        ):
            call()
    movable.close()


def test_the_node_that_hosts_the_store_never_loses_it() -> None:
    handler = Handler()
    handler.error = RendezvousConnectionError("gone")
    movable = MovableRendezvous(StoreHost(handler), LOST)
    assert hosts_store(movable) and not movable.armed
    movable.lose("silent")
    assert not movable.lost
    with pytest.raises(RendezvousConnectionError):
        movable.num_nodes_waiting()
    movable.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_survivors_meet_at_the_successor_and_form_a_round_there() -> None:
    port = free_port()
    members = {0: "lost.invalid", 1: "127.0.0.1", 2: "127.0.0.2"}
    moved: dict[str, Any] = {}
    failovers: list[Failover] = []
    movables = {
        addr: MovableRendezvous(Handler(), Endpoint("lost.invalid", port))
        for addr in ("127.0.0.1", "127.0.0.2")
    }

    def node(addr: str) -> None:
        followed: list[tuple[Endpoint, bool]] = []
        failover = Failover(
            config("--local-addr", addr, "--rdzv-endpoint", f"lost.invalid:{port}"),
            StoreSigner(None),
            movables[addr],
            lambda endpoint, hosting: followed.append((endpoint, hosting)),
        )
        failovers.append(failover)
        moved[addr] = (failover.move(members, addr), followed)
        moved[addr + " round"] = movables[addr].next_rendezvous()

    threads = [threading.Thread(target=node, args=(a,)) for a in ("127.0.0.2", "127.0.0.1")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    successor = Endpoint("127.0.0.1", port)
    assert moved["127.0.0.1"] == ((successor, True), [(successor, True)])
    assert moved["127.0.0.2"] == ((successor, False), [(successor, False)])
    assert hosts_store(movables["127.0.0.1"]) and not hosts_store(movables["127.0.0.2"])
    ranks = sorted(moved[f"{a} round"].rank for a in ("127.0.0.1", "127.0.0.2"))
    assert ranks == [0, 1] and moved["127.0.0.1 round"].world_size == 2
    for ended in (*failovers, *movables.values()):  # the new host's beacon, the round's calls
        ended.close()


def test_on_one_host_a_survivor_hosts_once_the_lost_hosts_port_is_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lost host's port may stay taken for a moment after it died (its process' teardown,
    a connection given that port as its own): a survivor that finds it taken and no store
    answering there tries again, and hosts the rendezvous once the port is free, within
    CANDIDATE_WAIT_S (CI: it tried once, connected to nothing for 30 s, and the job ended
    with a spare standing by)."""
    port = free_port()
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", port))
    taken.listen()  # accepts connections, answers none: no store
    freed = threading.Timer(2.0, taken.close)
    freed.start()
    monkeypatch.setattr(membership, "standbys_seen", lambda handler: (1, False))
    endpoint = Endpoint("127.0.0.1", port)
    movable = MovableRendezvous(Handler(), endpoint)
    fixed = config("--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}")
    failover = Failover(fixed, StoreSigner(None), movable)
    try:
        assert failover.move({0: "127.0.0.1", 1: "127.0.0.1"}, "127.0.0.1") == (endpoint, True)
        assert hosts_store(movable)
    finally:
        freed.join()
        failover.close()
        movable.close()


def test_the_watch_hands_a_lost_host_to_the_move_or_gives_up_with_the_reason() -> None:
    given_up: list[str] = []
    watch = NetworkWatch(LOST, False, list, 20.0, given_up.append)
    assert watch.host_lost_message("the 1 other node(s) of its last round are fewer") == (
        "the rendezvous host is lost: h0:29500 did not answer for 20s, though other peers of"
        " this node did; the 1 other node(s) of its last round are fewer, so its workers were"
        " stopped and it exits so that the job can be restarted"
    )
    move = RendezvousMove(config(), StoreSigner(None), MovableRendezvous(Handler(), LOST))
    move.attach(lambda: {0: "h0", 1: "h1", 2: "h2"})
    assert move.on_host_lost(watch.host_silence()) is None
    assert move.movable.lost
    move.attach(lambda: {0: "h0", 1: "h1"})
    assert move.on_host_lost(watch.host_silence()) == (
        "the 1 other node(s) of its last round and the 0 standing by are fewer than the"
        " job's minimum of 2"
    )


def test_a_node_waiting_at_the_original_endpoint_learns_where_the_job_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lost host came back and hosts the original endpoint again: the new host's beacon
    writes where the rendezvous went into its store, and its waiting round gives way."""
    from torchx_elastic.agent.rendezvous import failover
    from torchx_elastic.agent.rendezvous.failover import Beacon, RendezvousMoved
    from torchx_elastic.agent.rendezvous.listen import hosted_store

    monkeypatch.setattr(failover, "BEACON_INTERVAL_S", 0.2)
    monkeypatch.setattr(failover, "MOVED_CHECK_S", 0.2)
    store = hosted_store("127.0.0.1", 0, 10, True)  # port 0: a free one, held from here on
    port = int(store.port)  # type: ignore[attr-defined]
    original = Endpoint("127.0.0.1", port)
    handler = Handler()
    monkeypatch.setattr(membership, "handler_store", lambda h: store)

    def round_when_released() -> bool:  # the move's answer comes first, or none does
        return handler.release.wait(READ_TIMEOUT_S)

    handler.next_rendezvous = round_when_released  # type: ignore[method-assign]
    secret = StoreSigner(b"s" * 32)
    movable = MovableRendezvous(StoreHost(handler), original, secret)
    beacon = Beacon(original, Endpoint("h1", 29500), secret, "job")
    beacon.start()
    with pytest.raises(RendezvousMoved) as moved:
        movable.next_rendezvous()
    beacon.close()
    beacon.join(JOIN_S)
    assert not beacon.is_alive()
    assert moved.value.endpoint == Endpoint("h1", 29500)
    assert str(moved.value) == (
        f"the job's rendezvous moved from 127.0.0.1:{port} to h1:29500 while its host was lost"
    )
    handler.release.set()
    movable.close()  # its moved-watch ends


def test_a_move_the_survivors_cannot_make_ends_the_node_with_the_loss_and_the_reason() -> None:
    move = RendezvousMove(config(), StoreSigner(None), MovableRendezvous(Handler(), LOST))
    with pytest.raises(NoSuccessor) as refused:
        move.move(HostLost("h0:29500 did not answer for 20s"), {0: "h0", 1: "h1"})
    assert str(refused.value) == (
        "the rendezvous host is lost: h0:29500 did not answer for 20s; the 1 other node(s) of"
        " its last round and the 0 standing by are fewer than the job's minimum of 2, so its"
        " workers were stopped and it exits so that the job can be restarted"
    )
