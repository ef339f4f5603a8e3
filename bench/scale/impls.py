"""The two simulated agents: torch's c10d rendezvous as torchrun drives it, and ours.

Each simulated node has its own ``TCPStore`` client (in a :class:`CountingStore`) and
its own rendezvous handler, built the way its agent builds it:

- ``torch``: torch's ``DynamicRendezvousHandler`` on torch's ``C10dRendezvousBackend``
  (``dynamic_rendezvous.create_handler``, what torchrun's c10d backend hands its agent),
  with torch's settings (keep-alive every 5 s, dead after 3 missed). Its loop is
  torchrun's: ``num_nodes_waiting()`` every monitor interval, a new round when it says a
  node waits.
- ``ours``: the agent's own ``create_handler(config, signer)`` on an ``AgentConfig`` parsed
  from the agent's command line (its keep-alive defaults, the signed state, the roll call
  and the waiting lines), the store swapped for the counted one; the round listener with
  the cross-node progress exchange (``JobProgressExchange``, fed one rank's steps);
  ``compat.next_round`` for every round (the agent's own rendezvous, rounds/handler.py,
  with the keyed liveness), and the checks of the supervision loop on healthy workers:
  ``num_nodes_waiting()``, ``membership.dropped_from_round``, ``SilentPeers.lost``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any, Protocol

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    dynamic_rendezvous,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from bench.scale.counting import CountingStore
from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous import membership

IMPLS = ("torch", "ours")
# what a node's tick asks for: a new round, and why (None: nothing to do)
Tick = tuple[str | None, list[str]]


@dataclasses.dataclass(frozen=True)
class Job:
    """What every node of one run shares."""

    host: str
    port: int
    run_id: str
    nodes: int
    min_nodes: int
    conf: dict[str, str]  # --rdzv-conf / torch's rendezvous config, given on the command line
    monitor_interval_s: float
    progress: bool = True  # ours: the cross-node progress exchange
    join_spread_s: float = 0.0  # the first joins spread over this long (0: all at once)
    # each harness process's sys.setswitchinterval: a thread waiting for the interpreter lock
    # wakes up once an interval, and a process holds hundreds of node threads where a real
    # node's has a few (Python's 0.005: hundreds of wake-ups per thread a second, the kernel's)
    switch_interval_s: float = 0.005

    def join_delay_s(self, index: int) -> float:
        """When node ``index`` first joins, after the start: spread evenly over
        ``join_spread_s`` in an order that mixes the harness processes' nodes."""
        return self.join_spread_s * (index * 7919 % self.nodes) / self.nodes

    @property
    def state_key(self) -> str:
        return f"torch.rendezvous.{self.run_id}"


class SimNode(Protocol):
    store: CountingStore
    handler: RendezvousHandler

    def join(self) -> tuple[int, int]:
        """The next round: (this node's rank, nodes in the round)."""

    def tick(self) -> Tick:
        """One check of the agent's loop while its workers are healthy."""


def torch_handler(handler: Any) -> Any:
    """The handler at the bottom of the agent's rendezvous layers (``torch_handler()``):
    torch's own for ``torch``, the agent's ``RoundsRendezvous`` for ``ours``."""
    bottom = getattr(handler, "torch_handler", None)
    return bottom() if callable(bottom) else handler


def rounds_of(handler: Any) -> Any:
    """The agent's own rendezvous under ``handler`` (None: torch's handler)."""
    from torchx_elastic.agent.rendezvous import membership

    return membership.rounds(handler)


