"""A node of the last round that comes back takes its place before a spare does.

torch's c10d rendezvous keeps the nodes that come once the job has its maximum of nodes in
its redundancy list (spares: ``dist.ddp --spares``); when a round re-forms, every waiting
node races for the places. The rule on top, on every node (:class:`ReturningFirst`):

- a node that was not a member of the last complete round (a spare, or a node new to the
  job) holds back from the round while nodes *back from* that round wait for a place (their
  address was in it: the survivors, or a lost node whose agent came back) and the free
  places are no more than they are;
- it holds for at most ``RETURN_WINDOW_S`` (keeping its heartbeat), then races as torch
  would: a node that is stuck does not keep the job small;
- a lost node that is not back costs nothing: the spare takes its place at once.

A node is known by the address it published (``--local-addr``, else its host name): nodes
that share one (several on one host) cannot be told apart, and the rule then only delays
the race by the window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous.diagnosis import say

RETURN_WINDOW_S = 5.0


def held_line(back: list[str], window_s: float) -> str:
    """``standing by: h1 (agent pid 7) of the last round is back and takes its place ...``"""
    one = len(back) == 1
    return (
        f"standing by: {', '.join(back)} of the last round {'is' if one else 'are'} back and"
        f" take{'s its place' if one else ' their places'} before this node, which was not in"
        f" it (it waits up to {window_s:g}s)"
    )


class ReturningFirst:
    """The hold of :func:`compat.hold_joins`: True while this node should leave the places
    of the re-forming round to the nodes back from the last one."""

    def __init__(
        self,
        window_s: float = RETURN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        tell: Callable[[str], None] = say,
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._tell = tell
        # the members of the last complete round seen: a complete round only loses members
        # (a dead node dropped, a node leaving to join again) until the next one opens
        self._last_round = -1
        self._last_members: frozenset[object] = frozenset()
        self._since: tuple[int, float] | None = None  # (round, clock) of the first hold
        # what was said, for which last round: a round that opens again while the same nodes
        # are back opens a new window, and says nothing new
        self._told: tuple[int, list[str]] | None = None

    def __call__(self, view: compat.JoinView) -> bool:
        if view.complete and view.participants:
            if view.round != self._last_round:
                self._last_round, self._last_members = view.round, frozenset()
            self._last_members |= view.participants
        if not view.joining or view.node in self._last_members:
            return False
        addresses = {compat.node_address(m) for m in self._last_members}
        back = sorted(
            (
                n
                for n in view.waiting - view.participants - {view.node}
                if compat.node_address(n) in addresses
            ),
            key=compat.node_name,
        )
        if not back or view.max_nodes - len(view.participants) > len(back):
            return False
        now = self._clock()
        if self._since is None or self._since[0] != view.round:
            self._since = (view.round, now)
            names = [compat.node_name(n) for n in back]
            if self._told != (self._last_round, names):
                self._told = (self._last_round, names)
                self._tell(held_line(names, self._window_s))
        return now - self._since[1] < self._window_s


def install(handler: RendezvousHandler) -> ReturningFirst | None:
    """The rule on ``handler``'s joins; None where this torch has no redundancy list."""
    rule = ReturningFirst()
    return rule if compat.hold_joins(handler, rule) else None
