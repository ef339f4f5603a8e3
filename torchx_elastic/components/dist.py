"""Distributed training components: ``dist.torchrun``, ``dist.ddp`` and ``dist.spmd``.

The same parameters as torchx's own components (torchx 0.7's ``dist.ddp``/``dist.spmd`` and
its development line's ``dist.torchrun``, with ``rdzv_conf`` and ``metadata``), with the same
meaning, so existing command lines keep working. The role runs torchx-elastic's bundled agent
directly (no ``bash -c``): user arguments reach the worker's ``sys.argv`` exactly as given.

- ``dist.torchrun``: with a named host (``-h``) a bare ``-j N`` is N nodes of as many
  processes as the host has GPUs; without one it is N processes on one node.
- ``dist.ddp``: a bare ``-j N`` is always N processes on one node.
- ``dist.spmd``: ``-h gpu.small -j 1x1`` by default; a bare ``-j N`` counts nodes.

Only component functions (and torchx's ``parse_nnodes``) live at module level here:
torchx's finder lists every module-level function of this module, and shows those that
return an ``AppDef`` as components.
"""

from typing import Dict, List, Optional

import torchx.specs as specs

from torchx_elastic.components.dist_app import DEFAULT_IMAGE, DistApp, size_on_host
from torchx_elastic.components.job_size import JobSize, parse_nnodes
from torchx_elastic.contract.agent_args import DEFAULT_CONSOLE, DEFAULT_START_METHOD

__all__ = ["ddp", "parse_nnodes", "spmd", "torchrun"]


def torchrun(
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
    metadata: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    no_retry_on: Optional[str] = None,
    health_check: Optional[str] = None,
    spares: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    rdzv_conf: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    hang_timeout_s: float = 0,
    start_method: str = DEFAULT_START_METHOD,
    console: str = DEFAULT_CONSOLE,
) -> specs.AppDef:
    """
    Distributed PyTorch job (one role, several replicas = nodes), run by torchx-elastic's
    elastic agent, which takes torchrun's command line: per-rank prefixed logs, in-place
    restarts and a root-cause report when a rank fails.

    Usage: torchx run dist.torchrun -j 2x4 --script main.py -- --lr 0.1

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
        j: [{min_nodes}:]{max_nodes}x{procs_per_node}, e.g. 2x4 or 2:4x8 (min_nodes may be 0);
            with a named host -h a bare N is N nodes x the host's GPUs, without one N processes
        env: environment variables for the workers (e.g. ENV1=v1,ENV2=v2)
        metadata: metadata for the scheduler (e.g. KEY1=v1,KEY2=v2)
        max_retries: in-place restarts of the worker group by the agent when a rank fails
        no_retry_on: failures that end the job without a restart: exception classes and
            exit codes, comma-separated (e.g. ValueError,mypkg.ConfigError,2); a rank that
            raises torchx_elastic.NotRetried or exits with 78 is never retried
        health_check: a shell command each node runs before each rendezvous round it would
            join: a node whose check fails (exit code not 0) stays out of the job, saying why
        spares: extra nodes that start, wait at the rendezvous as standbys while the job
            trains at its size, and take a lost node's place at the next round
        rdzv_port: port of the rendezvous store on the rank-0 node (multi-node only;
            a single-node job picks a free port)
        rdzv_backend: rendezvous backend of torch.distributed.elastic (c10d)
        rdzv_conf: extra rendezvous settings (e.g. join_timeout=600,close_timeout=600)
        mounts: mounts for container schedulers
            (type=<bind|volume|device>,src=/host,dst=/job[,readonly])
        debug: run with torch's distributed debug flags set
        tee: which worker streams the console shows: 0 none, 1 stdout, 2 stderr, 3 both
            (the per-rank log files always keep both)
        hang_timeout_s: restart (or fail) when a rank sends no progress()/heartbeat() for this
            many seconds, after dumping every rank's stack to its log (0: off)
        start_method: fork-server (the default: workers forked from a process that imported
            torch once, much faster starts and restarts) or spawn (a fresh interpreter per
            worker, as torchrun starts a script; fork and forkserver, torchrun's other
            names, start a script the same way; docs/agent.md, How workers start)
        console: the agent's console: auto (a live progress bar on a person's terminal,
            plain lines in files, pipes and batch jobs such as Slurm's), plain or live
    """
    return DistApp.from_component(size_on_host(j, h), script_args, locals()).build()


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
    metadata: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    no_retry_on: Optional[str] = None,
    health_check: Optional[str] = None,
    spares: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    rdzv_conf: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    hang_timeout_s: float = 0,
    start_method: str = DEFAULT_START_METHOD,
    console: str = DEFAULT_CONSOLE,
) -> specs.AppDef:
    """
    Distributed data parallel job (one role, several replicas = nodes), run by
    torchx-elastic's elastic agent: per-rank prefixed logs, in-place restarts and a
    root-cause report when a rank fails. As ``dist.torchrun``, but a bare ``-j N`` is
    always N processes on one node.

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
        j: [{min_nodes}:]{max_nodes}x{procs_per_node}, e.g. 2x4 or 2:4x8 (min_nodes may be 0);
            a bare M means 1xM
        env: environment variables for the workers (e.g. ENV1=v1,ENV2=v2)
        metadata: metadata for the scheduler (e.g. KEY1=v1,KEY2=v2)
        max_retries: in-place restarts of the worker group by the agent when a rank fails
        no_retry_on: failures that end the job without a restart: exception classes and
            exit codes, comma-separated (e.g. ValueError,mypkg.ConfigError,2); a rank that
            raises torchx_elastic.NotRetried or exits with 78 is never retried
        health_check: a shell command each node runs before each rendezvous round it would
            join: a node whose check fails (exit code not 0) stays out of the job, saying why
        spares: extra nodes that start, wait at the rendezvous as standbys while the job
            trains at its size, and take a lost node's place at the next round
        rdzv_port: port of the rendezvous store on the rank-0 node (multi-node only;
            a single-node job picks a free port)
        rdzv_backend: rendezvous backend of torch.distributed.elastic (c10d)
        rdzv_conf: extra rendezvous settings (e.g. join_timeout=600,close_timeout=600)
        mounts: mounts for container schedulers
            (type=<bind|volume|device>,src=/host,dst=/job[,readonly])
        debug: run with torch's distributed debug flags set
        tee: which worker streams the console shows: 0 none, 1 stdout, 2 stderr, 3 both
            (the per-rank log files always keep both)
        hang_timeout_s: restart (or fail) when a rank sends no progress()/heartbeat() for this
            many seconds, after dumping every rank's stack to its log (0: off)
        start_method: fork-server (the default: workers forked from a process that imported
            torch once, much faster starts and restarts) or spawn (a fresh interpreter per
            worker, as torchrun starts a script; fork and forkserver, torchrun's other
            names, start a script the same way; docs/agent.md, How workers start)
        console: the agent's console: auto (a live progress bar on a person's terminal,
            plain lines in files, pipes and batch jobs such as Slurm's), plain or live
    """
    return DistApp.from_component(JobSize.parse(j), script_args, locals()).build()


