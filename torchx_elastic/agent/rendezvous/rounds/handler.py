"""The agent's own rendezvous: torch's ``RendezvousHandler`` interface over a torch ``Store``.

One state machine, written for what the agent does, on torch's public interface only
(``RendezvousHandler``, ``RendezvousInfo``, the ``Store`` calls); torch's
``dynamic_rendezvous.py`` is the reference for behaviour. The state is small keys per round
(keys.py); a node's cost per round does not grow with the job's size:

- **join** (:meth:`RoundsRendezvous.next_rendezvous`): a node takes an arrival slot of the
  open round (one ``add``) and writes its node there (one ``set``); a member of the
  complete round that calls again (a restart, a membership change) first opens the next
  round (one compare-and-set of the round counter). A node that finds the round complete
  without it waits in the next one: the members learn of it through
  :meth:`~RoundsRendezvous.num_nodes_waiting` while the job is below its maximum, and it
  stands by as a spare while the job is at it.
- **complete**: the first arrival decides (outcome.py), or, where it is gone, any arrival
  once the last call passed twice; one compare-and-set of the outcome decides which.
- **a node said dead** (:meth:`~RoundsRendezvous.drop`, by the keyed liveness): it is never
  admitted again, and a complete round it was a member of is left for the next one at once
  (the members see :meth:`~RoundsRendezvous.num_nodes_waiting` > 0 and re-form without a
  last call, since the others come back at once).
- **close**: one key; a waiting node ends with torch's closed-rendezvous error.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

from torch.distributed import PrefixStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeoutError,
)

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous.rounds import outcome
from torchx_elastic.agent.rendezvous.rounds.keys import Keys, Node
from torchx_elastic.agent.rendezvous.signed_store import SignedStore

log = logging.getLogger(__name__)

# a waiting node looks at its round this often: a tenth of a second, and a millisecond more
# per node the job may have (a second at 900 nodes and up), so that the store answers the
# same number of looks a second whatever the job's size
POLL_S = 0.1
POLL_PER_NODE_S = 0.001
MAX_POLL_S = 1.0
OPENED = "opened"
TAKE_OVER_CALLS = 2  # last calls (plus a second) after which the next arrival decides
TAKE_OVER_SLOTS = 3  # slot s decides after s take-over times (the slots past 3: after 3)
BACKEND = "c10d"  # torchrun's name of the rendezvous this replaces (the workers see it)


class RoundsClosedError(RendezvousClosedError):
    """The rendezvous was closed while this node waited; ``standing_by``: as a spare."""

    def __init__(self, message: str, standing_by: bool) -> None:
        super().__init__(message)
        self.standing_by = standing_by


class _Reached:
    """A signed store whose failures are torch's ``RendezvousConnectionError``, as torch's
    c10d backend raises them (the failover moves the rendezvous on it, failover.py)."""

    def __init__(self, signed: SignedStore) -> None:
        self._signed = signed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        call = getattr(self._signed, name)

        def reached(*args: Any) -> Any:
            try:
                return call(*args)
            except RefusedEntry as err:  # not the job's (another secret, an outsider)
                raise RendezvousStateError(
                    f"The rendezvous state is not signed with this job's secret: {err}"
                ) from err
            except (RuntimeError, ValueError, TimeoutError, OSError) as err:
                raise RendezvousConnectionError(
                    f"The connection to the rendezvous store has failed: {err}"
                ) from err

        return reached


class _RoundLeft(Exception):
    """The round this node waited in moved on before it completed (join the current one)."""


class RoundsRendezvous(RendezvousHandler):
    """See the module's docstring. ``store``: the rendezvous store (a client or the host's
    own); ``signer``'s secret signs every value a node acts on; ``addr``: the address this
    node publishes; ``last_call_s``: how long a first round with its minimum waits for more
    nodes; ``join_timeout_s``: how long one ``next_rendezvous`` may wait."""

    def __init__(
        self,
        store: Any,
        signed: SignedStore,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        addr: str,
        last_call_s: float,
        join_timeout_s: float,
        use_agent_store: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._signed: Any = _Reached(signed)
        self._run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.last_call_s = last_call_s
        self.reform_last_call_s = last_call_s
        self.join_timeout_s = join_timeout_s
        self._poll_s = min(MAX_POLL_S, POLL_S + POLL_PER_NODE_S * max_nodes)
        self._use_agent_store = use_agent_store
        self._clock = clock
        self.keys = Keys(run_id)
        # a random number per handler: a replacement container (the lost node's host name,
        # its agent's pid) is not taken for the node it replaces
        self.node = Node(addr, os.getpid(), secrets.randbelow(2**31))
        self._lock = threading.Lock()
        self.round: int | None = None  # the last round this node is a member of
        self.rank: int | None = None
        self.world_size = 0
        self._members: dict[int, Node] | None = None  # read on demand
        self._waiting_in: int | None = None  # the round this node waits in, if it waits
        self._known_round = 0  # the last round known to be opened (round 0 always is)
        self._standbys_seen = (0, False)
        self._last_waited: int | None = None  # the last round this node waited in
        self._decider = 0  # the deciding slot of this node's last round (its members' keys)
        self._arrivals_seen: dict[int, list[Node | None]] = {}  # round -> its slots, as read
        self._dropped: set[str] = set()  # the nodes said dead, as read so far
        self._dropped_read = 0  # how far this node read their index
        self._seen_members: dict[int, Node] = {}  # a waiting node's view of the job
        self._what = f"the rendezvous state of run {run_id!r}"
        self._answered_s: float | None = None  # when the store last answered this node
        # on a store the job moved to: the ids of the last round's members that survived,
        # and how many they are (its first round is a re-form: continue_from)
        self._survivors: tuple[frozenset[str], int] | None = None

    # -- torch's RendezvousHandler interface -----------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return self._use_agent_store

    def get_run_id(self) -> str:
        return self._run_id

    def is_closed(self) -> bool:
        return self._value(self.keys.closed) is not None

    def set_closed(self) -> None:
        self._signed.set(self.keys.closed, "closed")

    def shutdown(self) -> bool:
        """Close the rendezvous (as torch's handler does at the end of a job)."""
        try:
            self.set_closed()
            return True
        except RendezvousError as err:  # its store is gone: nothing to close
            log.debug("cannot close the rendezvous: %s", err)
            return False

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join a round after this node's: while the job is below its
        maximum, the nodes that came since; at least 1 where the job moved to a later round
        (a node was said dead, a member restarts): the members re-form."""
        rnd = self.round
        if rnd is None or self.is_closed():
            return 0
        if self._current_round() > rnd:
            return 1
        waiting = self._counter(self.keys.count(rnd + 1))
        standing_by = waiting if self.world_size >= self.max_nodes else 0
        self._standbys_seen = (standing_by, False)
        return waiting - standing_by

    def next_rendezvous(self) -> RendezvousInfo:
        deadline_s = self._clock() + self.join_timeout_s
        while True:
            rnd, rank, world = self._join(deadline_s)
            with self._lock:
                last = self.node
                self.node = Node(last.addr, last.pid, last.local_id, rnd, rank)
                self.round, self.rank, self.world_size = rnd, rank, world
                self._members = None
            master = self._master(rnd, rank, deadline_s)
            if master is not None:
                break
            log.debug("round %d moved on before its rank 0 said where to meet: joining again", rnd)
        store = PrefixStore(self.keys.store_prefix(self._run_id, rnd), self._store)
        return _info(store, rank, world, *master)

    # -- what the agent's layers ask ------------------------------------------------------

    @property
    def store(self) -> Any:
        return self._store

    def members(self) -> dict[int, Node]:
        """Node rank -> node of this node's last round (read once per round); for a node
        that has been in none, of the last round it saw complete while it waited."""
        rnd, world = self.round, self.world_size
        if rnd is None:
            return dict(self._seen_members)
        with self._lock:
            if self._members is not None:
                return dict(self._members)
        keys = [self.keys.member(rnd, rank, self._decider) for rank in range(world)]
        found: dict[int, Node] = {}
        for rank, value in enumerate(self._signed.multi_get(keys)):
            if not isinstance(value, RefusedEntry):
                found[rank] = Node.decode(value)
        with self._lock:
            self._members = found
        return dict(found)

    def members_seen(self) -> dict[int, Node]:
        """:meth:`members` as last read, with no store call (empty: never read)."""
        with self._lock:
            known = self._members if self.round is not None else self._seen_members
            return dict(known or {})

    def round_seen_waiting(self) -> dict[int, Node]:
        """The members of the last round this node saw complete while it waited to join the
        job (a spare, a new node), with no store call; not a round it came into since."""
        with self._lock:
            return dict(self._seen_members)

    def continue_from(self, last: RoundsRendezvous, lost: Callable[[Node], bool] | None) -> None:
        """This rendezvous, on the store the job moved to after its host was lost, takes
        over from ``last`` (the one on the lost store): this node keeps its identity, and
        the first round here completes as a re-form does, at once when every member of
        ``last``'s round that survived has come (``lost``: whether a member is on the lost
        host; None: one host, where one member, the store's host, is lost)."""
        members = list(last.members_seen().values())
        with self._lock:
            self.node = Node(self.node.addr, last.node.pid, last.node.local_id)
        if not members:
            return  # nothing known of the last round: a first round, with its last call
        survivors = [n for n in members if lost is None or not lost(n)]
        expected = len(members) - 1 if lost is None else len(survivors)
        self._survivors = frozenset(n.id for n in survivors), expected

    def waiting_nodes(self) -> list[Node]:
        """The nodes that wait for the round after this node's last one (spares, nodes new
        to the job), or that joined the open round this node waits in."""
        rnd = self._waiting_in if self._waiting_in is not None else self._next_round()
        return [node for node in self._arrivals(rnd) if node is not None]

    def waiting_seen(self) -> list[Node]:
        """:meth:`waiting_nodes` as last read (the keyed liveness reads them every beat),
        with no store call: what the network watch counts once the store's host is silent."""
        with self._lock:
            rnd = self._waiting_in
            if rnd is None and self.round is not None:
                rnd = self.round + 1
            seen = self._arrivals_seen.get(rnd, []) if rnd is not None else []
            return [node for node in seen if node is not None]

    def present(self) -> list[Node]:
        """The nodes in the rendezvous as this node last took part: where it waits (or
        waited last, after its last round), those that came to that round; else the members
        of its last round and the nodes waiting for the next."""
        waited = self._waiting_in if self._waiting_in is not None else self._last_waited
        if waited is not None and (self.round is None or waited > self.round):
            return [self.node, *(n for n in self._arrivals(waited) if n is not None)]
        return [self.node, *self.members().values(), *self.waiting_nodes()]

    def waiting(self) -> bool:
        """Whether this node waits for a round now (in ``next_rendezvous``)."""
        return self._waiting_in is not None

    def standbys(self) -> tuple[int, bool]:
        """(nodes standing by while the job is at its maximum, whether this node is one);
        where the store does not answer (its host is lost), as last seen."""
        try:
            self._standbys_seen = self._standbys()
        except RendezvousConnectionError:
            pass
        return self._standbys_seen

    def standbys_seen(self) -> tuple[int, bool]:
        """:meth:`standbys` as last seen (by this node's looks at its round), with no store
        call: what the failover counts once the store's host is lost."""
        return self._standbys_seen

    def _standbys(self) -> tuple[int, bool]:
        if self._waiting_in is not None:
            full = self._waiting_in > 0 and self._round_size(self._waiting_in - 1) >= self.max_nodes
            waiting = self._counter(self.keys.count(self._waiting_in))
            return (waiting if full else 0), full and not self._current_is(self._waiting_in)
        if self.round is None:  # not waiting, in no round: as last seen
            return self._standbys_seen
        if self.world_size < self.max_nodes:
            return 0, False
        return self._counter(self.keys.count(self.round + 1)), False

    def state_node_ids(self) -> list[str]:
        """The ids of this node's round's members and of the nodes waiting, sorted."""
        ids = {node.id for node in self.members().values()}
        ids |= {node.id for node in self.waiting_nodes()}
        if self.round is not None or self._waiting_in is not None:
            ids.add(self.node.id)
        return sorted(ids - self.dropped_ids())

    def moved_on(self) -> bool:
        """Whether the job opened a round after this node's last one."""
        return self.round is not None and self._current_round() > self.round

    def state_round(self) -> int:
        return self.round if self.round is not None else 0

    def store_answer_age_s(self) -> float | None:
        answered = self._answered_s
        return None if answered is None else max(0.0, self._clock() - answered)

    def dropped_ids(self, store: SignedStore | None = None) -> set[str]:
        """The ids of the nodes said dead so far: the index read from where this node left
        off (a few keys per verdict, whatever the job's size). ``store``: as for
        :meth:`drop`."""
        signed = _Reached(store) if store is not None else self._signed
        with self._lock:
            cursor = self._dropped_read
        count = int(signed.add(self.keys.dropped_count, 0))
        if count > cursor:
            keys = [self.keys.dropped_at(i) for i in range(cursor, count)]
            written = self._written(keys, signed)
            values = dict(zip(written, signed.multi_get(written), strict=True)) if written else {}
            new: set[str] = set()
            for key in keys:  # up to the first one not written yet: read again next time
                value = values.get(key)
                if value is None:
                    break
                cursor += 1
                if not isinstance(value, RefusedEntry):
                    new.add(value.decode())
            with self._lock:
                self._dropped |= new
                self._dropped_read = max(self._dropped_read, cursor)
        with self._lock:
            return set(self._dropped)

    def dropped(self) -> bool:
        """Whether a watcher said this node dead (the job went on without it)."""
        return self._check(self.keys.dropped(self.node.id))

    def drop(self, node_ids: set[str], store: SignedStore | None = None) -> bool:
        """Said dead by a watcher: ``node_ids`` are never admitted again, and the round they
        are members of is left for the next one. ``store``: the caller's own connection
        (the liveness', not held by a waiting join). Whether any was a member of the round."""
        signed = _Reached(store) if store is not None else self._signed
        rnd = self._current_round_on(signed)
        members = self._members_on(signed, rnd)
        moved = False
        for node_id in sorted(node_ids):
            if signed.add(self.keys.dropped(node_id), 1) != 1:
                continue  # said before, by another watcher
            index = signed.add(self.keys.dropped_count, 1) - 1
            signed.set(self.keys.dropped_at(index), node_id)
            if node_id in members:
                signed.add(self.keys.lost(rnd), 1)
                moved = True
        if moved:
            self._open_after(signed, rnd)
        return moved

    # -- the protocol ---------------------------------------------------------------------

    def _join(self, deadline_s: float) -> tuple[int, int, int]:
        """(round, rank, nodes) of the round this node is admitted to."""
        if self.dropped():  # it came back after a stall: a new node to the job
            last = self.node
            self.node = Node(last.addr, last.pid, secrets.randbelow(2**31))
            self.round = self.rank = None  # its round went on without it
        target = self._target_round()
        while True:
            try:
                joined = self._wait_in(target, deadline_s)
            except _RoundLeft:
                target = self._target_round()
                continue
            finally:
                self._waiting_in = None
            if joined is not None:
                return joined
            target += 1  # the round completed without this node: wait in the next one

    def _target_round(self) -> int:
        """The round to join: the open one; the next one where this node is a member of the
        complete current round (it opens it) or the current one completed without it."""
        current = self._current_round()
        if self.round is not None and self.round >= current:
            return self._open_after(self._signed, self.round)
        if self._outcome(current) is not None:
            return current + 1
        return current

    def _open_after(self, signed: Any, rnd: int) -> int:
        """Open round ``rnd + 1`` (another node may have: the same write): the round now
        current."""
        signed.set(self.keys.opened(rnd + 1), OPENED)
        return self._current_round_on(signed)

    def _wait_in(self, rnd: int, deadline_s: float) -> tuple[int, int, int] | None:
        """Take a slot of round ``rnd`` and wait until it completes: (round, rank, nodes),
        or None where it completed without this node."""
        self._waiting_in = self._last_waited = rnd
        if self.round is None:  # where the job is, for a node that follows a moved rendezvous
            self._seen_members = dict(enumerate(self._member_nodes(self._signed, rnd - 1)))
        slot = self._signed.add(self.keys.count(rnd), 1) - 1
        self._signed.set(self.keys.slot(rnd, slot), self.node.encode())
        self.standbys()  # as it is now, for when the store is gone
        if self.round is not None and self.round == rnd - 1:
            self._signed.add(self.keys.back(rnd), 1)
        min_seen_s: float | None = None
        while True:
            decided = self._outcome(rnd)
            if decided is not None:
                return self._admitted(rnd, slot, *decided)
            if self.is_closed():
                standing_by = self.standbys()[1]
                raise RoundsClosedError(
                    f"the rendezvous of run {self._run_id!r} is closed", standing_by
                )
            if self._clock() > deadline_s:
                raise RendezvousTimeoutError(
                    f"round {rnd + 1} of the rendezvous did not complete in"
                    f" {self.join_timeout_s:g}s ({self._counter(self.keys.count(rnd))} of"
                    f" {self.min_nodes} nodes came)"
                )
            current = self._current_round()
            if current > rnd:
                raise _RoundLeft
            if current == rnd:
                min_seen_s = self._maybe_decide(rnd, slot, min_seen_s)
            self._wait_for(self.keys.done(rnd))

    def _maybe_decide(self, rnd: int, slot: int, min_seen_s: float | None) -> float | None:
        """Decide the round where this node is its deciding arrival and it is ready; the
        time it first had its minimum (its last call's start)."""
        count = self._counter(self.keys.count(rnd))
        if count < self.min_nodes:
            return None
        now_s = self._clock()
        min_seen_s = now_s if min_seen_s is None else min_seen_s
        survivors = self._survivors if rnd == 0 else None
        last_call_s = self.last_call_s if rnd == 0 and not survivors else self.reform_last_call_s
        waited_s = now_s - min_seen_s
        take_over_s = TAKE_OVER_CALLS * last_call_s + 1.0
        if waited_s < take_over_s * min(slot, TAKE_OVER_SLOTS):
            return min_seen_s  # the first arrival decides while it is there, then the next
        nodes = self._arrivals(rnd, count)
        if survivors is not None:  # the first round after a move: the survivors come back
            ids, expected = survivors
            back = sum(node is not None and node.id in ids for node in nodes)
            arrivals = outcome.Arrivals(rnd, nodes, back, expected)
        else:
            previous = self._round_size(rnd - 1) - self._counter(self.keys.lost(rnd - 1))
            arrivals = outcome.Arrivals(rnd, nodes, self._counter(self.keys.back(rnd)), previous)
        if not outcome.ready(arrivals, self.min_nodes, self.max_nodes, waited_s >= last_call_s):
            return min_seen_s
        dropped = self.dropped_ids()
        last_addrs = frozenset(n.addr for n in self._member_nodes(self._signed, rnd - 1))
        chosen = outcome.members(arrivals, dropped, self.max_nodes, last_addrs)
        if len(chosen) < self.min_nodes:
            return min_seen_s
        keys = [self.keys.rank(rnd, s, slot) for s in chosen]
        keys += [self.keys.member(rnd, r, slot) for r in range(len(chosen))]
        values = [str(rank) for rank in range(len(chosen))]
        values += [nodes[s].encode() for s in chosen]  # type: ignore[union-attr]
        self._signed.multi_set(keys, values)  # under this decider's own slot
        decided = f"{len(chosen)} {slot}"
        try:
            self._signed.compare_set(self.keys.done(rnd), "", decided)
        except RendezvousStateError:  # a forged outcome was there first: the job's replaces it
            self._signed.set(self.keys.done(rnd), decided)
        return min_seen_s

    def _admitted(
        self, rnd: int, slot: int, world: int, decider: int
    ) -> tuple[int, int, int] | None:
        rank = self._number(self.keys.rank(rnd, slot, decider))
        if rank is not None:
            self._decider = decider
        return None if rank is None else (rnd, rank, world)

    def _outcome(self, rnd: int, signed: Any = None) -> tuple[int, int] | None:
        """(members, the deciding slot) of a complete round; None while it is open."""
        value = None if rnd < 0 else self._value(self.keys.done(rnd), signed)
        if value is None:
            return None
        world, decider = value.decode().split(" ")
        return int(world), int(decider)

    def _master(self, rnd: int, rank: int, deadline_s: float) -> tuple[str, int] | None:
        """Rank 0's address and a free port there, as torchrun gives its workers; None
        where the job left the round before its rank 0 said (a verdict re-formed it)."""
        key = self.keys.master(rnd)
        if rank == 0:
            with socket.socket() as sock:
                sock.bind(("", 0))
                port = int(sock.getsockname()[1])
            self._signed.set(key, f"{self.node.addr} {port}")
            return self.node.addr, port
        while (value := self._value(key)) is None:
            if self._current_round() > rnd:
                return None
            if self._clock() > deadline_s:
                raise RendezvousTimeoutError(f"rank 0 of round {rnd + 1} never said where to meet")
            self._wait_for(key)
        addr, port_text = value.decode().rsplit(" ", 1)
        return addr, int(port_text)

    # -- store reads ----------------------------------------------------------------------

    def _current_round(self) -> int:
        return self._current_round_on(self._signed)

    def _current_is(self, rnd: int) -> bool:
        return self._current_round() == rnd

    def _current_round_on(self, signed: Any) -> int:
        """The last round opened: the last known one, or a later one whose opening is there
        and signed (a forged one is refused, said once, and passed over)."""
        known = self._known_round
        while signed.check([self.keys.opened(known + 1)]):
            if signed.read(self.keys.opened(known + 1), self._what) is None:
                break
            known += 1
        self._answered()
        self._known_round = max(self._known_round, known)
        return self._known_round

    def _next_round(self) -> int:
        return (self.round + 1) if self.round is not None else self._current_round()

    def _round_size(self, rnd: int) -> int:
        """The members of a complete round (0: none, or not complete)."""
        decided = self._outcome(rnd)
        return 0 if decided is None else decided[0]

    def _members_on(self, signed: Any, rnd: int) -> set[str]:
        return {node.id for node in self._member_nodes(signed, rnd)}

    def _member_nodes(self, signed: Any, rnd: int) -> list[Node]:
        """The members of round ``rnd`` (none where it is not complete)."""
        decided = self._outcome(rnd, signed)
        if decided is None:
            return []
        world, decider = decided
        values = signed.multi_get([self.keys.member(rnd, r, decider) for r in range(world)])
        return [Node.decode(v) for v in values if not isinstance(v, RefusedEntry)]

    def _arrivals(self, rnd: int, count: int | None = None) -> list[Node | None]:
        """The nodes in round ``rnd``'s slots (None: a slot taken but not written yet, or
        refused). A slot is written once: each is read once, later reads take the new ones
        only (a round forming with N arrivals costs a node N reads, not N a look)."""
        count = self._counter(self.keys.count(rnd)) if count is None else count
        with self._lock:
            nodes = list(self._arrivals_seen.get(rnd, ()))[:count]
        nodes += [None] * (count - len(nodes))
        missing = [slot for slot, node in enumerate(nodes) if node is None]
        keys = [self.keys.slot(rnd, slot) for slot in missing]
        written = self._written(keys, self._signed)
        values = dict(zip(written, self._signed.multi_get(written), strict=True)) if written else {}
        for slot, key in zip(missing, keys, strict=True):
            value = values.get(key)
            if value is not None and not isinstance(value, RefusedEntry):
                nodes[slot] = Node.decode(value)
        with self._lock:  # this round and the one before: a node looks no further back
            self._arrivals_seen = {
                r: seen for r, seen in self._arrivals_seen.items() if r >= rnd - 1
            }
            self._arrivals_seen[rnd] = nodes
        return list(nodes)

    def _value(self, key: str, signed: Any = None) -> bytes | None:
        """A signed value; None where it is not there, or not the job's (said once)."""
        signed = self._signed if signed is None else signed
        value = signed.read(key, self._what) if signed.check([key]) else None
        self._answered()
        return value

    def _number(self, key: str, signed: Any = None) -> int | None:
        value = self._value(key, signed)
        return None if value is None else int(value)

    def _written(self, keys: list[str], signed: Any) -> list[str]:
        """Those of ``keys`` that are in the store: one ``check`` where all are, halves
        checked again where not (a few calls per key missing, not one per key)."""
        if not keys:
            return []
        found = bool(signed.check(keys))
        self._answered()
        if found:
            return keys
        if len(keys) == 1:
            return []
        half = len(keys) // 2
        return self._written(keys[:half], signed) + self._written(keys[half:], signed)

    def _counter(self, key: str) -> int:
        value = int(self._signed.add(key, 0))
        self._answered()
        return value

    def _check(self, key: str) -> bool:
        return self._check_all([key])

    def _check_all(self, keys: list[str]) -> bool:
        found = bool(self._signed.check(keys))
        self._answered()
        return found

    def _wait_for(self, key: str) -> None:
        """A pause before the next look at ``key`` (a poll: a store's ``wait`` that times out
        prints a C++ warning every time)."""
        del key
        time.sleep(self._poll_s)

    def _answered(self) -> None:
        self._answered_s = self._clock()


def _info(store: Any, rank: int, world: int, addr: str, port: int) -> RendezvousInfo:
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    return RendezvousInfo(store, rank, world, RendezvousStoreInfo(addr, port))
