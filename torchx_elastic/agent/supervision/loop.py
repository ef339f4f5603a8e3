"""The agent's supervision loop, on torch's public rendezvous API.

One :class:`Supervisor` per agent run: rendezvous (``next_rendezvous()``), assign the
workers' ranks, start them (:class:`WorkerProcesses`), watch them every
``monitor_interval_s``, restart the group on a failure (up to ``max_restarts``) or when nodes
wait to join (``num_nodes_waiting()``, which costs no restart), and on success wait for the
other nodes at the exit barrier. The same states and decisions as torch's
``SimpleElasticAgent._invoke_run``, written against public classes only.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from torch.distributed.distributed_c10d import Store
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.api import (
    LogsSpecs,
    RunProcsResult,
    SignalException,
)
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.console.failure.first_failure import (
    LOST_NODE,
    FirstFailure,
    RestartNotice,
    lost_node_line,
    not_retried_line,
)
from torchx_elastic.agent.console.output.agent_line import say
from torchx_elastic.agent.console.output.sinks import OutputSink, RankOutput
from torchx_elastic.agent.rendezvous import listen, liveness, membership
from torchx_elastic.agent.rendezvous.failover import HostLost
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.worker_store import WorkerStoreHost
from torchx_elastic.agent.supervision import replacements, restart_budget, worker_ranks
from torchx_elastic.agent.supervision.health_check import HealthCheck
from torchx_elastic.agent.supervision.network_watch import ABANDON_GRACE_S
from torchx_elastic.agent.supervision.peer_presence import PeerPresence
from torchx_elastic.agent.supervision.stop_signals import (
    absorb_stop_signals,
    stopped_before_joining,
    stopping,
)
from torchx_elastic.agent.supervision.watchdog import HangWatchdog
from torchx_elastic.agent.workers import bootstrap
from torchx_elastic.agent.workers.bootstrap import DUMP_STACKS_SIGNAL
from torchx_elastic.agent.workers.forkserver import ForkServer
from torchx_elastic.agent.workers.janitor import Janitor
from torchx_elastic.agent.workers.processes import WorkerProcesses
from torchx_elastic.contract import (
    AGENT_PID_ENV,
    FILE_TIMER_ENV,
    MAX_RESTARTS_ENV,
    RESTART_COUNT_ENV,
    RUN_ID_ENV,
    TIMER_FILE_ENV,
    USE_AGENT_STORE_ENV,
)
from torchx_elastic.contract import events as ev
from torchx_elastic.contract.error_file import write_error_file
from torchx_elastic.contract.events import EventLog

log = logging.getLogger(__name__)

SinkFactory = Callable[[list[RankOutput]], OutputSink]
STACK_DUMP_WAIT_S = 1.0
ABANDON_POLL_S = 0.05  # whether the abandoned workers exited on SIGTERM
SUSPECT_POLL_S = 0.5  # the rendezvous state, while a silent peer may be about to be dropped


class Workers(Protocol):
    """One attempt's worker processes, as the loop uses them (:class:`WorkerProcesses`)."""

    @property
    def error_files(self) -> Mapping[int, str]: ...

    def start(self) -> None: ...

    def pids(self) -> dict[int, int]: ...

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None: ...

    def close(self, death_sig: signal.Signals | None = None, timeout: int = 30) -> None: ...

    def signal_workers(self, sig: int) -> None: ...

    def any_running(self) -> bool: ...


# makes one attempt's Workers, with WorkerProcesses' keyword arguments (WorkerProcesses itself)
WorkersFactory = Callable[..., Workers]


@dataclass(frozen=True)
class WorkerRank:
    local_rank: int
    global_rank: int
    role_rank: int
    world_size: int
    role_world_size: int


@dataclass(frozen=True)
class Group:
    """The workers of one rendezvous round on this node."""

    round: compat.Round
    workers: tuple[WorkerRank, ...]
    master_addr: str  # the workers' store of this round
    master_port: int


OnFailure = Callable[
    [RunResult, int, Callable[[], FirstFailure | None] | None], FirstFailure | None
]


