"""Everything the agent does that depends on the torch release, in one place.

The rest of the agent uses torch.distributed.elastic's public API only (rendezvous handlers'
``next_rendezvous`` / ``num_nodes_waiting`` / ``shutdown``, ``PContext``, ``LogsSpecs``,
``RunResult``, ...). What differs between the torch releases the package declares
(``torch>=2.4,<3``), or is not public at all, is here:

- :func:`next_round` / :func:`round_of`: ``next_rendezvous()`` returns a ``RendezvousInfo``
  (with the workers' master address in ``bootstrap_store_info``); older releases returned
  ``(store, rank, world_size)``; from 2.5 on it hosts a store shared by every round unless
  told not to.
- :func:`round_members` / :func:`present_members` / :func:`heartbeats` /
  :func:`peer_hosts` / :func:`store_answer_age_s`: who took part in the c10d rendezvous
  and when each was last heard, for the "lost since the last round" message, the peers that
  stopped answering, those a cut-off node probes and when the store last answered it. No
  public API tells: this reads the c10d handler's private state, and degrades to nothing
  when that state changes. Given one of the agent's rendezvous layers, these read torch's
  handler at its bottom (``torch_handler()``, rendezvous/wrapped.py): the layers forward
  nothing private.
- :func:`set_last_call_timeout`: the c10d handler's last call after the first round
  (rendezvous/liveness.py); private, degrades to torch's own.
- :func:`tune_state_syncs` / :class:`StateMemo` / :func:`synced_state`: the state holder's
  private cache, token and state (an unchanged state kept instead of unpickled again, a
  state changed by membership alone read again at a pace of its size, a random wait after a
  lost write, what is derived from the state derived once per change:
  rendezvous/state_generation.py); private, degrades to torch's own syncs.
- :func:`job_ended` / :func:`is_this_machine`: the "rendezvous closed" errors of each
  release; torch's private test of whether an endpoint names this machine.
- :func:`accelerator_count`: ``torch.accelerator`` exists from 2.6 on; ``torch.xpu`` and a
  custom (PrivateUse1) backend are looked up only when asked for.
- :func:`in_bad_cuda_fork` / :func:`without_device_query`: torch's private bad-fork flag;
  ``LaunchConfig.__post_init__``'s device query, which poisons the caller's forks;
  :func:`launch_config_fields` / :func:`launch_config_value`: the ``LaunchConfig`` fields 2.4 lacks.
- :func:`exit_barrier`: ``torch.distributed.elastic.utils.store.barrier`` grew parameters.
- :func:`start_file_timer`: ``FileTimerServer`` takes ``run_id`` from 2.x on.
- :func:`assign_worker_ranks`: the ranks torch's agent gives each node's workers, with its
  store keys (``SimpleElasticAgent._assign_worker_ranks``, private).
- :func:`wrap_group_registry`: torch's registry of live process groups is private (a module
  global that ``_World.pg_map`` reads every time, the same from 2.4 to 2.15);
  :func:`keep_created_groups` is its fallback, through torch's public group creators.
- :func:`tcp_store_on_socket`: a ``TCPStore`` server on a socket the caller bound
  (``master_listen_fd``); 2.4's default (libuv) server cannot take one, its legacy one can.
- :func:`torchrun_defaults`: the defaults of the installed torchrun's flags (2.4's
  ``--master-port`` defaults to 29500, later ones to a free port for one node; 2.4 has no
  ``--signals-to-handle``), read from torch's public ``get_args_parser()``.
- :func:`quick_rendezvous_events` / :func:`no_first_round_skew`: the dynamic rendezvous
  names each event it records after its caller through ``inspect.stack()`` (tens of ms
  per round with torch loaded) and sleeps 0 to 0.3 s before a first round to skew the
  nodes apart; the same name from the frame itself, and no skew when there is one node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib
import inspect
import json
import logging
import os
import random
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, TypeVar

from torch.distributed.distributed_c10d import PrefixStore, Store
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler

from torchx_elastic.contract import MASTER_KEY, SHARE_STORE_OPT_OUT_ENV

log = logging.getLogger(__name__)
T = TypeVar("T")

# torch's store keys of the worker ranks' assignment (api.py, _assign_worker_ranks): the
# supervision loop assigns them as torch's agent does
ROLE_INFO_PREFIX = "torchelastic/role_info/"
ASSIGNED_RANKS_PREFIX = "torchelastic/assigned_ranks/"
# torch's key prefix of the agents' exit barrier (api.py, _TERMINAL_STATE_SYNC_ID)
EXIT_BARRIER_PREFIX = "torchelastic/agent/terminal_state"


@dataclass(frozen=True)
class Round:
    """One completed rendezvous round, as this node sees it."""

    store: Store
    rank: int
    world_size: int
    master_addr: str
    master_port: int


def assign_worker_ranks(
    store: Store, group_rank: int, group_world_size: int, role: str, nproc: int
) -> tuple[int, int, int, int]:
    """This node's first global rank, the world size, its first role rank and the role's
    world size: torch's agent's algorithm and store keys (``_assign_worker_ranks``, private).

    Every node writes its role and worker count; node 0 hands out consecutive blocks of
    ranks in node order; nodes may run different numbers of workers. Node 0 reads and writes
    every node's entry in one round trip each (``multi_get``, ``multi_set``: as torch's agent
    since 2.4), every other node makes two calls.
    """
    store.set(f"{ROLE_INFO_PREFIX}{group_rank}", json.dumps([role, nproc]))
    if group_rank == 0:
        keys = [f"{ROLE_INFO_PREFIX}{i}" for i in range(group_world_size)]
        infos = [json.loads(info) for info in store.multi_get(keys)]
        world_size = sum(n for _, n in infos)
        role_sizes: dict[str, int] = {}
        for name, n in infos:
            role_sizes[name] = role_sizes.get(name, 0) + n
        base, role_bases = 0, dict.fromkeys(role_sizes, 0)
        values = []
        for name, n in infos:
            values.append(json.dumps([base, world_size, role_bases[name], role_sizes[name]]))
            base += n
            role_bases[name] += n
        keys = [f"{ASSIGNED_RANKS_PREFIX}{i}" for i in range(group_world_size)]
        store.multi_set(keys, values)  # type: ignore[attr-defined]
    base, world_size, role_base, role_world_size = json.loads(
        store.get(f"{ASSIGNED_RANKS_PREFIX}{group_rank}")
    )
    return int(base), int(world_size), int(role_base), int(role_world_size)


def first_rank_of(store: Store, group_rank: int) -> int:
    """The first global rank of node ``group_rank`` in a round (:func:`assign_worker_ranks`)."""
    return int(json.loads(store.get(f"{ASSIGNED_RANKS_PREFIX}{group_rank}"))[0])


def preload_compiler() -> None:
    """Import torch's compiler (``torch._dynamo``, private), which DistributedDataParallel
    imports when it is built: over a second per process, once in the fork server."""
    importlib.import_module("torch._dynamo")


def round_placement(result: Any) -> tuple[Store, int, int]:
    """(store, this node's rank, nodes) of what ``next_rendezvous()`` returned: a tuple in
    releases before ``RendezvousInfo``."""
    if isinstance(result, tuple):
        store, rank, world_size = result
        return store, int(rank), int(world_size)
    return result.store, int(result.rank), int(result.world_size)


def round_of(result: Any, local_addr: str | None = None) -> Round:
    """The round from what ``RendezvousHandler.next_rendezvous()`` returned."""
    if isinstance(result, tuple):  # (store, rank, world_size): releases before RendezvousInfo
        store, rank, world_size = round_placement(result)
        addr, port = _master_through_store(store, rank, local_addr)
        return Round(store, int(rank), int(world_size), addr, port)
    info = result.bootstrap_store_info
    return Round(
        result.store, int(result.rank), int(result.world_size), info.master_addr, info.master_port
    )


def _master_through_store(store: Store, rank: int, local_addr: str | None) -> tuple[str, int]:
    """Rank 0 picks a free port on its host and tells the others through the store."""
    if rank == 0:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        addr = local_addr or socket.getfqdn()
        store.set(MASTER_KEY, f"{addr} {port}")
        return addr, int(port)
    _wait_for_rank0(store, MASTER_KEY)
    addr, port_text = store.get(MASTER_KEY).decode().split(" ")
    return addr, int(port_text)


class RoundLeft(RendezvousError):
    """The job left the round this node joined (a verdict re-formed it) before the round's
    rank 0 said where its workers meet: that node never will."""


# the check of a round that this thread's node joined (rejoin_moved_rounds)
_ROUND_WAIT = threading.local()
RANK0_WAIT_S = 1.0  # a wait for rank 0's address looks whether the round moved this often


def _wait_for_rank0(store: Any, key: str) -> None:
    """Wait for rank 0 of the round to set ``key``, as torch's ``get`` of it does (up to the
    store's timeout), but where this thread's node is in :func:`rejoin_moved_rounds`, look
    every :data:`RANK0_WAIT_S` whether the job moved to a later round meanwhile, and raise
    :class:`RoundLeft` then. A verdict re-forms a complete round in its own write
    (:func:`reform_without`), so a member that had not read the round complete yet (rank
    0 of a round of 1,000 nodes may take seconds) goes to the next one without ever
    setting the address the others wait for (torch's wait: its read timeout, 60 s, then an
    error)."""
    moved = getattr(_ROUND_WAIT, "moved", None)
    if moved is None:
        return
    moved()  # the round it joined, as it read it last
    deadline = time.monotonic() + store.timeout.total_seconds()
    while time.monotonic() < deadline:
        try:
            store.wait([key], datetime.timedelta(seconds=RANK0_WAIT_S))
            return
        except RuntimeError as err:
            if "timeout" not in str(err).lower():
                raise  # the store went away: as torch's get would
        if moved():
            raise RoundLeft(f"the rendezvous moved past the round this node joined ({key})")


def rejoin_moved_rounds(handler: RendezvousHandler, counter: StateCounter | None = None) -> bool:
    """Make torch's ``next_rendezvous`` of ``handler`` join the next round where the round
    it joined moved on before its rank 0 said where the workers meet
    (:func:`_wait_for_rank0`, through torch's ``RendezvousStoreInfo.build`` or
    :func:`_master_through_store`): its leave of the round then writes nothing
    (:func:`leave_into_wait_list`: it is in the next one already). Each look reads
    ``counter``'s round mark and the state only once that changed (without a counter: the
    state, through torch's one-second cache). False where this torch's handler is otherwise
    (private)."""
    torch_handler: Any = _torch_handler(handler)
    original = getattr(type(torch_handler), "next_rendezvous", None)
    if original is None or not hasattr(torch_handler, "_state_holder"):
        return False
    _store_info_waits()
    handler_ref = weakref.ref(torch_handler)  # no cycle through the handler's own attribute

    def next_rendezvous() -> Any:
        held = handler_ref()
        while True:
            _ROUND_WAIT.moved = _moved_since_first_look(held, counter)
            try:
                return original(held)
            except RoundLeft as err:
                log.debug("%s: joining the next round", err)
            finally:
                _ROUND_WAIT.moved = None

    torch_handler.next_rendezvous = next_rendezvous
    return True


def _moved_since_first_look(handler: Any, counter: StateCounter | None) -> Callable[[], bool]:
    """Whether the handler's rendezvous is in a later round than at this check's first
    call (which answers False); the state read again only where ``counter``'s round mark
    changed since the last look, or, at the second look, since the state the handler held
    at the first was read (a round may have moved between that read and the first look: a
    node slow to return from its join would otherwise wait for a rank 0 that left)."""
    looked: list[tuple[int, int | None]] = []  # (the round joined, the last round mark)

    def moved() -> bool:
        if not looked:
            held = counter.held_round_mark() if counter is not None else None
            looked.append((state_round(handler), held))
            return False
        mark = counter.round_mark() if counter is not None else None
        joined, last_mark = looked[0]
        if counter is not None and mark == last_mark:
            return False
        looked[0] = (joined, mark)
        sync_now(handler)
        return state_round(handler) > joined

    return moved


def _store_info_waits() -> None:
    """torch's ``RendezvousStoreInfo.build`` (torch 2.4 on) waiting for rank 0's address as
    :func:`_wait_for_rank0` does (once per process)."""
    api = importlib.import_module("torch.distributed.elastic.rendezvous.api")
    info: Any = getattr(api, "RendezvousStoreInfo", None)
    build = getattr(info, "build", None)
    if build is None or getattr(build, "_waits_for_rank0", False):
        return

    def waiting_build(rank: int, store: Any, *args: Any, **kwargs: Any) -> Any:
        if rank != 0:
            _wait_for_rank0(store, info.MASTER_PORT_KEY)  # set after its address
        return build(rank, store, *args, **kwargs)

    waiting_build._waits_for_rank0 = True  # type: ignore[attr-defined]
    info.build = staticmethod(waiting_build)


def _torch_handler(handler: RendezvousHandler) -> Any:
    """torch's own handler under the agent's rendezvous layers (each offers it as
    ``torch_handler()``: rendezvous/wrapped.py), whose private state is read here."""
    bottom = getattr(handler, "torch_handler", None)
    return bottom() if callable(bottom) else handler


def _participants(handler: RendezvousHandler) -> tuple[Any, dict[Any, int], Any]:
    handler = _torch_handler(handler)
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    return (
        getattr(handler, "_this_node", None),
        dict(getattr(state, "participants", None) or {}),
        tuple(getattr(state, "wait_list", None) or ()),
    )


def synced_state(handler: RendezvousHandler) -> Any:
    """The rendezvous state of the handler's last sync (torch's ``_RendezvousState``, as its
    private state holder keeps it; None where this torch keeps none): a new object on
    every read of the stored state."""
    return getattr(getattr(_torch_handler(handler), "_state_holder", None), "state", None)


class StateMemo(Generic[T]):
    """``compute(handler)``, computed again only once the handler's synced rendezvous state
    changed: another object (each read of the stored state makes one), or other numbers of
    participants, waiting and standing-by nodes (the handler's own join changes its copy in
    place). What a supervision check or a heartbeat derives from the whole state (O(N))
    then costs O(1) while the membership stays."""

    def __init__(self, compute: Callable[[RendezvousHandler], T]) -> None:
        self._compute = compute
        self._seen: tuple[Any, ...] | None = None
        self._value: T | None = None

    def __call__(self, handler: RendezvousHandler) -> T:
        state = synced_state(handler)
        seen = (
            state,
            len(getattr(state, "participants", None) or ()),
            len(getattr(state, "wait_list", None) or ()),
            len(getattr(state, "redundancy_list", None) or ()),
        )
        last = self._seen
        if state is None or last is None or state is not last[0] or seen[1:] != last[1:]:
            self._value = self._compute(handler)
            self._seen = seen
        return self._value  # type: ignore[return-value]


class StateCounter(Protocol):
    """What :func:`tune_state_syncs` asks of the backend below the handler
    (rendezvous/state_generation.py)."""

    def unchanged(self, token: Any) -> bool:
        """Whether the stored state is still the one of ``token``."""

    def must_read(self, token: Any) -> bool:
        """Whether a holder of the state of ``token`` must read the stored state now."""

    def mark_round_moved(self) -> None:
        """This node's last write moved a round: the others should read it at once."""

    def round_mark(self) -> int:
        """A number that changes when a write moved a round (one read of the counter)."""

    def held_round_mark(self) -> int:
        """The round mark as the state was last read (no store call): at most the mark of
        the state the handler holds."""


