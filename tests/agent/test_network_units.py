"""What a node says when it lost the network or the rendezvous host, and how it probes."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from tests.waiting import wait_until
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.rendezvous.liveness import SilentPeers, lost_peer_line
from torchx_elastic.agent.supervision import network_watch
from torchx_elastic.agent.supervision.network_watch import NetworkWatch, answers, name_is_gone

ENDPOINT = Endpoint("h0", 29500)


def watch(endpoint_is_local: bool) -> NetworkWatch:
    return NetworkWatch(ENDPOINT, endpoint_is_local, list, 20.0, print)


def test_cut_off_node_names_the_rendezvous_and_its_peers() -> None:
    assert watch(False).message(["h0", "h1"], 20, 21) == (
        "this node is cut off: neither the rendezvous at h0:29500 nor its peers (h0, h1)"
        " answered for 20s; its workers were stopped and it exits so that it can be replaced"
    )


def test_cut_off_rendezvous_host_names_its_peers() -> None:
    assert watch(True).message(["h1", "h2"], 0, 20) == (
        "this node is cut off: none of its peers (h1, h2) answered for 20s; its workers were"
        " stopped and it exits so that it can be replaced"
    )


def test_lost_rendezvous_host_while_peers_answer() -> None:
    assert watch(False).message(["h0", "h2"], 20, 0) == (
        "the rendezvous host is lost: h0:29500 did not answer for 20s, though other peers of"
        " this node did; the agent does not move the rendezvous to another node"
        " (docs/agent.md), so its workers were stopped and it exits so that the job can be"
        " restarted"
    )


def test_nothing_lost_before_the_limit() -> None:
    assert watch(False).message(["h0", "h1"], 19, 19) is None
    assert watch(True).message(["h1"], 100, 19) is None  # a local endpoint proves nothing


def test_a_refused_connection_answers_and_a_silent_address_does_not() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        assert answers("127.0.0.1", port)
        sock.listen()
        assert answers("127.0.0.1", port)
    assert not answers("no-such-host.invalid", 9)  # no longer resolves (a deleted pod's name)


def test_a_name_the_name_service_says_is_gone_is_an_answer_and_a_timeout_is_not(
    monkeypatch: Any,
) -> None:
    """A deleted pod's name leaves its headless Service: the DNS server's answer proves the
    network works (the rendezvous host waits for a replacement instead of giving up as cut
    off); a resolver that times out (EAI_AGAIN) proves nothing."""
    errors = {"gone": socket.EAI_NONAME, "cut": socket.EAI_AGAIN}

    def resolve(host: str, *_: Any, **__: Any) -> Any:
        raise socket.gaierror(errors[host], "resolver")

    monkeypatch.setattr(network_watch.socket, "getaddrinfo", resolve)
    assert name_is_gone("gone")
    assert not name_is_gone("cut")


def test_the_rendezvous_host_whose_only_peer_was_deleted_is_not_cut_off(
    monkeypatch: Any,
) -> None:
    """kubectl delete pod: the peer's name is gone at once, its replacement takes longer
    than the 20 s limit to start; the rendezvous host keeps waiting for it."""
    monkeypatch.setattr(network_watch, "answers", lambda *_: False)
    monkeypatch.setattr(network_watch, "name_is_gone", lambda host: host == "h1")
    lost = NetworkWatch(ENDPOINT, True, lambda: ["h1"], 20.0, print)
    assert lost._a_peer_answers(["h1"])
    assert not lost._a_peer_answers(["h2"])


@dataclass(frozen=True)
class Node:  # torch's _NodeDesc: what the agent reads of it
    addr: str
    pid: int


def handler(participants: dict[str, int], beats: dict[str, float], naive: bool = False) -> Any:
    """A stand-in of torch's c10d handler state: names, heartbeat ages in seconds (``naive``:
    torch before 2.5 keeps ``datetime.utcnow()`` times)."""
    now = datetime.now(timezone.utc)
    if naive:
        now = now.replace(tzinfo=None)
    nodes = {name: Node(addr=name, pid=1) for name in {*participants, *beats}}
    state = SimpleNamespace(
        participants={nodes[n]: rank for n, rank in participants.items()},
        wait_list=set(),
        last_heartbeats={nodes[n]: now - timedelta(seconds=age) for n, age in beats.items()},
    )
    return SimpleNamespace(_state_holder=SimpleNamespace(state=state), _this_node=nodes["h0"])


MEMBERS = {0: "h0 (agent pid 1)", 1: "h1 (agent pid 1)", 2: "h2 (agent pid 1)"}


def test_a_member_that_left_for_the_next_round_is_not_lost() -> None:
    peers = SilentPeers()
    peers.new_round(handler({"h0": 0, "h1": 1, "h2": 2}, {"h0": 0, "h1": 1, "h2": 1}))
    gone = handler({"h0": 0, "h2": 2}, {"h0": 0, "h2": 1})  # h1 between leaving and joining
    assert peers.lost(MEMBERS, gone) == {}
    assert not peers.suspects(MEMBERS, gone)


def test_lost_peer_line() -> None:
    assert lost_peer_line({2: "h2 (agent pid 7)"}, 10.0) == (
        "torchx-elastic: node 2: h2 (agent pid 7) stopped answering (no rendezvous heartbeat"
        " for 10s): stopping the workers and re-forming without it"
    )
    assert "heartbeat for 5s" in lost_peer_line({2: "h2"}, 5.0)
    # with the keyed liveness, a node whose agent said it stopped (a deleted pod)
    assert lost_peer_line({1: "h1", 2: "h2"}, 10.0, stopped={2}) == (
        "torchx-elastic: node 1: h1 stopped answering (no rendezvous heartbeat for 10s) and"
        " node 2: h2 left the job (its agent was stopped): stopping the workers and re-forming"
        " without it"
    )


def test_a_node_that_joins_is_heard_from_while_its_round_forms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A late node appears among the peers and is silent until its round completes (its
    heartbeats start then; a network policy may drop probes of its port): the node
    hosting the rendezvous must not call itself cut off meanwhile."""
    monkeypatch.setattr(network_watch, "PROBE_INTERVAL_S", 0.05)
    monkeypatch.setattr(network_watch, "answers", lambda *_: False)  # it answers no probe
    monkeypatch.setattr(network_watch, "name_is_gone", lambda host: False)
    calls: list[str] = []
    probes = [0]

    def peers() -> list[str]:  # no round for two probes, then the late node is a peer
        probes[0] += 1
        return ["late-node"] if probes[0] > 2 else []

    watch_ = NetworkWatch(Endpoint("late-node", 29500), True, peers, 0.1, calls.append)
    watch_.start()
    # the late node silent for many times lost_after_s, each probe of it decided: a probe
    # asks for the peers only once the one before it ended (or gave up)
    wait_until(lambda: probes[0] >= 12 or calls, what="ten probes of the silent late node")
    watch_.close()
    assert calls == []