@dataclass
class Supervision:
    """How the agent watches its workers beyond their exit codes."""

    janitor: Janitor | None = None
    watchdog: HangWatchdog | None = None
    fork_server: ForkServer | None = None
    signer: StoreSigner | None = None  # of the job's store entries; None: unauthenticated
    # (result, attempt, a lost peer found while waiting) -> the job's first failure, agreed
    # with the other nodes
    on_failure: OnFailure | None = None
    # (the lost host's news, the last round's addresses by node rank) -> the line that says
    # where the rendezvous went (rendezvous/failover.py); None: a lost host ends the node
    move_rendezvous: Callable[[HostLost, dict[int, str]], str] | None = None
    on_rendezvous_lost: Callable[[], None] = lambda: None  # before the workers' end
    # the pids of an attempt's workers, once started (the worker channel hears them)
    workers_started: Callable[[Iterable[int]], None] = lambda pids: None
    health_check: HealthCheck | None = None  # run before each round this node would join
    presence: PeerPresence | None = None  # this node's presence port, its peers' (multi-node)


def assign_ranks(
    store: Store, group_rank: int, group_world_size: int, config: AgentConfig
) -> tuple[WorkerRank, ...]:
    """Global and role ranks of this node's workers, as torch's agent assigns them."""
    nproc = config.nproc_per_node
    base, world_size, role_base, role_world_size = worker_ranks.assign_worker_ranks(
        store, group_rank, group_world_size, config.role, nproc
    )
    return tuple(
        WorkerRank(i, base + i, role_base + i, world_size, role_world_size) for i in range(nproc)
    )