def tune_state_syncs(
    handler: RendezvousHandler, counter: StateCounter, backoff_max_s: float
) -> bool:
    """Make the handler's syncs keep the state they hold, as torch's one-second cache does,
    until ``counter.must_read(token)`` (the state holder's ``_token``, from its last read or
    write): torch's holder unpickles the whole state on every read it does not serve from
    its cache, O(N) per node a second. A write of this node that moved a round (the round,
    its completion, its closing) is told through ``counter.mark_round_moved()`` (compared
    with the state as it was read, before torch's clean-up of lost nodes changed it). And
    after a write that lost the race to another node's (its compare-and-set failed: a join,
    a leave, a verdict), wait a random time up to ``backoff_max_s`` and read the state
    again before the handler decides its next write (torch 2.15's
    ``cas_backoff_max_seconds`` waits but decides on the state it got before the wait): a
    herd of nodes that re-form at once spreads its writes instead of failing them all again.
    A sync asked for past the cache (``_last_sync_time`` set back, as :func:`sync_now` does)
    reads any change. False, changing nothing, where this torch's holder is otherwise (private)."""
    holder: Any = getattr(_torch_handler(handler), "_state_holder", None)
    read = getattr(type(holder), "sync", None)
    private = ("_dirty", "_token", "_last_sync_time", "_cache_duration", "_state")
    if read is None or not all(hasattr(holder, name) for name in private):
        return False
    # the class's sync and a weak reference: a closure over the holder, kept on the holder,
    # would make a reference cycle that frees the handler and its store only at some later
    # garbage collection (in whatever process runs then: a forked worker's, say)
    holder_ref = weakref.ref(holder)
    stored: list[tuple[int, bool, bool] | None] = [None]  # the stored state's round marks
    clean_up = getattr(type(holder), "_sanitize", None)

    def marked_clean_up() -> None:  # torch's after every read and write, of what it got
        held: Any = holder_ref()
        if held is not None and clean_up is not None:
            stored[0] = _round_marks(held._state)
            clean_up(held)

    def synced(held: Any) -> bool | None:
        result: bool | None = read(held)
        if clean_up is None:  # this torch cleans up otherwise: the marks as it left them
            stored[0] = _round_marks(held._state)
        return result

    def sync() -> bool | None:
        held: Any = holder_ref()
        if held is None:
            return None
        if held._dirty:
            moving = _round_marks(held._state) != stored[0]
            written = synced(held)
            if written and moving:
                counter.mark_round_moved()
            if written is False and backoff_max_s > 0:
                time.sleep(random.uniform(0, backoff_max_s))
                held._last_sync_time = -1.0  # past torch's cache: the state after the wait
                synced(held)
            return written
        if not held._cache_duration > 0:
            return synced(held)
        if held._last_sync_time >= max(time.monotonic() - held._cache_duration, 0):
            return None  # torch's cache serves it
        if held._last_sync_time < 0:  # asked for the newest state (sync_now)
            due = not counter.unchanged(held._token)
        else:
            due = counter.must_read(held._token)
        if due:
            return synced(held)
        held._last_sync_time = time.monotonic()
        return None

    holder.sync = sync
    if clean_up is not None:
        holder._sanitize = marked_clean_up
    return True


