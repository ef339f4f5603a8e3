"""The one AppDef behind ``dist.torchrun``, ``dist.ddp`` and ``dist.spmd``.

The components differ only in how they read ``-j`` and in their defaults; what they build
is the same: one role of ``num_replicas`` nodes, each running the bundled agent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torchx.specs as specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros

from torchx_elastic.components.agent_command import (
    AgentCommand,
)
from torchx_elastic.components.job_size import JobSize
from torchx_elastic.components.node_resource import node_resource
from torchx_elastic.contract.agent_args import DEFAULT_CONSOLE, DEFAULT_START_METHOD

DEFAULT_IMAGE = "torchx-elastic:latest"

TORCH_DEBUG_FLAGS: Dict[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}


@dataclass(frozen=True)
class DistApp:
    """Every parameter of the dist components, the job size already parsed."""

    size: JobSize
    script: Optional[str]
    m: Optional[str]
    script_args: Tuple[str, ...] = ()
    image: str = DEFAULT_IMAGE
    name: str = "/"
    h: Optional[str] = None
    cpu: float = 2
    gpu: int = 0
    memMB: int = 1024
    env: Dict[str, str] = field(default_factory=dict)
    metadata: Dict[str, str] = field(default_factory=dict)
    max_retries: int = 0
    rdzv_port: int = 29500
    rdzv_backend: str = "c10d"
    rdzv_conf: Optional[str] = None
    mounts: List[str] = field(default_factory=list)
    debug: bool = False
    tee: int = 3
    hang_timeout_s: float = 0
    start_method: str = DEFAULT_START_METHOD
    rank0_variable: str = macros.rank0_env
    console: str = DEFAULT_CONSOLE
    reached_from_outside: bool = False  # AgentCommand's

    def build(self) -> specs.AppDef:
        command = AgentCommand(
            size=self.size,
            script=self.script,
            module=self.m,
            script_args=self.script_args,
            rdzv_port=self.rdzv_port,
            rdzv_backend=self.rdzv_backend,
            rdzv_conf=self.rdzv_conf or "",
            max_restarts=self.max_retries,
            tee=self.tee,
            hang_timeout_s=self.hang_timeout_s,
            start_method=self.start_method,
            rank0_variable=self.rank0_variable,
            console=self.console,
            reached_from_outside=self.reached_from_outside,
        )
        run_name = StructuredNameArgument.parse_from(name=self.name, m=self.m, script=self.script)
        env = dict(self.env)
        env["TORCHX_TRACKING_EXPERIMENT_NAME"] = run_name.experiment_name
        env["TORCHX_TRACKING_RUN_NAME"] = run_name.run_name
        env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
        if self.debug:
            env.update(TORCH_DEBUG_FLAGS)
        role_name = Path(self.script).stem if self.script else str(self.m).rpartition(".")[2]
        return specs.AppDef(
            name=run_name.run_name,
            roles=[
                specs.Role(
                    name=role_name,
                    image=self.image,
                    entrypoint=command.entrypoint(),
                    args=command.args(),
                    min_replicas=self.size.min_nodes,
                    num_replicas=self.size.max_nodes,
                    resource=node_resource(cpu=self.cpu, gpu=self.gpu, memMB=self.memMB, h=self.h),
                    env=env,
                    port_map={"c10d": self.rdzv_port},
                    max_retries=self.max_retries,
                    mounts=specs.parse_mounts(self.mounts) if self.mounts else [],
                )
            ],
            metadata=dict(self.metadata),
        )


def host_gpus(h: str) -> int:
    """GPUs of the named resource ``h`` (a ``KeyError``-free lookup: torchx says what exists)."""
    return int(specs.resource(h=h).gpu)
