"""Command lines of the three ways to start N workers: ours, torchrun, and by hand.

Pure functions: each returns argv lists (and environments for the hand-made floor), so
the tests can read exactly what the benchmark runs.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

PYTHON = sys.executable
AGENT_MODULE = "torchx_elastic.agent"
TORCHRUN_MODULE = "torch.distributed.run"


def torchx_executable() -> str:
    """The ``torchx`` console script of the interpreter running the benchmark (the venv's)."""
    return str(Path(PYTHON).parent / "torchx")


def ours_torchx(
    job: str,
    script: str,
    script_args: Sequence[str] = (),
    *,
    log_dir: Path,
    component_args: Sequence[str] = (),
) -> list[str]:
    """``torchx run -s local_cwd -cfg log_dir=DIR dist.ddp -j JOB ... --script SCRIPT -- ARGS``."""
    command = [
        torchx_executable(),
        "run",
        "-s",
        "local_cwd",
        "-cfg",
        f"log_dir={log_dir}",
        "dist.ddp",
        "-j",
        job,
        *component_args,
        "--script",
        script,
    ]
    if script_args:
        command += ["--", *script_args]
    return command


def ours_agent(
    nproc_per_node: int,
    script: str,
    script_args: Sequence[str] = (),
    *,
    log_dir: Path,
    max_restarts: int = 0,
    tee: int = 3,
    start_method: str | None = None,
) -> list[str]:
    """Our agent started directly, single node: ``python -m torchx_elastic.agent --standalone``
    (``start_method`` None: the agent's default)."""
    method = [] if start_method is None else ["--start-method", start_method]
    return [
        PYTHON,
        "-m",
        AGENT_MODULE,
        "--standalone",
        "--nproc-per-node",
        str(nproc_per_node),
        "--max-restarts",
        str(max_restarts),
        "--log-dir",
        str(log_dir),
        # torchrun's meaning: every stream to the files, `tee` of them also on the console
        "--redirects",
        "3",
        "--tee",
        str(tee),
        *method,
        script,
        *script_args,
    ]


def torchrun_standalone(
    nproc_per_node: int,
    script: str,
    script_args: Sequence[str] = (),
    *,
    max_restarts: int = 0,
    log_dir: Path | None = None,
    tee: int | None = None,
) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N SCRIPT ARGS``."""
    command = [
        PYTHON,
        "-m",
        TORCHRUN_MODULE,
        "--standalone",
        "--nproc_per_node",
        str(nproc_per_node),
    ]
    if max_restarts:
        command += ["--max-restarts", str(max_restarts)]
    if log_dir is not None:
        command += ["--log-dir", str(log_dir)]
    if tee is not None:
        command += ["--tee", str(tee)]
    return [*command, script, *script_args]


def torchrun_nodes(
    nnodes: int,
    nproc_per_node: int,
    script: str,
    script_args: Sequence[str] = (),
    *,
    rdzv_port: int,
    rdzv_id: str | None = None,
    module: str = TORCHRUN_MODULE,
) -> list[list[str]]:
    """One torchrun agent per node (``module``: ours instead, :func:`ours_nodes`), all on
    this machine, meeting through c10d rendezvous."""
    run_id = rdzv_id or uuid.uuid4().hex
    flags = ["--nnodes", str(nnodes), "--nproc_per_node", str(nproc_per_node)]
    flags += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{rdzv_port}"]
    agent = [PYTHON, "-m", module, *flags, "--rdzv-id", run_id, script, *script_args]
    return [list(agent) for _ in range(nnodes)]


def ours_nodes(
    nnodes: int,
    nproc_per_node: int,
    script: str,
    script_args: Sequence[str] = (),
    *,
    rdzv_port: int,
) -> list[list[str]]:
    """Our agents with :func:`torchrun_nodes`' flags (the agent takes torchrun's)."""
    return torchrun_nodes(
        nnodes, nproc_per_node, script, script_args, rdzv_port=rdzv_port, module=AGENT_MODULE
    )


def floor_envs(base_env: Mapping[str, str], nproc: int, master_port: int) -> list[dict[str, str]]:
    """The environment torch.distributed's ``env://`` needs, set by hand for each rank."""
    return [
        {
            **base_env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
        }
        for rank in range(nproc)
    ]


def floor(nproc: int, script: str, script_args: Sequence[str] = ()) -> list[list[str]]:
    """N plain ``python SCRIPT ARGS`` processes (pair with :func:`floor_envs`)."""
    return [[PYTHON, script, *script_args] for _ in range(nproc)]