def worker_envs(
    config: AgentConfig, group: Group, restart_count: int, run_id: str, use_agent_store: bool
) -> dict[int, dict[str, str]]:
    """torchrun's environment of every local worker, by local rank."""
    rnd = group.round
    envs: dict[int, dict[str, str]] = {}
    for worker in group.workers:
        env = {
            "RANK": str(worker.global_rank),
            "LOCAL_RANK": str(worker.local_rank),
            "GROUP_RANK": str(rnd.rank),
            "ROLE_RANK": str(worker.role_rank),
            "ROLE_NAME": config.role,
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "WORLD_SIZE": str(worker.world_size),
            "GROUP_WORLD_SIZE": str(rnd.world_size),
            "ROLE_WORLD_SIZE": str(worker.role_world_size),
            "MASTER_ADDR": group.master_addr,
            "MASTER_PORT": str(group.master_port),
            RESTART_COUNT_ENV: str(restart_count),
            MAX_RESTARTS_ENV: str(config.max_restarts),
            RUN_ID_ENV: run_id,
            USE_AGENT_STORE_ENV: str(use_agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "PYTHONUNBUFFERED": os.getenv("PYTHONUNBUFFERED", "1"),
            AGENT_PID_ENV: str(os.getpid()),
        }
        if "OMP_NUM_THREADS" in os.environ:
            env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if config.virtual_local_rank:
            env["LOCAL_RANK"] = "0"
            devices = visible.split(",") if visible is not None else None
            if devices is not None and worker.local_rank >= len(devices):
                raise ValueError(
                    f"local_rank {worker.local_rank} exceeds available GPUs in"
                    f" CUDA_VISIBLE_DEVICES={visible}"
                )
            env["CUDA_VISIBLE_DEVICES"] = (
                devices[worker.local_rank].strip() if devices else str(worker.local_rank)
            )
        elif visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        envs[worker.local_rank] = env
    return envs


class Supervisor:
    """Runs the worker group of this node until it succeeds, fails or is stopped."""

    def __init__(
        self,
        config: AgentConfig,
        handler: RendezvousHandler,
        logs_specs: LogsSpecs,
        make_sink: SinkFactory,
        events: EventLog,
        worker_extra_env: dict[str, str],
        supervision: Supervision,
        make_workers: WorkersFactory = WorkerProcesses,
    ) -> None:
        """``make_workers``: the workers of each attempt (a test passes fakes)."""
        self.config = config
        self.handler = handler
        self._logs_specs = logs_specs
        self._make_sink = make_sink
        self._events = events
        self._extra_env = worker_extra_env
        self._supervision = supervision
        self._make_workers = make_workers
        self.restarts_spent = 0  # the job's, agreed over the store (restart_budget.py)
        self._silent_peers = liveness.SilentPeers()
        self.last_round_members: dict[int, str] = {}
        self.last_round_addresses: dict[int, str] = {}  # node rank -> published address
        self._rounds = 0  # rendezvous rounds this node completed
        self.largest_world = 0  # nodes in the largest round this node took part in
        self._exits_seen: int | None = None  # the fork server's count at the last check
        self._group: Group | None = None
        self._workers: Workers | None = None
        self._file_timer: Any = None
        self._timer_file: str | None = os.environ.get(TIMER_FILE_ENV)
        # as torchrun: the workers use an agent-hosted store where torchrun's would
        self._use_agent_store = bool(handler.use_agent_store)
        single_host = listen.is_loopback_host(config.rdzv_endpoint.host)
        self._worker_store = WorkerStoreHost(
            handler.get_backend(), supervision.signer or StoreSigner(None), single_host
        )
        if single_host:  # gloo's own listeners too: on loopback, unless told otherwise
            self._extra_env = {**listen.loopback_worker_env(), **worker_extra_env}

    @property
    def last_round(self) -> compat.Round | None:
        """The last rendezvous round this node took part in (None before the first)."""
        return self._group.round if self._group is not None else None

    @property
    def attempt(self) -> int:
        """0 for the first start of the workers, +1 for each restart of the job after a
        failure, whichever node failed (a node that joins late learns the count)."""
        return self.restarts_spent

    @property
    def remaining_restarts(self) -> int:
        return max(0, self.config.max_restarts - self.restarts_spent)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> RunResult:
        try:
            return self._run()
        except SignalException as err:
            absorb_stop_signals()  # the scheduler's next signals must not cut the shutdown short
            sig = signal.Signals(err.sigval)
            if self.last_round is None:
                line = stopped_before_joining(sig)
            else:
                grace_s = self.config.shutdown_timeout_s if self._workers is not None else None
                line = stopping(sig, grace_s)
            say(line)
            if self._supervision.presence is not None:
                self._supervision.presence.leave()  # before its ranks' end reaches the peers
            self.stop_workers(sig)  # the workers get the same signal
            raise
        finally:
            self.stop_workers()
            self._worker_store.close()
            if self._file_timer is not None:
                self._file_timer.stop()

    def _run(self) -> RunResult:
        lost: HostLost | None = None
        while True:
            try:
                if lost is None:
                    self._start_round()
                else:
                    self._follow_the_rendezvous(lost)
                return self._supervise()
            except HostLost as err:
                lost = err

    def _follow_the_rendezvous(self, lost: HostLost) -> None:
        """The rendezvous host is lost: stop the workers, move the rendezvous to a survivor
        and re-form there (a membership change: no restart counted)."""
        move = self._supervision.move_rendezvous
        if move is None:
            raise RendezvousError(str(lost))
        # workers blocked in a collective with the lost host may not heed SIGTERM for long
        self.abandon_workers(ABANDON_GRACE_S)
        self._supervision.on_rendezvous_lost()
        self.stop_workers()
        say(move(lost, self.last_round_addresses))
        self._restart(ev.RESTART_HOST_LOST, lost=str(lost), next_round=self._rounds + 1)

    def _supervise(self) -> RunResult:
        while True:
            self._pause()
            result = self._monitor()
            if result.state == WorkerState.SUCCEEDED:
                self._exit_barrier()
                return result
            if result.state in (WorkerState.UNHEALTHY, WorkerState.FAILED):
                if self._failed_with_lost_peers():
                    continue
                self._record_failure(result)
                last = self.remaining_restarts <= 0
                self.stop_workers()
                on_failure, presence = self._supervision.on_failure, self._supervision.presence
                lost_peer = presence.lost_peer if presence is not None else None
                first = on_failure(result, self.attempt, lost_peer) if on_failure else None
                if first is not None and first.how == LOST_NODE:
                    self._reform_without_lost(first)  # agreed by every node: none counts
                    continue
                if first is not None and not first.retried:
                    if first.node == (self._group.round.rank if self._group else 0):
                        say(not_retried_line(first, self.remaining_restarts))
                    return result
                if last:
                    return result
                self.restarts_spent += 1  # on every node alike; a late joiner reads it
                restart_budget.raise_to(membership.handler_store(self.handler), self.restarts_spent)
                notice = RestartNotice(
                    first, self.attempt, self.config.max_restarts, self._rounds + 1
                )
                if notice.said_by(self._group.round.rank if self._group else 0):
                    say(notice.line())
                self._restart(ev.RESTART_AFTER_FAILURE, **notice.fields())
            else:  # membership changes cost no restart
                waiting = self.handler.num_nodes_waiting()  # syncs the rendezvous state
                if self._rejoined_after_being_dropped() or self._restarted_for_lost_peers():
                    continue
                if waiting > 0:
                    self._restart(ev.RESTART_MEMBERSHIP_CHANGE, next_round=self._rounds + 1)

    def _reform_without_lost(self, lost: FirstFailure) -> None:
        """The job's first failure was a node whose agent vanished (the presence port): its
        peers' ranks failed only with it. As torch's agent counts a membership change, this
        spends no restart: the survivors re-form (a standby takes its place), said once."""
        rank = self._group.round.rank if self._group else 0
        next_round = self._rounds + 1
        if RestartNotice(lost, self.attempt, self.config.max_restarts, next_round).said_by(rank):
            say(lost_node_line(lost, self.remaining_restarts, next_round))
        self._restart(ev.RESTART_PEER_LOST, lost=[lost.message], next_round=next_round)

    def _pause(self) -> None:
        """``monitor_interval_s`` between checks, cut short when a forked worker exits (the
        fork server reports each exit as it happens)."""
        fork_server = self._supervision.fork_server
        if fork_server is None or self._exits_seen is None:
            time.sleep(self.config.monitor_interval_s)
        else:
            fork_server.wait_for_exits(self._exits_seen, self.config.monitor_interval_s)
        self._exits_seen = fork_server.exits() if fork_server is not None else None

    def _restart(self, reason: str, **facts: Any) -> None:
        self._events.emit(ev.RESTART, attempt=self.attempt, reason=reason, **facts)
        self.stop_workers()
        self._start_round()

    def _failed_with_lost_peers(self) -> bool:
        """This node's ranks failed because a peer stopped answering: re-formed. While a
        member of the round is silent but not dropped yet, wait for the rendezvous' verdict
        (at most the dead-after time). A store gone with a rendezvous that can move is the
        host's loss (``HostLost`` from the movable handler: the loop follows it)."""
        deadline_s = time.monotonic() + self.config.rdzv.dead_after_s
        while True:
            try:
                self.handler.is_closed()  # the store still answers
            except (RendezvousError, RuntimeError):  # it is gone: the workers' failure is the news
                return False
            if self._rejoined_after_being_dropped() or self._restarted_for_lost_peers():
                return True
            members = self.last_round_members
            if time.monotonic() > deadline_s or not self._silent_peers.suspects(
                members, self.handler
            ):
                return False
            time.sleep(SUSPECT_POLL_S)

    def _rejoined_after_being_dropped(self) -> bool:
        """The other nodes dropped this one from the rendezvous (its heartbeats reached them
        late) and went on without it, while its workers ran on alone: stop them and join
        again (a membership change: no restart counted), said in one line. torch's agent
        does not look: its node trains on in a job of its own."""
        if not membership.dropped_from_round(self.handler):
            return False
        say(liveness.dropped_line(self.config.rdzv.dead_after_s))
        self._restart(ev.RESTART_DROPPED, next_round=self._rounds + 1)
        return True

    def _restarted_for_lost_peers(self) -> bool:
        """Re-form without the members of the round that the rendezvous dropped for missing
        heartbeats (a membership change: no restart counted); one line says so, from each
        survivor that sees it (read once the job moved past this node's round)."""
        lost = self._silent_peers.lost(self.last_round_members, self.handler)
        if not lost:
            return False
        stopped = self._silent_peers.stopped
        say(liveness.lost_peer_line(lost, self.config.rdzv.dead_after_s, stopped))
        lost_names = liveness.node_names(lost)
        self._restart(ev.RESTART_PEER_LOST, lost=lost_names, next_round=self._rounds + 1)
        return True

    def _start_round(self) -> None:
        check = self._supervision.health_check
        if check is not None:
            run = check.run(self._rounds + 1)
            self._events.emit(ev.HEALTH_CHECK, **run.facts())
            if not run.passed:
                raise check.failure(run)
        rnd, workers = self._join_round()
        master_addr = self.config.master_addr or rnd.master_addr
        master_port = self.config.master_port or rnd.master_port
        if self._use_agent_store:
            master_addr, master_port = self._worker_store.address(rnd, master_addr, master_port)
        self._group = Group(rnd, workers, master_addr, master_port)
        members = membership.round_members(self.handler)
        self._tell_replacements(self.last_round_members, members, rnd.rank, rnd.world_size)
        self.last_round_members = members
        self.last_round_addresses = membership.round_addresses(self.handler)
        self.largest_world = max(self.largest_world, rnd.world_size)
        self._silent_peers.new_round(self.handler)
        if self._supervision.presence is not None:
            self._supervision.presence.new_round(self.handler, rnd)
        self._rounds += 1
        self._events.node = rnd.rank
        self._events.emit(
            ev.RENDEZVOUS,
            attempt=self.attempt,
            round=self._rounds,
            group_world_size=rnd.world_size,
            ranks=[w.global_rank for w in workers],
            master=f"{master_addr}:{master_port}",
        )
        self._start_workers(self._group)

    def _join_round(self) -> tuple[compat.Round, tuple[WorkerRank, ...]]:
        """The next round, and the ranks of this node's workers in it. A round whose store
        fails as its nodes assign their ranks is left: where the store went with its host,
        the movable handler raises ``HostLost`` (the loop follows the rendezvous); where it
        answers, a member never came to the assignment (it went on to a later round, or is
        gone): this node joins the next round, a membership change, said in one line (a
        static rendezvous has one round: its error ends the agent, as under torchrun)."""
        while True:
            # the job's restart count: raised to this node's before it joins, read once the
            # round is complete (every member raised it by then)
            store = membership.handler_store(self.handler)
            restart_budget.raise_to(store, self.restarts_spent)
            rnd = compat.next_round(self.handler, self.config.local_addr)
            held = restart_budget.raise_to(store, self.restarts_spent)
            self.restarts_spent = max(self.restarts_spent, held or 0)
            if self._rounds == 0:  # the first round's last call is the user's (torch's 30 s)
                liveness.shorten_reform_last_call(self.handler, self.config.rdzv)
            try:
                return rnd, assign_ranks(rnd.store, rnd.rank, rnd.world_size, self.config)
            except RuntimeError as err:  # torch's store errors (DistNetworkError, DistStoreError)
                self.handler.is_closed()  # HostLost where the store is gone with its host
                if self.config.rdzv_backend == "static":  # its one round cannot re-form
                    raise
                say(round_not_started_line(err))
                self._events.emit(
                    ev.RESTART,
                    attempt=self.attempt,
                    reason=ev.RESTART_MEMBERSHIP_CHANGE,
                    next_round=self._rounds + 1,
                )

    def _tell_replacements(
        self, before: dict[int, str], after: dict[int, str], rank: int, world: int
    ) -> None:
        """Which node took the place of which, on one node of the new round."""
        pairs = replacements.replacements(before, after)
        if pairs and replacements.teller(before, after) == rank:
            say(replacements.replaced_line(self._rounds + 1, pairs, world))
            self._events.emit(
                ev.REPLACED, round=self._rounds + 1, replaced=[p.facts() for p in pairs]
            )

    def _start_workers(self, group: Group) -> None:
        config = self.config
        run_id = self.handler.get_run_id()
        envs = worker_envs(config, group, self.attempt, run_id, self._use_agent_store)
        self._start_file_timer(run_id)
        for env in envs.values():
            env.update(self._extra_env)
            if self._timer_file is not None:
                env[TIMER_FILE_ENV] = self._timer_file
        run_bootstrap = bootstrap.command_args(config.worker.python_exec)
        target = config.worker.target
        args = {
            w.local_rank: (*run_bootstrap, *substitute_local_rank(target, w.local_rank))
            for w in group.workers
        }
        by_local = {w.local_rank: w for w in group.workers}

        def make_sink(stdouts: dict[int, str], stderrs: dict[int, str]) -> OutputSink:
            return self._make_sink(
                [
                    RankOutput(
                        local_rank=local_rank,
                        global_rank=by_local[local_rank].global_rank,
                        node_rank=group.round.rank,
                        stdout_path=stdouts[local_rank],
                        stderr_path=stderrs[local_rank],
                    )
                    for local_rank in sorted(by_local)
                ]
            )

        self._workers = self._make_workers(
            name=config.role,
            entrypoint=config.worker.entrypoint,
            args=args,
            envs=envs,
            logs_specs=self._logs_specs,
            make_sink=make_sink,
            janitor=self._supervision.janitor,
            fork_server=self._supervision.fork_server,
        )
        if self._supervision.watchdog is not None:
            self._supervision.watchdog.attempt_started(self.attempt)
        self._workers.start()
        pids = self._workers.pids()
        self._supervision.workers_started(pids.values())
        self._events.emit(
            ev.START,
            attempt=self.attempt,
            pids={by_local[local_rank].global_rank: pid for local_rank, pid in pids.items()},
        )

    def _start_file_timer(self, run_id: str) -> None:
        """torch's worker watchdog (``TORCHELASTIC_ENABLE_FILE_TIMER=1``), once per run."""
        if os.environ.get(FILE_TIMER_ENV) != "1" or self._file_timer is not None:
            return
        if self._timer_file is None:
            self._timer_file = os.path.join(
                tempfile.gettempdir(), "watchdog_timer_" + str(uuid.uuid4())
            )
        self._file_timer = compat.start_file_timer(self._timer_file, run_id)

    def stop_workers(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        """``death_sig``, ``shutdown_timeout_s`` of grace, then SIGKILL; idempotent."""
        if self._workers is not None:
            self._workers.close(death_sig, int(self.config.shutdown_timeout_s))

    def abandon_workers(self, grace_s: float) -> None:
        """SIGTERM to every worker, at most ``grace_s`` for them to exit, SIGKILL to those
        that did not (a rank blocked in a collective with a lost host may not heed the
        first): none of ``stop_workers``'s end-of-attempt exchanges, which wait on a network
        that may be gone (what the workers leave behind dies with the agent: the janitor)."""
        workers = self._workers
        if workers is None:
            return
        workers.signal_workers(signal.SIGTERM)
        deadline_s = time.monotonic() + grace_s
        while workers.any_running() and time.monotonic() < deadline_s:
            time.sleep(ABANDON_POLL_S)
        if workers.any_running():
            workers.signal_workers(signal.SIGKILL)

    def _monitor(self) -> RunResult:
        workers, group = self._workers, self._group
        assert workers is not None and group is not None
        result = workers.wait(0)
        if result is None:
            return self._check_hang(workers, group) or RunResult(state=WorkerState.HEALTHY)
        if result.is_failed():
            failures = {
                group.workers[local_rank].global_rank: failure
                for local_rank, failure in result.failures.items()
            }
            return RunResult(state=WorkerState.FAILED, failures=failures)
        return_values = {
            group.workers[local_rank].global_rank: value
            for local_rank, value in result.return_values.items()
        }
        return RunResult(state=WorkerState.SUCCEEDED, return_values=return_values)

    def _check_hang(self, workers: Workers, group: Group) -> RunResult | None:
        """A FAILED result naming the stalled ranks, after every rank dumped its stack."""
        watchdog = self._supervision.watchdog
        if watchdog is None:
            return None
        stalled = watchdog.stalled(w.local_rank for w in group.workers)
        if not stalled:
            return None
        self._events.emit(
            ev.HANG,
            attempt=self.attempt,
            ranks=[group.workers[local_rank].global_rank for local_rank in stalled],
            message=watchdog.hang_message(group.workers[stalled[0]].global_rank),
        )
        workers.signal_workers(DUMP_STACKS_SIGNAL)
        time.sleep(STACK_DUMP_WAIT_S)  # let faulthandler's output reach the logs
        pids = workers.pids()
        failures = {}
        for local_rank in stalled:
            global_rank = group.workers[local_rank].global_rank
            error_file = workers.error_files[local_rank]
            message = watchdog.hang_message(global_rank)
            write_error_file(error_file, message, message)
            failures[global_rank] = ProcessFailure(
                local_rank=local_rank,
                pid=pids[local_rank],
                exitcode=-int(signal.SIGKILL),
                error_file=error_file,
            )
        return RunResult(state=WorkerState.FAILED, failures=failures)

    def _record_failure(self, result: RunResult) -> None:
        self._events.emit(
            ev.FAILURE,
            attempt=self.attempt,
            failures={
                rank: {"local_rank": f.local_rank, "pid": f.pid, "exitcode": f.exitcode}
                for rank, f in result.failures.items()
            },
        )

    def _exit_barrier(self) -> None:
        """Keep this node's agent (and its store) up until every node is done."""
        group = self._group
        assert group is not None
        try:
            compat.exit_barrier(
                group.round.store, group.round.world_size, self.config.exit_barrier_timeout_s
            )
        except SignalException:
            raise
        except Exception as err:  # noqa: BLE001 - torch's agent logs and goes on, too
            log.warning("exit barrier: not every node finished in time (%s)", err)


def round_not_started_line(err: RuntimeError) -> str:
    """``torchx-elastic: the round did not start: ...; this node joins the next round``."""
    why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"torchx-elastic: the rendezvous round did not start (its nodes' ranks could not be"
        f" assigned: {why}); this node joins the next round"
    )


def substitute_local_rank(args: tuple[str, ...], local_rank: int) -> tuple[str, ...]:
    """torchrun's ``${local_rank}`` in a worker's arguments; unlike torch's ``macros`` (a
    ``string.Template``), every other ``$`` stays as the user wrote it (``$$`` too)."""
    return tuple(arg.replace("${local_rank}", str(local_rank)) for arg in args)