def spmd(
    *args: str,
    script: Optional[str] = None,
    m: Optional[str] = None,
    image: str = DEFAULT_IMAGE,
    name: str = "/",
    h: str = "gpu.small",
    j: str = "1x1",
    env: Optional[Dict[str, str]] = None,
    metadata: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    no_retry_on: Optional[str] = None,
    health_check: Optional[str] = None,
    spares: int = 0,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    console: str = DEFAULT_CONSOLE,
) -> specs.AppDef:
    """
    Single-Process-Multiple-Data job: ``N x M`` copies of one program (DDP, FSDP, RPC)
    on hosts of the named resource ``h``. ``-j N`` (or ``MIN:MAX``) counts nodes and
    starts one process per GPU of the host.

    Usage: torchx run dist.spmd -j 2 -h aws_p4d.24xlarge --script train.py

    Args:
        args: arguments to the script or module, passed byte for byte
        script: the Python script to run
        m: the Python module to run instead of a script
        image: container image (docker, kubernetes); ignored by local_cwd
        name: job name: ``{experimentname}/{runname}``, ``{experimentname}/``,
            ``/{runname}`` or ``{runname}``
        h: a registered named resource (e.g. gpu.small, aws_p4d.24xlarge)
        j: [{min_nodes}:]{max_nodes}x{procs_per_node}; [{min}:]{nodes} infers the processes
            per node from the host's GPU count
        env: environment variables for the workers (e.g. ENV1=v1,ENV2=v2)
        metadata: metadata for the scheduler (e.g. KEY1=v1,KEY2=v2)
        max_retries: in-place restarts of the worker group by the agent when a rank fails
        no_retry_on: failures that end the job without a restart: exception classes and
            exit codes, comma-separated (e.g. ValueError,mypkg.ConfigError,2); a rank that
            raises torchx_elastic.NotRetried or exits with 78 is never retried
        health_check: a shell command each node runs before each rendezvous round it would
            join: a node whose check fails (exit code not 0) stays out of the job, saying why
        spares: extra nodes that start, wait at the rendezvous as standbys while the job
            trains at its size, and take a lost node's place at the next round
        mounts: mounts for container schedulers
            (type=<bind|volume|device>,src=/host,dst=/job[,readonly])
        debug: run with torch's distributed debug flags set
        console: the agent's console: auto (a live progress bar on a person's terminal,
            plain lines in files, pipes and batch jobs such as Slurm's), plain or live
    """
    return DistApp.from_component(size_on_host(j, h), args, locals()).build()