def settings_of(handler: Any) -> dict[str, float]:
    """The handler's effective settings (read, not assumed): those of the agent's own
    rendezvous and its keyed liveness, or torch's (its private settings: the torch impl)."""
    own = rounds_of(handler)
    if own is not None:
        from torchx_elastic.agent.rendezvous import liveness

        keyed = liveness.keyed_liveness_of(handler)
        interval_s = keyed.interval_s if keyed is not None else 0.0
        attempts = round(keyed.dead_after_s / keyed.interval_s) if keyed is not None else 0
        return {
            "keep_alive_interval_s": interval_s,
            "keep_alive_max_attempt": attempts,
            "last_call_s": float(own.last_call_s),
            "reform_last_call_s": float(own.reform_last_call_s),
            "join_timeout_s": float(own.join_timeout_s),
            "min_nodes": own.min_nodes,
            "max_nodes": own.max_nodes,
        }
    settings = torch_handler(handler)._settings  # noqa: SLF001
    return {
        "keep_alive_interval_s": settings.keep_alive_interval.total_seconds(),
        "keep_alive_max_attempt": int(settings.keep_alive_max_attempt),
        "last_call_s": settings.timeout.last_call.total_seconds(),
        "join_timeout_s": settings.timeout.join.total_seconds(),
    }


def state_round(handler: Any) -> int:
    """The round of the node's last join: ours' own, torch's from its synced state."""
    own = rounds_of(handler)
    if own is not None:
        return int(own.state_round())
    return int(torch_handler(handler)._state_holder.state.round)  # noqa: SLF001


def dropped_from_round(handler: Any) -> bool:
    """Whether the rendezvous went on without this healthy node: ours, a watcher's verdict
    on it (``membership.dropped_from_round``); torch, its last synced state leaves it out
    while others are in it (a peer's sync dropped it for a late heartbeat: ``_sanitize``)."""
    from torchx_elastic.agent.rendezvous import membership

    if rounds_of(handler) is not None:
        return membership.dropped_from_round(handler)
    torch_own = torch_handler(handler)
    state = getattr(getattr(torch_own, "_state_holder", None), "state", None)
    this_node = getattr(torch_own, "_this_node", None)
    if this_node is None or state is None or getattr(state, "closed", False):
        return False
    participants, wait_list = state.participants or {}, state.wait_list or ()
    if this_node in participants or this_node in wait_list:
        return False
    return bool(participants or wait_list)


def forming_view(handler: Any, raw_store: Any) -> dict[str, Any]:
    """How far the rendezvous got, as this node sees it (the harness's report while a round
    forms). Ours: the round it waits in (or its last), the arrivals there and whether it is
    complete, read through ``raw_store`` (the node's uncounted client: not its traffic);
    torch: its last synced state (private)."""
    own = rounds_of(handler)
    if own is None:
        state = torch_handler(handler)._state_holder.state  # noqa: SLF001
        return {
            "round": int(state.round),
            "participants": len(state.participants),
            "wait_list": len(state.wait_list),
            "complete": bool(state.complete),
        }
    waiting_in = own._waiting_in  # noqa: SLF001
    rnd = waiting_in if waiting_in is not None else (own.round or 0)
    arrivals = int(raw_store.add(own.keys.count(rnd), 0))
    following = int(raw_store.add(own.keys.count(rnd + 1), 0))
    return {
        "round": rnd,
        "participants": arrivals,
        "wait_list": following,
        "complete": bool(raw_store.check([own.keys.done(rnd)])),
    }


class TorchNode:
    def __init__(self, job: Job, store: CountingStore, local_addr: str) -> None:
        self.store = store
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"{job.host}:{job.port}",
            run_id=job.run_id,
            min_nodes=job.min_nodes,
            max_nodes=job.nodes,
            local_addr=local_addr,
            **job.conf,
        )
        backend = C10dRendezvousBackend(store, job.run_id)
        self.handler = dynamic_rendezvous.create_handler(store, backend, params)

    def join(self) -> tuple[int, int]:
        _, rank, world_size = compat.round_placement(self.handler.next_rendezvous())
        return rank, world_size

    def tick(self) -> Tick:
        # torchrun's agent: SimpleElasticAgent._invoke_run on healthy workers
        if self.handler.num_nodes_waiting() > 0:
            return "membership", []
        return None, []


