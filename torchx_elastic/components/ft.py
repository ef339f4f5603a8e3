"""Fault-tolerant data parallel training with torchft: ``ft.ddp``.

``dist.ddp`` restarts the whole worker group when any rank fails. ``ft.ddp`` runs R replica
groups, each the job ``dist.ddp -j NxM`` would run (our agent, its own rendezvous, its own
``--max_retries`` in-place restarts), and torchft's Lighthouse: every step torchft forms a
quorum of the groups that are up, so a group that fails drops out while the others go on,
and when it is back it takes the live weights from a healthy group and joins at the next step.

Only component functions live at module level here (torchx's finder lists them).
"""

import importlib.util
import sys
from typing import Dict, List, Optional

import torchx.specs as specs

from torchx_elastic.components.dist_app import DEFAULT_IMAGE, DistApp
from torchx_elastic.components.ft_app import FtApp
from torchx_elastic.components.job_size import JobSize
from torchx_elastic.contract.agent_args import DEFAULT_START_METHOD

__all__ = ["ddp"]

INSTALL_HINT = (
    "torchx-elastic: torchft is not installed here; ft.ddp's Lighthouse and workers need it"
    " (pip install 'torchx-elastic[ft]'), in the image too for docker and kubernetes"
)


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
    replica_groups: int = 2,
    min_replica_groups: int = 1,
    env: Optional[Dict[str, str]] = None,
    metadata: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    lighthouse_port: int = 29510,
    join_timeout_ms: int = 10000,
    heartbeat_timeout_ms: int = 5000,
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    hang_timeout_s: float = 0,
    start_method: str = DEFAULT_START_METHOD,
) -> specs.AppDef:
    """
    Fault-tolerant data parallel job with torchft: ``replica_groups`` groups of ``-j NxM``
    each and torchft's Lighthouse. A failed group restarts on its own (``max_retries``) while
    the others keep training; it rejoins the quorum at the next step with live weights.
    The script uses ``torchft.Manager`` (see examples/ft_ddp.py).

    Usage: torchx run ft.ddp --replica_groups 2 -j 1x2 --max_retries 3 --script examples/ft_ddp.py

    Args:
        script_args: arguments to the script or module, passed byte for byte
        script: the Python script to run (relative to the working directory or image WORKDIR)
        m: the Python module to run instead of a script (as ``python -m``)
        image: container image (docker, kubernetes); ignored by local_cwd
        name: job name: ``{experimentname}/{runname}``, ``{experimentname}/``,
            ``/{runname}`` or ``{runname}``
        h: a registered named resource for each group's nodes (takes precedence over cpu,
            gpu, memMB)
        cpu: number of cpus per node of a group; fractions too
        gpu: number of gpus per node of a group
        memMB: cpu memory in MB per node of a group
        j: {nodes}x{procs_per_node} of ONE replica group, as dist.ddp's (a bare M means 1xM)
        replica_groups: how many replica groups (each its own role: group0, group1, ...)
        min_replica_groups: the groups a training step needs (the Lighthouse's min_replicas)
        env: environment variables for the workers (e.g. ENV1=v1,ENV2=v2)
        metadata: metadata for the scheduler (e.g. KEY1=v1,KEY2=v2)
        max_retries: in-place restarts of each group by its own agent; a group that runs out
            fails alone (the others go on), and the job then ends FAILED
        rdzv_port: rendezvous port of group 0 on its rank-0 node; group g uses rdzv_port + g
        lighthouse_port: torchft's Lighthouse port (the groups' registry uses the next one)
        join_timeout_ms: how long the Lighthouse waits for stragglers before a quorum
        heartbeat_timeout_ms: a group silent this long leaves the quorum
        mounts: mounts for container schedulers
            (type=<bind|volume|device>,src=/host,dst=/job[,readonly])
        debug: run with torch's distributed debug flags set
        tee: which worker streams the console shows: 0 none, 1 stdout, 2 stderr, 3 both
        hang_timeout_s: restart (or fail) a group whose rank sends no progress()/heartbeat()
            for this many seconds (0: off)
        start_method: fork-server (the default, ours) or torchrun's spawn, fork, forkserver
            (no hyphen: as torchrun means it; docs/agent.md, How workers start)
    """
    if importlib.util.find_spec("torchft") is None:
        print(INSTALL_HINT, file=sys.stderr)
    group = DistApp.from_component(JobSize.parse(j), script_args, locals())
    return FtApp(
        group=group,
        replica_groups=replica_groups,
        min_replica_groups=min_replica_groups,
        lighthouse_port=lighthouse_port,
        join_timeout_ms=join_timeout_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    ).build()