def test_the_rendezvous_port_is_not_probed_while_the_store_answers_the_nodes_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every node probing the store's port each second would load its one accepting thread
    with the job's size: while the agent's rendezvous calls reach the store, only the peers'
    hosts are probed, and the node is not cut off though no probe of the endpoint answers."""
    monkeypatch.setattr(network_watch, "PROBE_INTERVAL_S", 0.02)
    probed: list[str] = []

    def answers(host: str, port: int, timeout_s: float) -> bool:
        probed.append(host)
        return host != "h0"

    monkeypatch.setattr(network_watch, "answers", answers)
    store_age_s: list[float | None] = [0.5]
    calls: list[str] = []
    watch_ = NetworkWatch(
        ENDPOINT,
        False,
        lambda: ["h1"],
        0.1,
        calls.append,
        store_answer_age_s=lambda: store_age_s[0],
    )
    watch_.start()
    try:
        wait_until(lambda: probed.count("h1") >= 15, what="15 probes of the peer")
        assert "h0" not in probed and calls == []
        store_age_s[0] = None  # unknown (or too old): the endpoint is probed, and is silent
        wait_until(lambda: calls, what="the lost rendezvous host")
    finally:
        watch_.close()
    assert "h0" in probed
    assert calls == [watch_.host_lost_message(network_watch.NO_MOVE)]