def _round_marks(state: Any) -> tuple[int, bool, bool]:
    """What of a rendezvous state a waiting node must see at once: its round, whether the
    round is complete, whether the rendezvous closed."""
    return (int(state.round), bool(state.complete), bool(state.closed))


def standbys(handler: RendezvousHandler) -> tuple[int, bool]:
    """(nodes standing by, whether this node is one of them): the nodes that came once the
    job had its maximum wait in torch's redundancy list (torch 2.3 on) and take the place of
    a lost node at the next round."""
    torch_handler = _torch_handler(handler)
    state = getattr(getattr(torch_handler, "_state_holder", None), "state", None)
    waiting = set(getattr(state, "redundancy_list", None) or ())
    return len(waiting), getattr(torch_handler, "_this_node", None) in waiting


@dataclass(frozen=True)
class JoinView:
    """What torch's join operation saw at one sync of the rendezvous state: this node, the
    round's participants, the nodes waiting (its wait list and redundancy list), whether the
    round is complete, its maximum of nodes, and whether this node is about to move into a
    round (join it, wait for the next one, or leave the redundancy list for it)."""

    node: Any  # torch's node descriptor: addr, pid, local_id
    participants: frozenset[Any]
    waiting: frozenset[Any]
    complete: bool
    round: int
    max_nodes: int
    joining: bool


