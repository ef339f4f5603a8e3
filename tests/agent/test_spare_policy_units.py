"""The standby policy's parts: a node back from the last round takes its place before a spare
(rendezvous/returning_first.py), and which node took the place of which is said once
(supervision/replacements.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous.returning_first import ReturningFirst
from torchx_elastic.agent.supervision.replacements import replaced_line, replacements, teller


@dataclass(frozen=True)
class Node:  # torch's node descriptor, as far as the policy reads it
    addr: str
    pid: int


HOST, LOST = Node("h0", 1), Node("h1", 2)
BACK, SPARE = Node("h1", 9), Node("h2", 3)


def view(
    node: Node,
    participants: set[Node],
    waiting: set[Node],
    complete: bool = False,
    round: int = 2,
    max_nodes: int = 2,
    joining: bool = True,
) -> compat.JoinView:
    return compat.JoinView(
        node, frozenset(participants), frozenset(waiting), complete, round, max_nodes, joining
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rule_after_a_round(node: Node) -> tuple[ReturningFirst, list[str], Clock]:
    told: list[str] = []
    clock = Clock()
    rule = ReturningFirst(window_s=5.0, clock=clock, tell=told.append)
    # the last complete round, as this node (standing by) saw it
    assert not rule(view(node, {HOST, LOST}, {node}, complete=True, round=1, joining=False))
    return rule, told, clock


def test_a_spare_holds_while_a_node_of_the_last_round_is_back_then_races() -> None:
    rule, told, clock = rule_after_a_round(SPARE)
    assert rule(view(SPARE, {HOST}, {BACK, SPARE}))
    assert told == [
        "standing by: h1 (agent pid 9) of the last round is back and takes its place before"
        " this node, which was not in it (it waits up to 5s)"
    ]
    clock.now += 4.9
    assert rule(view(SPARE, {HOST}, {BACK, SPARE}))
    clock.now += 0.2  # the window is over: a node that is stuck does not keep the job small
    assert not rule(view(SPARE, {HOST}, {BACK, SPARE}))
    assert len(told) == 1


def test_the_last_round_is_remembered_whole_while_its_dead_members_are_dropped() -> None:
    rule, told, _ = rule_after_a_round(SPARE)
    # torch drops the lost node from the complete round (its heartbeats stopped)
    assert not rule(view(SPARE, {HOST}, {BACK, SPARE}, complete=True, round=1, joining=False))
    assert rule(view(SPARE, {HOST}, {BACK, SPARE}, complete=True, round=1))
    assert told[0].startswith("standing by: h1 (agent pid 9) of the last round is back")


def test_a_lost_node_that_is_not_back_costs_the_spare_nothing() -> None:
    rule, told, _ = rule_after_a_round(SPARE)
    assert not rule(view(SPARE, {HOST}, {SPARE}))
    assert not rule(view(SPARE, set(), {SPARE}))
    assert told == []


def test_survivors_waiting_for_the_round_count_as_back() -> None:
    rule, told, _ = rule_after_a_round(SPARE)
    assert rule(view(SPARE, set(), {HOST, BACK, SPARE}))
    assert told[0].startswith(
        "standing by: h0 (agent pid 1), h1 (agent pid 9) of the last round are"
    )
    assert "take their places before this node" in told[0]


def test_a_spare_joins_where_places_are_left_after_those_back() -> None:
    rule, _, _ = rule_after_a_round(SPARE)
    assert not rule(view(SPARE, {HOST}, {BACK, SPARE}, max_nodes=3))


def test_the_back_node_and_the_last_rounds_members_never_hold() -> None:
    rule, _, _ = rule_after_a_round(BACK)
    assert not rule(view(BACK, {HOST}, {BACK, SPARE}))  # the spare's address was not in it
    member, _, _ = rule_after_a_round(HOST)
    assert not member(view(HOST, set(), {HOST, BACK, SPARE}))


def test_only_moves_into_a_round_are_held() -> None:
    rule, told, _ = rule_after_a_round(SPARE)
    assert not rule(view(SPARE, {HOST}, {BACK, SPARE}, joining=False))
    assert told == []


def test_a_new_round_opens_a_new_window_and_says_only_what_is_new() -> None:
    rule, told, clock = rule_after_a_round(SPARE)
    assert rule(view(SPARE, {HOST}, {BACK, SPARE}))
    clock.now += 6
    assert rule(view(SPARE, {HOST}, {BACK, SPARE}, round=3))
    assert len(told) == 1  # the same node back: the same line, said once (CI saw it twice)
    assert rule(view(SPARE, set(), {HOST, BACK, SPARE}, round=4))
    assert len(told) == 2 and told[1].startswith("standing by: h0 (agent pid 1), h1 (agent")
    # after a complete round, the same node back again is a new loss: said again
    assert not rule(view(SPARE, {HOST, BACK}, {SPARE}, complete=True, round=4, joining=False))
    assert rule(view(SPARE, {HOST}, {BACK, SPARE}, round=5))
    assert len(told) == 3


def name(node: Node) -> str:
    return f"{node.addr} (agent pid {node.pid})"


def test_a_spare_in_a_lost_nodes_place_is_said_by_the_first_node_that_stayed() -> None:
    before = {0: name(HOST), 1: name(LOST)}
    after = {0: name(SPARE), 1: name(HOST)}
    pairs = replacements(before, after)
    assert teller(before, after) == 1
    assert replaced_line(2, pairs, 2) == (
        "torchx-elastic: round 2: h2 (agent pid 3) takes the place of h1 (agent pid 2), lost;"
        " the job is back at 2 nodes"
    )
    assert [p.facts() for p in pairs] == [
        {"lost": "h1 (agent pid 2)", "by": "h2 (agent pid 3)", "back": False}
    ]


def test_a_node_back_at_a_lost_nodes_address_pairs_with_it_first() -> None:
    before = {0: name(HOST), 1: name(LOST), 2: "h3 (agent pid 4)"}
    after = {0: name(HOST), 1: name(SPARE), 2: name(BACK)}
    pairs = replacements(before, after)
    assert [(p.lost, p.by, p.back) for p in pairs] == [
        ("h1 (agent pid 2)", "h1 (agent pid 9)", True),
        ("h3 (agent pid 4)", "h2 (agent pid 3)", False),
    ]
    assert replaced_line(3, pairs[:1], 3) == (
        "torchx-elastic: round 3: h1 (agent pid 9), back, takes the place of h1 (agent pid 2),"
        " lost, before any spare; the job is back at 3 nodes"
    )


def test_rounds_that_only_grow_or_shrink_replace_nobody() -> None:
    assert replacements({0: name(HOST)}, {0: name(HOST), 1: name(SPARE)}) == []
    assert replacements({0: name(HOST), 1: name(LOST)}, {0: name(HOST)}) == []
    assert teller({}, {0: name(SPARE)}) is None  # a spare's first round: it says nothing


def test_a_held_join_waits_on_torchs_own_rendezvous_then_completes() -> None:
    """compat.hold_joins on torch's dynamic rendezvous (an in-memory store): the hold sees the
    join's moves, keeps the node out while it says so, and the round completes after."""
    from torch.distributed import HashStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    store = HashStore()
    params = RendezvousParameters("c10d", "localhost:0", "held", 1, 1, local_addr="127.0.0.1")
    handler = dynamic_rendezvous.create_handler(store, C10dRendezvousBackend(store, "held"), params)
    seen: list[compat.JoinView] = []

    def hold(view: compat.JoinView) -> bool:
        seen.append(view)
        return sum(v.joining for v in seen) <= 2  # the first two moves held back

    assert compat.hold_joins(handler, hold)
    info = handler.next_rendezvous()
    assert info.world_size == 1
    joins = [v for v in seen if v.joining]
    assert len(joins) == 3 and all(not v.participants for v in joins)
    assert compat.node_address(joins[0].node) == "127.0.0.1" and joins[0].max_nodes == 1
    assert seen[-1].complete and seen[-1].node in seen[-1].participants
    handler.shutdown()


def test_a_failing_hold_leaves_torchs_choice_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torch.distributed import HashStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    store = HashStore()
    params = RendezvousParameters("c10d", "localhost:0", "bad", 1, 1, local_addr="127.0.0.1")
    handler = dynamic_rendezvous.create_handler(store, C10dRendezvousBackend(store, "bad"), params)

    def hold(view: compat.JoinView) -> bool:
        raise RuntimeError("a bug in the policy")

    assert compat.hold_joins(handler, hold)
    with caplog.at_level("ERROR"):
        assert handler.next_rendezvous().world_size == 1
    assert "the rendezvous join's hold failed: torch's own choice stands" in caplog.text
    handler.shutdown()