@contextlib.contextmanager
def _store_given(store: CountingStore) -> Iterator[None]:
    """The agent's ``create_handler`` with this node's counted client as the store it
    connects to (it would make a ``TCPStore`` client of the endpoint itself), and a second
    counted client of the node as its liveness' own connection."""
    from torchx_elastic.agent.rendezvous import handler as handler_module

    original = handler_module.rendezvous_store, handler_module.own_connection
    handler_module.rendezvous_store = lambda params, settings, endpoint: (store, False)
    handler_module.own_connection = lambda given: given.connect_again()
    try:
        yield
    finally:
        handler_module.rendezvous_store, handler_module.own_connection = original


def ours_config(job: Job) -> Any:
    """The agent's ``AgentConfig`` from its command line, as every node of the job has it."""
    from torchx_elastic.agent.config.cli import build_parser
    from torchx_elastic.agent.config.launch import config_from_args

    conf = ",".join(f"{k}={v}" for k, v in {"is_host": "false", **job.conf}.items())
    argv = [
        f"--nnodes={job.min_nodes}:{job.nodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={job.host}:{job.port}",
        f"--rdzv-id={job.run_id}",
        f"--rdzv-conf={conf}",
        f"--monitor-interval={job.monitor_interval_s}",
        "bench/short_job.py",
    ]
    return config_from_args(build_parser().parse_args(argv))


class OursNode:
    def __init__(self, job: Job, store: CountingStore, local_addr: str, config: Any) -> None:
        from torchx_elastic.agent.console.progress.channel import RankActivity
        from torchx_elastic.agent.console.progress.exchange import JobProgressExchange
        from torchx_elastic.agent.rendezvous import handler as handler_module
        from torchx_elastic.agent.rendezvous import liveness
        from torchx_elastic.agent.rendezvous.observed import ObservedRendezvous
        from torchx_elastic.agent.rendezvous.signed_store import StoreSigner, signed_rounds

        self.store = store
        self.config = dataclasses.replace(config, local_addr=local_addr)
        signer = StoreSigner(self.config.job_secret)
        with _store_given(store):
            created = handler_module.create_handler(self.config, signer, None)
        self.activity = RankActivity()
        self.exchange = JobProgressExchange(self.activity, None) if job.progress else None
        on_round: Any = lambda store, rank, nodes: None  # noqa: E731
        if self.exchange is not None:
            on_round = signed_rounds(self.exchange.start_round, signer)
        self.handler: Any = ObservedRendezvous(created, on_round)
        self._liveness = liveness
        self._silent = liveness.SilentPeers()
        self._members: dict[int, str] = {}
        self._rounds = 0
        self._step = 0
        self._stepped_s = 0.0

    def join(self) -> tuple[int, int]:
        rnd = compat.next_round(self.handler, self.config.local_addr)
        if self._rounds == 0:  # as the supervision loop: later rounds re-form quicker
            self._liveness.shorten_reform_last_call(self.handler, self.config.rdzv)
        self._rounds += 1
        self._members = membership.round_members(self.handler)
        self._silent.new_round(self.handler)
        if self.exchange is not None:
            self.activity.new_attempt(self._rounds)
            self.exchange.set_ranks({0: rnd.rank})
        return rnd.rank, rnd.world_size

    def tick(self) -> Tick:
        # the supervision loop's checks on healthy workers (Supervisor._supervise)
        waiting = self.handler.num_nodes_waiting()
        if membership.dropped_from_round(self.handler):
            return "dropped", []
        lost = self._silent.lost(self._members, self.handler)
        if lost:
            return "lost", sorted(lost.values())
        if waiting > 0:
            return "membership", []
        now_s = time.monotonic()
        if self.exchange is not None and now_s - self._stepped_s >= 1.0:  # a rank's step a second
            self._step += 1
            self._stepped_s = now_s
            self.activity.progress(0, self._rounds, self._step, None)
        return None, []

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()
