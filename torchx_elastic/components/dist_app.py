"""The one AppDef behind ``dist.torchrun``, ``dist.ddp`` and ``dist.spmd``.

The components differ only in how they read ``-j`` and in their defaults; what they build
is the same: one role of ``num_replicas`` nodes, each running the bundled agent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
    no_retry_on: Optional[str] = None
    health_check: Optional[str] = None
    spares: int = 0
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

    @classmethod
    def from_component(
        cls, size: JobSize, script_args: Sequence[str], arguments: Mapping[str, Any]
    ) -> DistApp:
        """The app of a component called with ``arguments`` (its ``locals()``).

        A component's parameters are written once, in the signature torchx reads (torchx
        requires each component to be a ``def`` of its own with annotated parameters); those
        that name a field of this class set it, the others (``j``, a component's own) are
        left to the component, and the fields a component does not take keep the defaults
        here, which are ``dist.torchrun``'s.
        """
        given: Dict[str, Any] = {
            name: arguments[name] for name in _COMPONENT_FIELDS if name in arguments
        }
        for name in ("env", "metadata"):
            given[name] = dict(given.get(name) or {})
        given["mounts"] = list(given.get("mounts") or [])
        return cls(size=size, script_args=tuple(script_args), **given)

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
            no_retry_on=self.no_retry_on or "",
            health_check=self.health_check or "",
            spares=self.spares,
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
                    num_replicas=self.size.max_nodes + self.spares,
                    resource=node_resource(cpu=self.cpu, gpu=self.gpu, memMB=self.memMB, h=self.h),
                    env=env,
                    port_map={"c10d": self.rdzv_port},
                    max_retries=self.max_retries,
                    mounts=specs.parse_mounts(self.mounts) if self.mounts else [],
                )
            ],
            metadata=dict(self.metadata),
        )


_COMPONENT_FIELDS = tuple(
    f.name
    for f in fields(DistApp)
    if f.name not in ("size", "script_args", "rank0_variable", "reached_from_outside")
)


def size_on_host(j: str, h: Optional[str]) -> JobSize:
    """``-j`` as ``dist.torchrun`` and ``dist.spmd`` read it: on a named host with GPUs a
    bare ``N`` counts nodes (of as many processes as the host has GPUs)."""
    return JobSize.parse_on_host(j, h, host_gpus(h)) if h else JobSize.parse(j)


def host_gpus(h: str) -> int:
    """GPUs of the named resource ``h`` (a ``KeyError``-free lookup: torchx says what exists)."""
    return int(specs.resource(h=h).gpu)
