"""A duplicate ``--node-rank`` with the static rendezvous, and a peer on another backend,
named by the nodes concerned.

torch's static backend takes each node's ``--node-rank`` on trust: two nodes given the same
rank start workers with the same global ranks, and the rank nobody took leaves the job
waiting for it (torchrun says nothing; the job hangs in ``init_process_group`` until its
timeout). After each static round every node claims its rank in the agents' store. A node
whose rank another node claimed first says so and stops; once as many claims as nodes are
in, a node that sees a rank claimed twice or not at all names them, with the hosts.

A static node also publishes itself in the roll call of the store it reached (roll_call.py),
as a c10d node does: a node started with ``--rdzv-backend c10d`` on the same endpoint (whose
store a static node of rank 1 reaches, or which reaches a static rank 0's) is named by both,
with the settings they disagree on, instead of each waiting for peers that never come.

Node rank 0 hosts the store, and torch's static handler blocks it until every other node
has connected, silently (torchrun's too): it says what it waits for, within seconds and then
at a growing interval, until the others came or the timeout.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous.diagnosis import (
    GrowingInterval,
    Problem,
    RendezvousDiagnosis,
    gives_up_at,
    say,
)
from torchx_elastic.agent.rendezvous.parameters import HOST_LINGER_S
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry, RollCall, settings_mismatch
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous
from torchx_elastic.contract import STATIC_RANK_KEY_PREFIX, WAITING_FOR_NODES

log = logging.getLogger(__name__)

CLAIMS_WAIT_S = 10.0  # a peer that claims nothing (torchrun's) only delays this check
FRESH_S = 60.0  # claims further apart than this are of different starts of the job
POLL_S = 0.1
FIX = "give each node its own --node-rank, 0 to --nnodes - 1"
T = TypeVar("T")


def host_waiting_line(config: AgentConfig, until: str) -> str:
    """What node rank 0 of a static rendezvous says while the others have not connected."""
    others = config.max_nodes - 1
    ranks = "1" if others == 1 else f"1 to {others}"
    timeout = f"{config.rdzv.static_timeout_s:g}"
    return (
        f"{WAITING_FOR_NODES}this node (--node-rank 0) hosts the static rendezvous at"
        f" {config.rdzv_endpoint} and waits for the other {others} node{'s' * (others > 1)}"
        f" (--node-rank {ranks}) to connect; gives up at {until} (--rdzv-conf timeout="
        f"{timeout})"
    )


def host_timed_out(config: AgentConfig, err: Exception) -> Problem:
    """Node rank 0's store gave up on the nodes that never connected (torch's
    ``Timed out after N seconds waiting for clients. K/M clients joined.``)."""
    joined = re.search(r"(\d+)/(\d+) clients joined", str(err))
    count = f"only {joined[1]} of {joined[2]}" if joined else "not all"
    timeout = f"{config.rdzv.static_timeout_s:g}"
    return Problem(
        f"{count} nodes connected to this node's static rendezvous within {timeout}s",
        f"start the missing node(s) with --rdzv-backend static --rdzv-endpoint"
        f" {config.rdzv_endpoint} and their own --node-rank, or raise the limit with"
        " --rdzv-conf timeout=SECONDS",
    )


def said_while_waiting(call: Callable[[], T], line: Callable[[], str]) -> T:
    """``call()``, saying ``line()`` at a growing interval (2 s, 4 s, ...) while it blocks."""
    done = threading.Event()

    def report() -> None:
        interval = GrowingInterval()
        while not done.wait(POLL_S):
            if interval.due():
                say(line())

    reporter = threading.Thread(target=report, name="StaticWaiting", daemon=True)
    reporter.start()
    try:
        return call()
    finally:
        done.set()
        reporter.join()


def duplicate(rank: int, first: str) -> Problem:
    return Problem(f"--node-rank {rank} is taken by {first}, which joined first", FIX)


def wrong_ranks(claimed_twice: dict[int, list[str]], missing: list[int], nodes: int) -> Problem:
    parts = [f"--node-rank {r} was given to {' and '.join(w)}" for r, w in claimed_twice.items()]
    if missing:
        parts.append(f"no node has --node-rank {', '.join(map(str, missing))} of {nodes}")
    return Problem("; ".join(parts), FIX)


def _claim(me: str, at: float) -> str:
    return json.dumps({"who": me, "at": at})


class UnreadableClaim(Exception):
    """A claim that is not ours (another program's key, another version): no verdict."""


def _read_claim(store: Any, key: str) -> tuple[str, float]:
    try:
        found = json.loads(store.get(key))
        return str(found["who"]), float(found["at"])
    except (ValueError, KeyError, TypeError) as err:
        raise UnreadableClaim(f"{key}: {err}") from None


def check_claims(
    store: Any,
    round_: int,
    rank: int,
    nodes: int,
    me: str,
    wait_s: float = CLAIMS_WAIT_S,
    clock: Callable[[], float] = time.time,
    named_meanwhile: Callable[[], Problem | None] = lambda: None,
) -> Problem | None:
    """Claim ``rank`` for ``me`` in round ``round_``; the problem with the job's node ranks,
    if there is one, or the one ``named_meanwhile()`` finds while this node waits for its
    peers' claims (a c10d node that published itself since: it claims nothing, names the
    mismatch itself and stops, and where it hosts the store it takes it away).

    Only claims made within ``FRESH_S`` of this one count: a node that replaces a lost one
    (a new pod of the same index) starts its rounds at 0 again and meets the claims its
    predecessor made at the job's start, which name no mistake."""
    at = clock()
    prefix = f"{STATIC_RANK_KEY_PREFIX}{round_}/"
    claim = int(store.add(f"{prefix}{rank}/count", 1))
    store.set(f"{prefix}{rank}/{claim}", _claim(me, at))
    claims = int(store.add(f"{prefix}count", 1))  # counted before all else: peers wait for it
    if claim > 1:
        first, first_at = _read_claim(store, f"{prefix}{rank}/1")
        return duplicate(rank, first) if abs(first_at - at) <= FRESH_S else None
    deadline = time.monotonic() + wait_s
    while claims < nodes:
        if time.monotonic() >= deadline:
            return None  # a peer that claims nothing: nothing to compare
        if (problem := named_meanwhile()) is not None:
            return problem
        time.sleep(POLL_S)
        claims = int(store.add(f"{prefix}count", 0))
    found = {
        r: [_read_claim(store, f"{prefix}{r}/{i}") for i in range(1, count + 1)]
        for r in range(nodes)
        if (count := int(store.add(f"{prefix}{r}/count", 0)))
    }
    if any(abs(when - at) > FRESH_S for entries in found.values() for _, when in entries):
        return None  # claims of an earlier start of the job: no verdict on this one
    claimed_twice = {r: [who for who, _ in e] for r, e in found.items() if len(e) > 1}
    missing = [r for r in range(nodes) if r not in found]
    if not claimed_twice and not missing:
        return None
    return wrong_ranks(claimed_twice, missing, nodes)


class CheckedStaticRanks(WrappedRendezvous):
    """The static handler, whose every round checks the nodes' ``--node-rank`` and whose
    node is in the store's roll call."""

    def __init__(
        self, handler: RendezvousHandler, config: AgentConfig, signer: StoreSigner
    ) -> None:
        super().__init__(handler)
        self._config = config
        self._signer = signer
        self._rounds = 0
        self._call: RollCall | None = None

    def next_rendezvous(self) -> RendezvousInfo:
        if self._rounds == 0 and self._config.rdzv.static_rank == 0:
            timeout_s = self._config.rdzv.static_timeout_s
            until = gives_up_at(timeout_s)
            try:
                info = said_while_waiting(
                    self.handler.next_rendezvous, lambda: host_waiting_line(self._config, until)
                )
            except RuntimeError as err:  # torch's DistStoreError
                if "waiting for clients" not in str(err):
                    raise
                raise RendezvousDiagnosis(
                    self._config.rdzv_endpoint, host_timed_out(self._config, err)
                ) from None
        else:
            info = self.handler.next_rendezvous()
        store, rank, nodes = compat.round_placement(info)
        me = NodeEntry.of_this_node(self._config)
        if self._call is None:
            self._call = self._publish(store, me)
        problem = self._mismatch()
        if problem is None:
            try:
                problem = check_claims(
                    store, self._rounds, rank, nodes, me.name, named_meanwhile=self._mismatch
                )
            except UnreadableClaim as err:  # nothing to name: the job goes on as torch's would
                log.warning("node ranks not checked: unreadable claim %s", err)
            problem = problem or self._mismatch()  # a peer that claimed nothing: c10d's?
        self._rounds += 1
        if problem is not None:
            if rank == 0:  # node rank 0 hosts the store: its peers read their claims there
                time.sleep(HOST_LINGER_S)
            raise RendezvousDiagnosis(self._config.rdzv_endpoint, problem)
        return info

    def _publish(self, store: Any, me: NodeEntry) -> RollCall | None:
        """This node in the roll call of the store under the round's (torch prefixes it
        with the run id), where c10d nodes publish themselves."""
        try:
            return RollCall(compat.unprefixed(store), me, self._signer)
        except Exception:  # noqa: BLE001 (an extra: the rendezvous goes on without it)
            log.warning("cannot publish this node in the roll call", exc_info=True)
            return None

    def _mismatch(self) -> Problem | None:
        if self._call is None:
            return None
        try:
            verified, _ = self._call.entries()
        except Exception:  # noqa: BLE001 (the store went away: nothing to compare)
            return None
        return settings_mismatch(verified, self._call.me)
