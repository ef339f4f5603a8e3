"""torch's ``LocalElasticAgent`` with our worker processes (piped, prefixed output)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    RunResult,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from torchx_elastic.agent.console.events import EventLog
from torchx_elastic.agent.console.output import OutputSink, RankOutput
from torchx_elastic.agent.rendezvous.handler import round_members
from torchx_elastic.agent.supervision.watchdog import HangWatchdog, write_hang_error
from torchx_elastic.agent.workers.bootstrap import AGENT_PID_ENV, DUMP_STACKS_SIGNAL
from torchx_elastic.agent.workers.forkserver import ForkServer
from torchx_elastic.agent.workers.janitor import Janitor
from torchx_elastic.agent.workers.logs import RankLogsSpecs
from torchx_elastic.agent.workers.processes import WorkerProcesses

SinkFactory = Callable[[list[RankOutput]], OutputSink]
STACK_DUMP_WAIT_S = 1.0


@dataclass
class Supervision:
    """How the agent watches its workers beyond torch's exit-code monitoring."""

    term_timeout_s: float = 30.0
    janitor: Janitor | None = None
    watchdog: HangWatchdog | None = None
    fork_server: ForkServer | None = None


def worker_env(worker_group: WorkerGroup, restart_count: int) -> dict[int, dict[str, str]]:
    """The standard torchelastic environment of every local worker, by local rank."""
    spec = worker_group.spec
    use_agent_store = spec.rdzv_handler.use_agent_store
    envs: dict[int, dict[str, str]] = {}
    for worker in worker_group.workers:
        env = {
            "RANK": str(worker.global_rank),
            "LOCAL_RANK": str(worker.local_rank),
            "GROUP_RANK": str(worker_group.group_rank),
            "ROLE_RANK": str(worker.role_rank),
            "ROLE_NAME": spec.role,
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "WORLD_SIZE": str(worker.world_size),
            "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
            "ROLE_WORLD_SIZE": str(worker.role_world_size),
            "MASTER_ADDR": str(worker_group.master_addr),
            "MASTER_PORT": str(worker_group.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
            "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
            "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "PYTHONUNBUFFERED": os.getenv("PYTHONUNBUFFERED", "1"),
            AGENT_PID_ENV: str(os.getpid()),
        }
        if "OMP_NUM_THREADS" in os.environ:
            env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
        envs[worker.local_rank] = env
    return envs


class ElasticAgent(LocalElasticAgent):
    """Starts workers through :class:`WorkerProcesses`; everything else is torch's agent."""

    def __init__(
        self,
        spec: WorkerSpec,
        log_dir: str,
        make_sink: SinkFactory,
        exit_barrier_timeout: float = 300,
        shutdown_timeout: int = 30,
        events: EventLog | None = None,
        worker_extra_env: Mapping[str, str] | None = None,
        supervision: Supervision | None = None,
    ) -> None:
        super().__init__(
            spec,
            logs_specs=RankLogsSpecs(log_dir),
            exit_barrier_timeout=exit_barrier_timeout,
            shutdown_timeout=shutdown_timeout,
        )
        self._make_sink = make_sink
        self._events = events or EventLog(None)
        self._worker_extra_env = dict(worker_extra_env or {})  # e.g. the progress channel
        self._supervision = supervision or Supervision()
        self.last_round_members: dict[int, str] = {}

    @property
    def attempt(self) -> int:
        """0 for the first start of the workers, +1 for each restart."""
        return self._worker_group.spec.max_restarts - self._remaining_restarts

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        """Stop the workers: ``death_sig``, ``term_timeout_s`` of grace, then SIGKILL."""
        super()._shutdown(death_sig, int(self._supervision.term_timeout_s))

    def _check_hang(self, worker_group: WorkerGroup) -> RunResult | None:
        """A FAILED result naming the stalled ranks, after every rank dumped its stack."""
        watchdog = self._supervision.watchdog
        if watchdog is None:
            return None
        stalled = watchdog.stalled(w.local_rank for w in worker_group.workers)
        if not stalled:
            return None
        workers = assert_worker_processes(self._pcontext)
        workers.signal_workers(DUMP_STACKS_SIGNAL)
        time.sleep(STACK_DUMP_WAIT_S)  # let faulthandler's output reach the logs
        pids = workers.pids()
        failures = {}
        for local_rank in stalled:
            global_rank = worker_group.workers[local_rank].global_rank
            error_file = workers.error_files[local_rank]
            write_hang_error(error_file, watchdog.hang_message(global_rank))
            failures[global_rank] = ProcessFailure(
                local_rank=local_rank,
                pid=pids[local_rank],
                exitcode=-int(signal.SIGKILL),
                error_file=error_file,
            )
        return RunResult(state=WorkerState.FAILED, failures=failures)

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        super()._rendezvous(worker_group)
        self.last_round_members = round_members(worker_group.spec.rdzv_handler)
        self._events.node = worker_group.group_rank
        self._events.emit(
            "rendezvous",
            attempt=self.attempt,
            group_world_size=worker_group.group_world_size,
            ranks=[w.global_rank for w in worker_group.workers],
            master=f"{worker_group.master_addr}:{worker_group.master_port}",
        )

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result: RunResult = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY:
            result = self._check_hang(worker_group) or result
        if result.is_failed():
            self._events.emit(
                "failure",
                attempt=self.attempt,
                failures={
                    rank: {"local_rank": f.local_rank, "pid": f.pid, "exitcode": f.exitcode}
                    for rank, f in result.failures.items()
                },
            )
        return result

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        self._events.emit(
            "restart",
            attempt=self.attempt,
            reason="membership change" if worker_group.state.name == "HEALTHY" else "failure",
        )
        super()._restart_workers(worker_group)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec = worker_group.spec
        restart_count = self.attempt
        envs = worker_env(worker_group, restart_count)
        for env in envs.values():
            env.update(self._worker_extra_env)
        args = {w.local_rank: tuple(spec.args) for w in worker_group.workers}
        workers = {w.local_rank: w for w in worker_group.workers}

        def make_sink(stdouts: dict[int, str], stderrs: dict[int, str]) -> OutputSink:
            return self._make_sink(
                [
                    RankOutput(
                        local_rank=local_rank,
                        global_rank=workers[local_rank].global_rank,
                        node_rank=worker_group.group_rank or 0,
                        stdout_path=stdouts[local_rank],
                        stderr_path=stderrs[local_rank],
                    )
                    for local_rank in sorted(workers)
                ]
            )

        assert isinstance(spec.entrypoint, str)
        self._pcontext = WorkerProcesses(
            name=spec.role,
            entrypoint=spec.entrypoint,
            args=args,
            envs=envs,
            logs_specs=self._logs_specs,
            make_sink=make_sink,
            janitor=self._supervision.janitor,
            fork_server=self._supervision.fork_server,
        )
        if self._supervision.watchdog is not None:
            self._supervision.watchdog.attempt_started(restart_count)
        self._pcontext.start()
        pids = self._pcontext.pids()
        self._events.emit(
            "start",
            attempt=restart_count,
            pids={workers[local_rank].global_rank: pid for local_rank, pid in pids.items()},
        )
        return pids


def assert_worker_processes(pcontext: object) -> WorkerProcesses:
    assert isinstance(pcontext, WorkerProcesses)
    return pcontext
