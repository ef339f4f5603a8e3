"""Distributed training components: ``dist.ddp`` and ``dist.spmd``.

Same parameters as torchx's own ``dist.ddp`` / ``dist.spmd`` so existing command lines
keep working, but the role runs torchx-elastic's bundled agent directly (no ``bash -c``):
user arguments reach the worker's ``sys.argv`` exactly as given.

Only component functions live at module level here: torchx's finder lists every
module-level function of this module as a component.
"""

import os
from pathlib import Path
from typing import Dict, List, Optional

import torchx.specs as specs
from torchx.components.structured_arg import StructuredNameArgument

from torchx_elastic.components.agent_command import AgentCommand
from torchx_elastic.components.job_size import JobSize
from torchx_elastic.components.node_resource import node_resource

DEFAULT_IMAGE = "torchx-elastic:latest"

_TORCH_DEBUG_FLAGS: Dict[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}


def ddp(
    *script_args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    h: Optional[str] = None,
    cpu: float = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    hang_timeout_s: float = 0,
    start_method: str = "spawn",
) -> specs.AppDef:
    """
    Distributed data parallel job (one role, several replicas = nodes), run by
    torchx-elastic's elastic agent: per-rank prefixed logs, in-place restarts and a
    root-cause report when a rank fails.

    Usage: torchx run dist.ddp -j 2x4 --script main.py -- --lr 0.1

    Args:
        script_args: arguments to the script or module, passed byte for byte
        script: the Python script to run (relative to the working directory or image WORKDIR)
        m: the Python module to run instead of a script (as ``python -m``)
        image: container image (docker, kubernetes); ignored by local_cwd
        name: job name: ``{experimentname}/{runname}``, ``{experimentname}/``,
            ``/{runname}`` or ``{runname}``
        h: a registered named resource (takes precedence over cpu, gpu, memMB)
        cpu: number of cpus per node; fractions too (0.5: kubernetes asks for 500m)
        gpu: number of gpus per node
        memMB: cpu memory in MB per node
        j: [{min_nodes}:]{max_nodes}x{procs_per_node}, e.g. 2x4 or 2:4x8; a bare M means 1xM
        env: environment variables for the workers (e.g. ENV1=v1,ENV2=v2)
        max_retries: in-place restarts of the worker group by the agent when a rank fails
        rdzv_port: port of the rendezvous store on the rank-0 node (multi-node only;
            a single-node job picks a free port)
        rdzv_backend: rendezvous backend of torch.distributed.elastic (c10d)
        mounts: mounts for container schedulers
            (type=<bind|volume|device>,src=/host,dst=/job[,readonly])
        debug: run with torch's distributed debug flags set
        tee: which worker streams the console shows: 0 none, 1 stdout, 2 stderr, 3 both
            (the per-rank log files always keep both)
        hang_timeout_s: restart (or fail) when a rank sends no progress()/heartbeat() for this
            many seconds, after dumping every rank's stack to its log (0: off)
        start_method: spawn (a fresh interpreter per worker) or fork-server (forked from a
            process that imported torch once: much faster starts and restarts)
    """
    size = JobSize.parse(j)
    command = AgentCommand(
        size=size,
        script=script,
        module=m,
        script_args=tuple(script_args),
        rdzv_port=rdzv_port,
        rdzv_backend=rdzv_backend,
        max_restarts=max_retries,
        tee=tee,
        hang_timeout_s=hang_timeout_s,
        start_method=start_method,
    )
    run_name = StructuredNameArgument.parse_from(name=name, m=m, script=script)
    role_env = dict(env or {})
    role_env["TORCHX_TRACKING_EXPERIMENT_NAME"] = run_name.experiment_name
    role_env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    if debug:
        role_env.update(_TORCH_DEBUG_FLAGS)

    role_name = Path(script).stem if script else str(m).rpartition(".")[2]
    return specs.AppDef(
        name=run_name.run_name,
        roles=[
            specs.Role(
                name=role_name,
                image=image,
                entrypoint=command.entrypoint(),
                args=command.args(),
                min_replicas=size.min_nodes,
                num_replicas=size.max_nodes,
                resource=node_resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h),
                env=role_env,
                port_map={"c10d": rdzv_port},
                max_retries=max_retries,
                mounts=specs.parse_mounts(mounts) if mounts else [],
            )
        ],
    )


def spmd(
    *args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    h: str = "gpu.small",
    j: str = "1x1",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
) -> specs.AppDef:
    """
    Single-Process-Multiple-Data job: ``N x M`` copies of one program (DDP, FSDP, RPC)
    on hosts of the named resource ``h``. On a GPU host ``-j N`` (or ``MIN:MAX``)
    counts nodes and starts one process per GPU.

    Usage: torchx run dist.spmd -j 2 -h aws_p4d.24xlarge --script train.py

    Args:
        args: arguments to the script or module, passed byte for byte
        script: the Python script to run
        m: the Python module to run instead of a script
        image: container image (docker, kubernetes); ignored by local_cwd
        name: job name: ``{experimentname}/{runname}``, ``{experimentname}/``,
            ``/{runname}`` or ``{runname}``
        h: a registered named resource (e.g. gpu.small, aws_p4d.24xlarge)
        j: [{min_nodes}:]{max_nodes}x{procs_per_node}; on GPU hosts [{min}:]{nodes}
            infers the processes per node from the GPU count
        env: environment variables for the workers (e.g. ENV1=v1,ENV2=v2)
        max_retries: in-place restarts of the worker group by the agent when a rank fails
        mounts: mounts for container schedulers
            (type=<bind|volume|device>,src=/host,dst=/job[,readonly])
        debug: run with torch's distributed debug flags set
    """
    size = JobSize.parse(j, gpus_per_node=specs.named_resources[h].gpu)
    return ddp(
        *args,
        script=script,
        m=m,
        image=image,
        name=name,
        h=h,
        j=str(size),
        env=env,
        max_retries=max_retries,
        mounts=mounts,
        debug=debug,
    )
