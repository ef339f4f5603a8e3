"""torch's ``LocalElasticAgent`` with our worker processes (piped, prefixed output)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerGroup, WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from torchx_elastic.agent.bootstrap import AGENT_PID_ENV
from torchx_elastic.agent.logs import RankLogsSpecs
from torchx_elastic.agent.output import OutputSink, RankOutput
from torchx_elastic.agent.processes import WorkerProcesses

SinkFactory = Callable[[list[RankOutput]], OutputSink]


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
    ) -> None:
        super().__init__(
            spec,
            logs_specs=RankLogsSpecs(log_dir),
            exit_barrier_timeout=exit_barrier_timeout,
            shutdown_timeout=shutdown_timeout,
        )
        self._make_sink = make_sink

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec = worker_group.spec
        restart_count = spec.max_restarts - self._remaining_restarts
        envs = worker_env(worker_group, restart_count)
        args = {w.local_rank: tuple(spec.args) for w in worker_group.workers}
        workers = {w.local_rank: w for w in worker_group.workers}

        def make_sink(stdouts: dict[int, str], stderrs: dict[int, str]) -> OutputSink:
            return self._make_sink(
                [
                    RankOutput(
                        local_rank=local_rank,
                        global_rank=workers[local_rank].global_rank,
                        node_rank=worker_group.group_rank,
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
        )
        self._pcontext.start()
        return self._pcontext.pids()