def hold_joins(handler: RendezvousHandler, hold: Callable[[JoinView], bool]) -> bool:
    """Put ``hold`` on torch's join operation of ``handler`` (torch 2.3 on): it sees every
    sync of the join; where it returns True for a node about to move into a round, the node
    keeps its heartbeat and syncs again instead (torch's own keep-alive or one-second poll).
    False when this torch has no such operation (nothing is held)."""
    dr = _dynamic_rendezvous()
    action: Any = getattr(dr, "_Action", None)
    join_op = getattr(dr, "_RendezvousJoinOp", None)
    executor = getattr(_torch_handler(handler), "_op_executor", None)
    moves = {getattr(action, n, None) for n in _JOIN_MOVES}
    if join_op is None or executor is None or None in moves:
        return False

    def held(inner: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
        def state_handler(ctx: Any, deadline: float) -> Any:
            chosen = inner(ctx, deadline)
            state = ctx.state
            view = JoinView(
                node=ctx.node,
                participants=frozenset(state.participants),
                waiting=frozenset(state.wait_list) | frozenset(state.redundancy_list),
                complete=bool(state.complete),
                round=int(state.round),
                max_nodes=int(ctx.settings.max_nodes),
                joining=chosen in moves,
            )
            try:
                held_back = hold(view) and view.joining
            except Exception:  # noqa: BLE001 - a policy's bug never stops the rendezvous
                log.exception("the rendezvous join's hold failed: torch's own choice stands")
                held_back = False
            if held_back:
                return action.KEEP_ALIVE if dr._should_keep_alive(ctx) else action.SYNC
            return chosen

        return state_handler

    _wrap_operation(executor, join_op, held)
    return True


# the join's moves into a round that ``hold_joins`` may hold back
_JOIN_MOVES = ("ADD_TO_PARTICIPANTS", "ADD_TO_WAIT_LIST", "REMOVE_FROM_REDUNDANCY_LIST")


def leave_into_wait_list(handler: RendezvousHandler) -> bool:
    """Make a node that leaves a complete round to join the next one (torch's exit operation,
    which ``next_rendezvous`` runs before its join) write what torch's join would write next
    in the same write:

    - where the round stays complete without it, it joins the wait list;
    - where it is the last to leave (its leave opens the next round), it joins the next round
      and so do the nodes of the wait list that left the same round before it, as each one's
      own join would (a deadline once the round has its minimum, complete with torch's ranks
      at its maximum): each is in its join already, and finds itself in the round at its next
      poll instead of writing its join after the others'. A waiting node new to the job
      joins itself, as torch has it: one that failed once it came is never counted in.

    A round that re-forms takes one write per node and one more, torch's two per node (and
    one write in all where a verdict on a lost node re-formed it: :func:`reform_without`,
    the leave then finds its node in the next round and writes nothing). False, changing
    nothing, where this torch has no such operation (private)."""
    dr = _dynamic_rendezvous()
    action: Any = getattr(dr, "_Action", None)
    exit_op = getattr(dr, "_RendezvousExitOp", None)
    join_op = getattr(dr, "_RendezvousJoinOp", None)
    executor: Any = getattr(_torch_handler(handler), "_op_executor", None)
    moves = ("_remove_from_participants", "_add_to_wait_list", "_add_to_participants")
    if None in (action, exit_op, join_op) or not all(hasattr(executor, m) for m in moves):
        return False
    executor_ref = weakref.ref(executor)
    # the round this node's last join ended in, and its members
    joined: list[tuple[int, frozenset[Any]]] = [(-1, frozenset())]

    def joining(inner: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
        def state_handler(ctx: Any, deadline: float) -> Any:
            chosen = inner(ctx, deadline)
            if chosen == action.FINISH:
                joined[0] = (ctx.state.round, frozenset(ctx.state.participants))
            return chosen

        return state_handler

    def leaving(inner: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
        def state_handler(ctx: Any, deadline: float) -> Any:
            state = ctx.state
            if 0 <= joined[0][0] < state.round and ctx.node in state.participants:
                # in a later round than its last already: brought there by the last leaver's
                # write, its own, or a verdict's (reform_without): nothing to leave
                return action.FINISH
            chosen = inner(ctx, deadline)
            held: Any = executor_ref()
            if chosen != action.REMOVE_FROM_PARTICIPANTS or not state.complete or held is None:
                return chosen
            last = len(state.participants) == 1
            held._remove_from_participants()  # the last one's: torch opens the next round
            if not last:
                held._add_to_wait_list()
            else:
                held._add_to_participants()
                _bring_into_round(held, state, ctx.settings, ctx.node, joined[0][1])
            return action.KEEP_ALIVE  # one change (the heartbeat: the join's)

        return state_handler

    _wrap_operation(executor, join_op, joining)
    _wrap_operation(executor, exit_op, leaving)
    return True


def _bring_into_round(
    executor: Any, state: Any, settings: Any, node: Any, members: frozenset[Any]
) -> None:
    """Move the nodes of ``state``'s wait list that were ``members`` of the last round into
    its open round (:func:`_admit`), ``node`` having just joined it."""
    now = state.last_heartbeats[node]  # the kind of time this torch writes (aware from 2.5)
    _admit(executor, state, settings, sorted(state.wait_list & members - {node}), now)


def _admit(executor: Any, state: Any, settings: Any, nodes: Iterable[Any], now: Any) -> None:
    """Add ``nodes`` to ``state``'s open round as torch's ``_add_to_participants`` adds a
    node itself, until the round has its maximum: off the wait list, a heartbeat of ``now``
    unless it has one, the round's deadline once it has its minimum, the ranks once it has
    its maximum (``executor``'s own ``_mark_rendezvous_complete``)."""
    for waiting in nodes:
        if state.complete or len(state.participants) >= settings.max_nodes:
            break
        state.wait_list.discard(waiting)
        state.participants[waiting] = 0
        state.last_heartbeats.setdefault(waiting, now)  # its own, kept since its leave
        if len(state.participants) == settings.min_nodes:
            state.deadline = now + settings.timeout.last_call
        if len(state.participants) == settings.max_nodes:
            executor._mark_rendezvous_complete()


# a node that came to the first round, as its roll-call entry names it: torch's node
# descriptor (address, process id, number in its process)
NodeKey = tuple[str, int, int]


def gather_first_round(
    handler: RendezvousHandler, pending: Callable[[], Iterable[NodeKey]]
) -> bool:
    """Have this node's join of the job's first round (round 0, open) bring into the round,
    in the same write, every node of ``pending()`` that is not in the rendezvous yet (the
    nodes of the roll call with this node's settings: rendezvous/waiting.py), in that order
    and as each one's own join would (:func:`_admit`). torch's join takes one write per node
    of the whole state, and N nodes that come at once race for it (O(N^2) compare-and-sets);
    here a node finds itself in the round at its next poll and writes nothing, so the first
    round takes about one write per wave of nodes that come; its own first leave (torch's
    ``next_rendezvous`` leaves the last round before it joins) leaves nothing. A node
    brought in that has died meanwhile is dropped by the liveness like a node that joined
    and died. Nodes that come once the round is complete, and every later round, join as
    torch has it. False, changing nothing, where this torch's join is not as expected
    (private)."""
    dr = _dynamic_rendezvous()
    describe: Any = getattr(dr, "_NodeDesc", None)
    action: Any = getattr(dr, "_Action", None)
    exit_op = getattr(dr, "_RendezvousExitOp", None)
    join_op = getattr(dr, "_RendezvousJoinOp", None)
    executor: Any = getattr(_torch_handler(handler), "_op_executor", None)
    add: Any = getattr(type(executor), "_add_to_participants", None)
    if None in (describe, action, exit_op, join_op, add) or not hasattr(
        executor, "_mark_rendezvous_complete"
    ):
        return False
    executor_ref = weakref.ref(executor)  # no cycle through the executor's own attribute
    joined = [False]  # whether this node's own join of a round ended

    def joining(inner: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
        def state_handler(ctx: Any, deadline: float) -> Any:
            chosen = inner(ctx, deadline)
            joined[0] = joined[0] or chosen == action.FINISH
            return chosen

        return state_handler

    def leaving(inner: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
        def state_handler(ctx: Any, deadline: float) -> Any:
            if not joined[0] and ctx.node in ctx.state.participants:
                # brought in before its first join (torch's next_rendezvous leaves the last
                # round first): leaving would take it out of the round it joins
                return action.FINISH
            return inner(ctx, deadline)

        return state_handler

    def add_to_participants() -> None:
        held: Any = executor_ref()
        add(held)
        state = held._state
        if state.round != 0 or state.complete or state.closed:
            return
        try:
            came = [describe(addr, pid, local_id) for addr, pid, local_id in pending()]
        except Exception:  # noqa: BLE001 - the others join themselves, as in torch
            log.debug("the first round's roll call is not readable", exc_info=True)
            return
        spares = getattr(state, "redundancy_list", ())
        absent = [
            n
            for n in came
            if n not in state.participants and n not in state.wait_list and n not in spares
        ]
        _admit(held, state, held._settings, absent, state.last_heartbeats[held._node])

    executor._add_to_participants = add_to_participants
    _wrap_operation(executor, join_op, joining)
    _wrap_operation(executor, exit_op, leaving)
    return True


def reform_without(state: Any, doomed: Iterable[Any], settings: Any) -> bool:
    """Re-form ``state``'s complete round without the ``doomed`` nodes in the verdict's own
    write: the next round opened with every other member of the round in it, as each one's
    leave and join would leave it (torch's ``_add_to_participants``: the ranks given at
    completion, a last-call deadline once the round has its minimum). A round of N nodes
    re-forms in one write instead of N (or 2N, torch's). Each member is in its supervision
    loop still; once it sees the verdict it leaves its round (``leave_into_wait_list``
    finds it in the next one and writes nothing) and joins, and the round completes at its
    deadline. Waiting nodes (spares, nodes new to the job) join themselves, as before.
    False, changing nothing, where the round is not complete or none of ``doomed`` is in it."""
    doomed = set(doomed)
    stay = [node for node in state.participants if node not in doomed]
    if not state.complete or state.closed or len(stay) == len(state.participants) or not stay:
        return False
    now = _state_time(state, datetime.datetime.now(datetime.timezone.utc))
    state.round += 1
    state.complete = False
    state.participants = dict.fromkeys(stay, 0)
    state.deadline = now + settings.timeout.last_call if len(stay) >= settings.min_nodes else None
    return True


def _state_time(state: Any, when: datetime.datetime) -> datetime.datetime:
    """``when`` (aware, UTC) in the kind of time ``state`` keeps: naive UTC before torch
    2.5 (``utcnow()``), aware after; aware where the state holds no time yet."""
    kept = next(iter(state.last_heartbeats.values()), None)
    if kept is None and isinstance(state.deadline, datetime.datetime):
        kept = state.deadline
    return when.replace(tzinfo=None) if kept is not None and kept.tzinfo is None else when


# how long after a round's last-call deadline the node that completes it (its rank 0 to
# be) has before the others may: they then do one after another over as long again
COMPLETER_GRACE_S = 3.0
COMPLETER_POLL_S = 1.0  # torch's join polls the state once a second


def complete_once(handler: RendezvousHandler) -> bool:
    """Have one node complete a round at its last-call deadline, not all of them.

    torch's join has every member of an open round whose deadline passed mark it complete
    (a compare-and-set of the whole state each) at its next one-second poll: at the
    deadline of a round of N nodes (an elastic first round, every re-formed one:
    ``reform_without``'s) up to N writes race, one wins, and the others read the state
    again to find the round complete. Here the member that will be the round's rank 0 (the
    first in torch's order) marks it, at the deadline itself (a poll that would pass it
    waits until it instead); member i of n (torch's order) only once the round is still
    open ``COMPLETER_GRACE_S * (1 + i / n)`` after the deadline (the first one lost or
    late), each syncing meanwhile as torch's waiting member does. False, changing nothing,
    where this torch's join is not as expected (private)."""
    dr = _dynamic_rendezvous()
    action: Any = getattr(dr, "_Action", None)
    join_op = getattr(dr, "_RendezvousJoinOp", None)
    executor = getattr(_torch_handler(handler), "_op_executor", None)
    keep_alive: Any = getattr(dr, "_should_keep_alive", None)
    if None in (action, join_op, executor, keep_alive) or not hasattr(
        action, "MARK_RENDEZVOUS_COMPLETE"
    ):
        return False

    def past_deadline_s(ctx: Any) -> float | None:
        """How long ago the deadline of the open round of which this node is a member
        passed (negative: still to come); None where it has none."""
        state = ctx.state
        if state.complete or state.deadline is None or ctx.node not in state.participants:
            return None
        now = _state_time(state, datetime.datetime.now(datetime.timezone.utc))
        return float((now - state.deadline).total_seconds())

    def first_of(nodes: Any, node: Any) -> bool:
        """Whether ``node`` is the first of ``nodes`` in torch's order: a look at each node
        only for the first one; any other meets one before it after a few, on average (a
        member polls once a second while the round waits for its deadline or its minimum)."""
        return not any(other < node for other in nodes)

    def completing(inner: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
        def state_handler(ctx: Any, deadline: float) -> Any:
            chosen = inner(ctx, deadline)
            past = past_deadline_s(ctx)
            if past is None or chosen not in (action.SYNC, action.MARK_RENDEZVOUS_COMPLETE):
                return chosen
            nodes = ctx.state.participants
            if chosen == action.SYNC:
                if -COMPLETER_POLL_S < past < 0 and first_of(nodes, ctx.node):
                    time.sleep(-past)  # the deadline, not the poll after it
                    return inner(ctx, deadline)
                return chosen
            if first_of(nodes, ctx.node):
                return chosen
            # member i > 0 of n waits COMPLETER_GRACE_S * (1 + i / n): its place (O(N)) is
            # counted only once no member's wait can have passed
            if past > COMPLETER_GRACE_S:
                place = sum(1 for node in nodes if node < ctx.node)  # in torch's order
                if past > COMPLETER_GRACE_S * (1 + place / len(nodes)):
                    return chosen
            return action.KEEP_ALIVE if keep_alive(ctx) else action.SYNC

        return state_handler

    _wrap_operation(executor, join_op, completing)
    return True


# what a wrapped operation keeps of the operation it wraps: its class
_OPERATION_KIND = "torch_operation"


def _wrap_operation(
    executor: Any, operation: Any, wrap: Callable[[Callable[[Any, float], Any]], Any]
) -> None:
    """Have torch's op executor run each ``operation`` (a state handler: join, exit) as
    ``wrap(operation)``, through a run put on it before (hold_joins' and
    leave_into_wait_list's chain: an operation wrapped once is wrapped again by each run
    of the chain that wraps its kind) or the class's. The class's is reached through a weak
    reference: a bound method kept on the executor would make a reference cycle that frees
    torch's handler and its store only at some later garbage collection (their sockets
    closed then, in whatever process runs at that moment: a forked worker's, say)."""
    put = vars(executor).get("run")
    if put is None:
        cls_run = type(executor).run
        executor_ref = weakref.ref(executor)
        put = lambda *args: cls_run(executor_ref(), *args)  # noqa: E731

    def run(state_handler: Any, deadline: float, *args: Any) -> Any:
        kind = getattr(state_handler, _OPERATION_KIND, type(state_handler))
        if issubclass(kind, operation):
            state_handler = wrap(state_handler)
            setattr(state_handler, _OPERATION_KIND, kind)
        return put(state_handler, deadline, *args)

    executor.run = run


def number_nodes_apart() -> None:
    """Number this process's rendezvous nodes from a random start, not 0 (once per process).
    torch tells nodes apart by address, process id and that number: a replacement container
    (the lost one's host name, its agent the same pid, 1 in a container) would otherwise be
    taken for the node it replaces, still in the round."""
    global _numbered_apart
    handler_class = getattr(_dynamic_rendezvous(), "DynamicRendezvousHandler", None)
    generator: Any = getattr(handler_class, "_node_desc_generator", None)
    lock = getattr(generator, "_lock", None)
    if lock is None or not isinstance(getattr(generator, "_local_id", None), int):
        return
    with lock:
        if not _numbered_apart:
            generator._local_id += secrets.randbelow(2**31)
            _numbered_apart = True


_numbered_apart = False


def node_address(node: Any) -> str:
    """The address a node published (torch's node descriptor)."""
    return str(getattr(node, "addr", "?"))


def node_name(node: Any) -> str:
    return f"{getattr(node, 'addr', '?')} (agent pid {getattr(node, 'pid', '?')})"


def node_id(node: Any) -> str:
    """torch's id of a node (``addr_pid_localid``): unique, unlike its address and pid."""
    return str(node)


def round_node_ids(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> torch's id of each member of the handler's last known round."""
    _, participants, _ = _participants(handler)
    return {rank: node_id(node) for node, rank in participants.items()}


def this_node_key(handler: RendezvousHandler) -> NodeKey | None:
    """This node's torch descriptor: (address, process id, number in its process)."""
    node, _, _ = _participants(handler)
    return None if node is None else (str(node.addr), int(node.pid), int(node.local_id))


def this_node_id(handler: RendezvousHandler) -> str | None:
    this_node, _, _ = _participants(handler)
    return None if this_node is None else node_id(this_node)


def expire_nodes(handler: RendezvousHandler, node_ids: set[str]) -> bool:
    """Drop the nodes ``node_ids`` from the rendezvous now, as torch drops a node whose
    heartbeats are stale: their last heartbeat is set to the epoch and the state written
    back (every node's next sync then removes them); a complete round they were members of
    is re-formed without them in the same write (:func:`reform_without`). False when this
    torch's handler does not offer what it takes (nothing is changed)."""
    dr = _dynamic_rendezvous()
    torch_handler = _torch_handler(handler)
    executor: Any = getattr(torch_handler, "_op_executor", None)
    holder: Any = getattr(torch_handler, "_state_holder", None)
    lock: Any = getattr(torch_handler, "_heartbeat_lock", None)
    action: Any = getattr(dr, "_Action", None)
    if None in (executor, holder, lock, action) or not hasattr(holder, "mark_dirty"):
        return False
    epoch = datetime.datetime.fromtimestamp(0, datetime.timezone.utc)

    def expire(ctx: Any, deadline: float) -> Any:
        beats = ctx.state.last_heartbeats
        doomed = [n for n in beats if node_id(n) in node_ids]
        if not doomed:
            return action.FINISH  # dropped (this sync's own clean-up, or another node's)
        for node in doomed:
            beats[node] = _state_time(ctx.state, epoch)
        reform_without(ctx.state, doomed, ctx.settings)
        holder.mark_dirty()
        # written at once with this node's own heartbeat where it has one (a sync waits 1 s)
        return action.KEEP_ALIVE if ctx.node in beats else action.SYNC

    with lock:
        executor.run(expire, time.monotonic() + 10.0)
    return True


def round_members(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> "addr (agent pid N)" of the handler's last known round, if it tells."""
    _, participants, _ = _participants(handler)
    return {rank: node_name(node) for node, rank in participants.items()}


def round_addresses(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> the address each member of the handler's last known round published."""
    _, participants, _ = _participants(handler)
    return {rank: str(getattr(node, "addr", "?")) for node, rank in participants.items()}


def this_node_address(handler: RendezvousHandler) -> str | None:
    """The address this node published in the handler's rendezvous."""
    this_node, _, _ = _participants(handler)
    addr = getattr(this_node, "addr", None)
    return None if addr is None else str(addr)


def handler_store(handler: RendezvousHandler) -> Any:
    """The store torch's dynamic rendezvous handler runs on (None if it does not tell)."""
    return getattr(_torch_handler(handler), "_store", None)


def stop_heartbeats(handler: RendezvousHandler) -> None:
    """Stop the keep-alive heartbeats of a rendezvous this node leaves without closing it
    (its host is lost, or the agent stops on a signal), without waiting for them.

    torch's timer stops through a finalizer that joins its thread: its ``cancel()`` may wait
    on a lost host for the store's whole timeout, and where the garbage collector drops the
    handler on the timer's own thread the join fails ("cannot join current thread", printed
    at the end of an agent stopped by a signal). Here the finalizer is detached (nothing
    joins the thread any more) and the thread told to end after its current heartbeat."""
    timer = getattr(_torch_handler(handler), "_keep_alive_timer", None)
    finalizer = getattr(timer, "_finalizer", None)
    if not isinstance(finalizer, weakref.finalize):
        return  # no timer started, or another release's: it ends with the process
    detached = finalizer.detach()
    if detached is not None:  # (timer, _stop_thread, (thread, stop_event), {})
        _, _, (_, stop_event), _ = detached
        stop_event.set()


KEEP_ALIVE_FAILED = "has failed to send a keep-alive heartbeat"


def quiet_keep_alive_failures() -> None:
    """Drop torch's warning for each keep-alive heartbeat that failed: where the agent moves
    a lost rendezvous, it says so itself (its heartbeats fail until then, and once more
    after, when the call that waited on the lost host ends)."""
    logger = logging.getLogger(_dynamic_rendezvous().__name__)
    if not any(isinstance(f, _Without) for f in logger.filters):
        logger.addFilter(_Without(KEEP_ALIVE_FAILED))


class _Without(logging.Filter):
    """Drops the log records whose message contains a text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self._text not in record.getMessage()


def state_node_ids(handler: RendezvousHandler) -> list[str]:
    """torch's ids of every node in the handler's last synced rendezvous state (the round's
    participants, its wait list and redundancy list), sorted: the same list on every node
    that synced the same state."""
    state = getattr(getattr(_torch_handler(handler), "_state_holder", None), "state", None)
    nodes = set(getattr(state, "participants", None) or {})
    nodes |= set(getattr(state, "wait_list", None) or ())
    nodes |= set(getattr(state, "redundancy_list", None) or ())
    return sorted(node_id(node) for node in nodes)


def state_round(handler: RendezvousHandler) -> int:
    """The round number of the handler's last synced rendezvous state (0 where unknown)."""
    state = getattr(getattr(_torch_handler(handler), "_state_holder", None), "state", None)
    number = getattr(state, "round", 0)
    return number if isinstance(number, int) else 0


def expire_in_state(
    backend: Any, handler: RendezvousHandler, node_ids: set[str], attempts: int, backoff_s: float
) -> bool:
    """Drop ``node_ids`` from the rendezvous state as :func:`expire_nodes` does, from another
    thread than the handler's: through ``backend`` (one of the caller's own) and a state
    holder of its own (torch's ``_BackendRendezvousStateHolder``, private) with the handler's
    settings, so nothing of the handler's join is touched (the round re-formed in the same
    write, as there; the nodes that read the state at their pace told so through
    ``backend``'s counter where it has one). A write that lost to another node's is
    retried on the state it met, after a jittered wait (up to ``backoff_s`` doubled each
    time), ``attempts`` times at most. Whether the nodes are out of the state; False also
    where this torch has no such holder."""
    holder_class = getattr(_dynamic_rendezvous(), "_BackendRendezvousStateHolder", None)
    settings = getattr(_torch_handler(handler), "_settings", None)
    if holder_class is None or settings is None:
        return False
    holder = holder_class(backend, settings, cache_duration=0)
    epoch = datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    holder.sync()
    for attempt in range(attempts):
        # the state read, or the one a lost write met (torch's compare-and-set returns it):
        # not read again (a state of 1,000 nodes is 100 KB, and verdicts race joins)
        beats = holder.state.last_heartbeats
        doomed = [node for node in beats if node_id(node) in node_ids]
        if not doomed:
            return True  # dropped (by this sync's own clean-up, or another node's)
        for node in doomed:
            beats[node] = _state_time(holder.state, epoch)
        moved = reform_without(holder.state, doomed, settings)
        holder.mark_dirty()
        if holder.sync():
            if moved:  # the nodes that read the state at their pace read it at once
                getattr(backend, "mark_round_moved", lambda: None)()
            return True
        time.sleep(random.uniform(0.0, backoff_s * 2**attempt))
    return False


def heartbeats(handler: RendezvousHandler) -> dict[str, datetime.datetime]:
    """Node name -> its last keep-alive heartbeat (UTC, timezone-aware) in the handler's
    rendezvous state (torch before 2.5 keeps naive ``utcnow()`` times, later ones aware)."""
    state = getattr(getattr(_torch_handler(handler), "_state_holder", None), "state", None)
    beats = dict(getattr(state, "last_heartbeats", None) or {})
    return {
        node_name(node): when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)
        for node, when in beats.items()
    }


def freshest_peer_heartbeat_age_s(handler: RendezvousHandler) -> float | None:
    """Seconds since the newest keep-alive heartbeat of another node in the handler's state
    (synced from the store at each keep-alive): proof that peers reached the store."""
    this_node, _, _ = _participants(handler)
    own = node_name(this_node) if this_node is not None else None
    now = datetime.datetime.now(datetime.timezone.utc)
    beats = heartbeats(handler)
    ages = [(now - when).total_seconds() for name, when in beats.items() if name != own]
    return min(ages) if ages else None


def store_answer_age_s(handler: RendezvousHandler) -> float | None:
    """Seconds since the handler last read or wrote its rendezvous state in the store
    (torch's ``_BackendRendezvousStateHolder._last_sync_time``, monotonic; a read served from
    its one-second cache does not count): proof that the store answered this node. None
    before the first sync, or where this torch's handler does not tell."""
    holder = getattr(_torch_handler(handler), "_state_holder", None)
    synced_s = getattr(holder, "_last_sync_time", None)
    if isinstance(synced_s, bool) or not isinstance(synced_s, (int, float)) or synced_s < 0:
        return None
    return max(0.0, time.monotonic() - synced_s)


def peer_hosts(handler: RendezvousHandler) -> list[str]:
    """The hosts of the other members of the handler's last known round."""
    this_node, participants, _ = _participants(handler)
    this_addr = getattr(this_node, "addr", None)
    return sorted({str(n.addr) for n in participants if getattr(n, "addr", this_addr) != this_addr})


def dropped_from_round(handler: RendezvousHandler, was_alone: bool) -> bool:
    """Whether the handler's last synced rendezvous state leaves this node out while the
    others go on: a peer's sync dropped it for a late heartbeat (torch's ``_sanitize``).
    ``was_alone``: this node's round had no other member; then only a node in the rendezvous
    now can have dropped it (after a stall, its own sync drops it from its copy of the
    state, and nobody went on without it). False where this torch's handler does not tell."""
    this_node, participants, wait_list = _participants(handler)
    state = getattr(getattr(_torch_handler(handler), "_state_holder", None), "state", None)
    if this_node is None or state is None or getattr(state, "closed", False):
        return False
    if this_node in participants or this_node in wait_list:
        return False
    return bool(participants or wait_list) or not was_alone


def sync_now(handler: RendezvousHandler) -> None:
    """Read the rendezvous state from the store now: torch's handler serves a copy up to a
    second old (``_BackendRendezvousStateHolder``'s cache), which may not show yet what a
    peer wrote just before this node's ranks failed."""
    holder = getattr(_torch_handler(handler), "_state_holder", None)
    if isinstance(getattr(holder, "_last_sync_time", None), float):
        setattr(holder, "_last_sync_time", -1.0)  # noqa: B010
    handler.num_nodes_waiting()


def present_members(handler: RendezvousHandler) -> set[str]:
    """Nodes the handler knows to be in the rendezvous now (this node included)."""
    this_node, participants, wait_list = _participants(handler)
    nodes = [this_node, *participants, *wait_list]
    return {node_name(node) for node in nodes if node is not None}


def set_last_call_timeout(handler: RendezvousHandler, seconds: float) -> bool:
    """Make the c10d handler's later rounds complete ``seconds`` after the minimum of
    nodes joined (its ``last_call_timeout``, private once the handler exists); False,
    changing nothing, where this torch keeps it otherwise."""
    settings = getattr(_torch_handler(handler), "_settings", None)
    timeout = getattr(settings, "timeout", None)
    if not isinstance(getattr(timeout, "_last_call", None), datetime.timedelta):
        return False
    setattr(timeout, "_last_call", datetime.timedelta(seconds=seconds))  # noqa: B010
    return True


def job_ended(err: BaseException) -> bool:
    """Whether a rendezvous error says the rendezvous was closed: the job is over (torch
    2.5 on raises ``RendezvousGracefulExitError`` for a node that waited as a spare)."""
    from torch.distributed.elastic import rendezvous

    ended = (rendezvous.RendezvousClosedError,)
    graceful = getattr(rendezvous, "RendezvousGracefulExitError", None)
    return isinstance(err, ended + ((graceful,) if graceful else ()))


def stood_by(err: BaseException) -> bool:
    """Whether the rendezvous was closed while this node waited in it as a spare (torch 2.5
    on says so; 2.4's closed-rendezvous error reads as any node's that came late)."""
    from torch.distributed.elastic import rendezvous

    graceful = getattr(rendezvous, "RendezvousGracefulExitError", None)
    return graceful is not None and isinstance(err, graceful)


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine, as torch's c10d backend decides who hosts the
    store when ``is_host`` is not given (``rendezvous.utils._matches_machine_hostname``)."""
    from torch.distributed.elastic.rendezvous import utils

    matches = getattr(utils, "_matches_machine_hostname", None)
    if matches is not None:
        return bool(matches(host))
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def quiet_cpp_warnings() -> None:
    """torch's C++ warnings are not printed by this process (the agent's own, never a
    worker's: call it after the fork server is forked). A store call to a host that has left
    prints one with 25 lines of C++ frames, several per stop; the agent says what happened
    in its own words. ``TORCH_CPP_LOG_LEVEL``, when set, still decides."""
    if os.environ.get("TORCH_CPP_LOG_LEVEL"):
        return
    import ctypes

    import torch

    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    try:  # c10's log level (0 INFO, 1 WARNING, 2 ERROR), read by every C++ warning
        level = ctypes.c_int.in_dll(ctypes.CDLL(library), "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return  # another build of torch: its warnings are printed
    level.value = max(level.value, 2)


def accelerator_count(kind: str) -> int | None:
    """Devices of ``kind`` (``gpu``, ``xpu``, ``auto`` or a custom backend's name) on this
    node; 0 when that kind has none; None when torch has no such kind."""
    import torch

    if kind == "gpu":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu.device_count() if xpu is not None and xpu.is_available() else 0
    if kind == "auto":
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            return int(accelerator.device_count()) if accelerator.is_available() else 0
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    custom = torch._C._get_privateuse1_backend_name()
    if kind == custom and custom != "privateuseone":
        module = getattr(torch, custom, None)
        if module is None or not module.is_available():
            return 0
        return int(module.device_count())
    return None


def cuda_built() -> bool:
    """Whether this torch is a CUDA (or ROCm) build: only those can poison a fork."""
    import torch

    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def in_bad_cuda_fork() -> bool:
    """Whether this process was forked after its parent asked CUDA for its devices, so that
    it cannot use CUDA (``torch.cuda._is_in_bad_fork``, private)."""
    import torch

    is_bad = getattr(torch.cuda, "_is_in_bad_fork", None)
    return bool(is_bad()) if callable(is_bad) else False


_NO_DEVICE_QUERY = object()

# fields torch's LaunchConfig gained after 2.4, with torch's defaults (read where absent)
LAUNCH_CONFIG_DEFAULTS: dict[str, Any] = {
    "event_log_handler": "null",
    "signals_to_handle": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "duplicate_stdout_filters": None,
    "duplicate_stderr_filters": None,
    "virtual_local_rank": False,
    "shutdown_timeout": None,
}


def launch_config_fields(**values: Any) -> dict[str, Any]:
    """The values of fields this release's ``LaunchConfig`` has (2.4 has none of
    :data:`LAUNCH_CONFIG_DEFAULTS`); a value for a missing one must be torch's default."""
    from torch.distributed.launcher.api import LaunchConfig

    names = {f.name for f in dataclasses.fields(LaunchConfig)}
    for name, value in values.items():
        if name not in names and value != LAUNCH_CONFIG_DEFAULTS[name]:
            raise ValueError(f"{name}={value!r} needs a newer torch (this one has no such option)")
    return {name: value for name, value in values.items() if name in names}


def launch_config_value(config: Any, name: str) -> Any:
    """A field of torch's ``LaunchConfig``; torch's default where this release has none."""
    return getattr(config, name, LAUNCH_CONFIG_DEFAULTS[name])


def without_device_query(config: Any, post_init: Callable[[], None]) -> None:
    """Run torch's ``LaunchConfig.__post_init__`` without its device query: releases with
    ``numa_options`` ask ``torch.cuda`` (2.13) or ``torch.accelerator`` (2.15) whether the
    devices match ``nproc_per_node``, to pick default NUMA options (None outside Meta), which
    initializes the CUDA driver in the caller; every worker forked from the caller afterwards
    could not use CUDA. A placeholder in ``numa_options`` skips the query; None is put back."""
    if not hasattr(config, "numa_options") or config.numa_options is not None:
        post_init()
        return
    config.numa_options = _NO_DEVICE_QUERY
    try:
        post_init()
    finally:
        config.numa_options = None


def exit_barrier(store: Store, world_size: int, timeout_s: float) -> None:
    """Wait until every node of the round reached this barrier (or ``timeout_s`` passed)."""
    from torch.distributed.elastic.utils import store as store_util

    store_util.barrier(
        store=store,
        world_size=world_size,
        key_prefix=EXIT_BARRIER_PREFIX,
        barrier_timeout=timeout_s,
    )


def start_file_timer(path: str, run_id: str) -> Any:
    """torch's ``FileTimerServer`` on ``path`` (``TORCHELASTIC_ENABLE_FILE_TIMER=1``)."""
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerServer

    kwargs: dict[str, Any] = {"file_path": path, "max_interval": 0.1, "daemon": True}
    if "run_id" in inspect.signature(FileTimerServer).parameters:
        kwargs["run_id"] = run_id
    server = FileTimerServer(**kwargs)
    server.start()
    return server


def next_round(
    handler: RendezvousHandler, local_addr: str | None = None, single_node: bool = False
) -> Round:
    """The next rendezvous round, without torch's store shared by every attempt.

    torch's c10d handler (2.5 on) hosts one store on the rank-0 agent for the workers of
    every round unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; the agent hosts a fresh one
    per attempt instead (rendezvous/worker_store.py), so it sets torch's opt-out for the
    call only: the workers' environment does not get it. ``single_node``: the rendezvous
    admits one node at most (no skew before its first round, see :func:`no_first_round_skew`).
    """
    quick_rendezvous_events()
    saved = os.environ.get(SHARE_STORE_OPT_OUT_ENV)
    os.environ[SHARE_STORE_OPT_OUT_ENV] = "1"
    try:
        with no_first_round_skew(single_node):
            result = handler.next_rendezvous()
    finally:
        if saved is None:
            del os.environ[SHARE_STORE_OPT_OUT_ENV]
        else:
            os.environ[SHARE_STORE_OPT_OUT_ENV] = saved
    return round_of(result, local_addr)


@functools.cache
def torchrun_defaults() -> dict[str, Any]:
    """Flag (argparse dest) -> default of the installed torch's torchrun, without the
    ``PET_*`` variables (the agent's own parser applies those, as torchrun's does)."""
    from torch.distributed.run import get_args_parser

    saved = {key: value for key, value in os.environ.items() if key.startswith("PET_")}
    for key in saved:
        del os.environ[key]
    try:
        parser = get_args_parser()
    finally:
        os.environ.update(saved)
    defaults = vars(parser.parse_args(["script"]))  # a command line of defaults only
    return {key: value for key, value in defaults.items() if not key.startswith("training_")}


def wrap_group_registry(wrap: Callable[[dict[Any, Any]], dict[Any, Any]]) -> bool:
    """Replace torch's registry of live process groups (``_world.pg_map``: every group,
    whatever created it, is in it until destroyed) with ``wrap(registry)``; False, changing
    nothing, where this torch keeps it otherwise."""
    import torch.distributed.distributed_c10d as c10d

    registry = vars(c10d).get("_pg_map")
    read_by_world = getattr(getattr(c10d, "_world", None), "pg_map", None) is registry
    if not isinstance(registry, dict) or not read_by_world:
        return False
    setattr(c10d, "_pg_map", wrap(registry))  # noqa: B010
    return True


def keep_created_groups(kept: list[Any]) -> None:
    """Where :func:`wrap_group_registry` cannot: append to ``kept`` every process group that
    torch's public creators (``init_process_group``, ``new_group``) make from now on."""
    import torch.distributed as distributed
    import torch.distributed.distributed_c10d as c10d

    init = c10d.init_process_group
    new_group = c10d.new_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        if distributed.group.WORLD is not None:
            kept.append(distributed.group.WORLD)
        return result

    @functools.wraps(new_group)
    def kept_new_group(*args: Any, **kwargs: Any) -> Any:
        group = new_group(*args, **kwargs)
        if group is not None:
            kept.append(group)
        return group

    for module in (distributed, c10d):
        for name, old, new in (
            ("init_process_group", init, init_process_group),
            ("new_group", new_group, kept_new_group),
        ):
            if getattr(module, name, None) is old:
                setattr(module, name, new)


def tcp_store_on_socket(sock: socket.socket, host: str, port: int, **kwargs: Any) -> Any:
    """A ``TCPStore`` server listening on ``sock`` (bound to ``host:port``, listening)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    fd = sock.detach()
    try:
        try:
            return TCPStore(host, port, is_master=True, master_listen_fd=fd, **kwargs)
        except NotImplementedError:  # 2.4: "The libuv TCPStore backend does not support ..."
            return TCPStore(
                host, port, is_master=True, master_listen_fd=fd, use_libuv=False, **kwargs
            )
    except BaseException:
        try:
            os.close(fd)
        except OSError:
            pass
        raise


def _dynamic_rendezvous() -> Any:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    return dynamic_rendezvous


def quick_rendezvous_events() -> None:
    """Give the dynamic rendezvous the name of its event's caller from the frame itself.

    ``get_method_name(depth)`` is ``inspect.stack()[depth].function``: the name of the
    function ``depth`` frames up from it, found by building every frame's source context.
    """
    module = _dynamic_rendezvous()
    original = getattr(module, "get_method_name", None)
    if original is None or getattr(original, "_quick", False):
        return

    def get_method_name(depth: int = 2) -> str:
        frame = sys._getframe(1)  # the caller, inspect.stack()[1]
        for _ in range(depth - 1):
            if frame.f_back is None:
                return "no_method_name"
            frame = frame.f_back
        return frame.f_code.co_name

    get_method_name._quick = True  # type: ignore[attr-defined]
    module.get_method_name = get_method_name


@contextlib.contextmanager
def no_first_round_skew(single_node: bool) -> Iterator[None]:
    """Without the random sleep (0 to 0.3 s) that skews the nodes' first rendezvous apart,
    when there is only one node to skew; torch's other sleeps (a fixed time between polls)
    stay."""
    module = _dynamic_rendezvous()
    original = getattr(module, "_delay", None)
    if not single_node or original is None:
        yield
        return

    def delay(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple):
            original(seconds)

    module._delay = delay
    try:
        yield
    finally:
        module._delay = original


def unprefixed(store: Store) -> Store:
    """The store under a round's ``PrefixStore`` (torch's static backend prefixes the store
    it hands out with the run id)."""
    return store.underlying_store if isinstance(store, PrefixStore) else store
