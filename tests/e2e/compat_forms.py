"""torchrun's command-line forms, from its own documentation.

Sources: the module docstring of ``torch.distributed.run`` (its "Usage" section, the
environment variables it lists, ``PYTHON_EXEC``, the ``--local-rank`` note) and ``torchrun
--help`` (every flag, each with its ``--a_b`` spelling and its ``PET_A_B`` variable), plus
what ``config_from_args`` documents in code: ``OMP_NUM_THREADS`` and its warning,
``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, ``${local_rank}`` in script arguments,
``TORCHELASTIC_ENABLE_FILE_TIMER``, static rendezvous with ``--node-rank`` /
``--master-addr`` / ``--master-port`` (one node, or two nodes on this host as two
processes), and the usage errors.

``$NUM_TRAINERS`` is 2, ``$HOST_NODE_ADDR`` is ``localhost:{port}`` and ``$JOB_ID`` is
``job42``; the training script is ``compat_worker.py``.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.e2e.compat_runner import Node

W = "compat_worker.py"
FAIL_ONCE = (("COMPAT_FAIL_LOCAL_RANK", "1"), ("COMPAT_FAIL_ATTEMPTS", "1"))
FAIL_ALWAYS = (("COMPAT_FAIL_LOCAL_RANK", "1"), ("COMPAT_FAIL_ATTEMPTS", "99"))


@dataclass(frozen=True)
class Form:
    """One documented command line. ``needs``: torchrun flags that older torch releases
    lack (the form is not one of theirs there); ``error_mentions``: for a usage error,
    text our message must contain (what was wrong)."""

    id: str
    nodes: tuple[Node, ...]
    needs: tuple[str, ...] = ()
    together: bool = True
    compare_line_prefix: bool = False
    error_mentions: str | None = None


@cache
def torchrun_flags() -> frozenset[str]:
    """Every option string of the installed torchrun, read from its source (no torch import)."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "distributed" / "run.py"
    flags = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags |= {arg.value for arg in node.args if isinstance(arg, ast.Constant)}
    return frozenset(str(flag) for flag in flags)


def torchrun_default_port_is_fixed() -> bool:
    """Up to torch 2.9 at least, torchrun without rendezvous flags uses static rendezvous on
    127.0.0.1:29500 even for one node; later releases take a free port for one node."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "distributed" / "run.py").read_text()
    return "args.master_port is None" not in source


RENDEZVOUS_WORDS = ("standalone", "rdzv-endpoint", "rdzv_endpoint", "master-port", "master_port")


def uses_default_rendezvous(form: Form) -> bool:
    """No flag or PET_* variable of the form says where to rendezvous."""
    texts = [text.lower() for node in form.nodes for text in (*node.args, *dict(node.env))]
    words = (*RENDEZVOUS_WORDS, "pet_rdzv_endpoint", "pet_standalone", "pet_master_port")
    return not any(word in text for text in texts for word in words)


def one(form_id: str, *args: str, env: tuple[tuple[str, str], ...] = (), **options: object) -> Form:
    return Form(form_id, (Node(args, env),), **options)  # type: ignore[arg-type]


def two(
    form_id: str, args: tuple[str, ...], env: tuple[tuple[str, str], ...] = (), **options: object
) -> Form:
    """Two nodes on this host; ``{node}`` in an argument or value is the node's index."""
    nodes = tuple(
        Node(
            tuple(arg.replace("{node}", str(i)) for arg in args),
            tuple((key, value.replace("{node}", str(i))) for key, value in env),
        )
        for i in range(2)
    )
    return Form(form_id, nodes, **options)  # type: ignore[arg-type]


def pet(**variables: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"PET_{key}", value) for key, value in variables.items())


C10D_2_NODES = (
    "--nnodes=2",
    "--nproc-per-node=2",
    "--max-restarts=3",
    "--rdzv-id=job42",
    "--rdzv-backend=c10d",
    "--rdzv-endpoint=localhost:{port}",
)

USAGE = [
    # module docstring, "Usage"
    one("docs-single-node", "--standalone", "--nnodes=1", "--nproc-per-node=2", W, "--arg1", "a"),
    one(
        "docs-stacked-single-node",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        "--nnodes=1",
        "--nproc-per-node=2",
        W,
        "--arg1",
    ),
    two("docs-fault-tolerant-2-nodes", (*C10D_2_NODES, W, "--arg1")),
    one(
        "docs-elastic-1-to-4-one-node",
        "--nnodes=1:4",
        "--nproc-per-node=2",
        "--max-restarts=3",
        "--rdzv-id=job42",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:{port}",
        "--rdzv-conf=last_call_timeout=1",
        W,
    ),
    two(
        "docs-elastic-1-to-2-two-nodes",
        (
            "--nnodes=1:2",
            "--nproc-per-node=2",
            "--max-restarts=3",
            "--rdzv-id=job42",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:{port}",
            W,
        ),
    ),
    # "If no port number is specified HOST_NODE_ADDR defaults to 29400": a fixed port, so
    # the two launchers take turns
    one(
        "docs-host-node-addr-default-port",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--rdzv-id=job42",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost",
        W,
        together=False,
    ),
    # --help defaults: static rendezvous, which becomes c10d on a free port for one node
    one("defaults-only-nproc", "--nproc-per-node=2", W),
    one("defaults-nothing", W),
    # static rendezvous (--node-rank, --master-addr, --master-port: torch.distributed.launch's
    # lines, as cluster scripts such as SLURM batch files write them)
    one("static-one-node-master-port", "--nproc-per-node=2", "--master-port={port}", W),
    two(
        "static-2-nodes-classic",
        (
            "--nnodes=2",
            "--node-rank={node}",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            "--master-port={port}",
            W,
            "--arg1",
        ),
    ),
    two(
        "static-2-nodes-underscores-spaces",
        (
            "--nnodes",
            "2",
            "--node_rank",
            "{node}",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "localhost",
            "--master_port",
            "{port}",
            "--rdzv_backend",
            "static",
            W,
        ),
    ),
    two(
        "static-2-nodes-pet-variables",
        (W,),
        env=pet(
            NNODES="2",
            NODE_RANK="{node}",
            NPROC_PER_NODE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="{port}",
        ),
    ),
    two(
        "c10d-2-nodes-pet-variables",
        (W,),
        env=pet(
            NNODES="2",
            NPROC_PER_NODE="2",
            RDZV_BACKEND="c10d",
            RDZV_ENDPOINT="localhost:{port}",
            RDZV_ID="job42",
            MAX_RESTARTS="3",
        ),
    ),
]

ENTRY_POINTS = [
    one("module-short", "--nproc-per-node=2", "-m", "compat_worker", "a", "b"),
    one("module-long", "--nproc-per-node=2", "--module", "compat_worker", "a"),
    one("module-pet", "--nproc-per-node=2", "compat_worker", "a", env=pet(MODULE="1")),
    one("no-python-shell-script", "--nproc-per-node=2", "--no-python", "./compat_worker.sh", "a"),
    one("no-python-underscore", "--nproc-per-node=2", "--no_python", "./compat_worker.sh"),
    one("no-python-pet", "--nproc-per-node=2", "./compat_worker.sh", "a", env=pet(NO_PYTHON="1")),
    one("run-path", "--nproc-per-node=2", "--run-path", "{cwd}/compat_worker.py", "a"),
    one("run-path-underscore", "--nproc-per-node=2", "--run_path", "{cwd}/compat_worker.py"),
    one("run-path-pet", "--nproc-per-node=2", "{cwd}/compat_worker.py", env=pet(RUN_PATH="1")),
    one(
        "run-path-over-no-python",
        "--nproc-per-node=2",
        "--run-path",
        "--no-python",
        "{cwd}/compat_worker.py",
    ),
    one("python-exec", "--nproc-per-node=2", W, env=(("PYTHON_EXEC", "/usr/bin/python3"),)),
    one(
        "local-rank-macro-in-script-args",
        "--nproc-per-node=2",
        W,
        "--local-rank=${local_rank}",
        "--out=rank_${local_rank}.txt",
        "${local_rank}",
    ),
]

LOGS = [
    one("redirects-3-log-dir", "--nproc-per-node=2", "-r", "3", "--log-dir={log_dir}", W),
    one("redirects-long-1", "--nproc-per-node=2", "--redirects=1", "--log-dir={log_dir}", W),
    one("redirects-per-rank", "--nproc-per-node=2", "-r", "0:1,1:2", "--log-dir={log_dir}", W),
    one("redirects-no-log-dir", "--nproc-per-node=2", "-r", "3", W),
    one(
        "redirects-pet",
        "--nproc-per-node=2",
        W,
        env=pet(REDIRECTS="3", LOG_DIR="{log_dir}"),
    ),
    one("tee-3-log-dir", "--nproc-per-node=2", "-t", "3", "--log-dir={log_dir}", W),
    one("tee-long-2", "--nproc-per-node=2", "--tee=2", "--log_dir={log_dir}", W),
    one("tee-per-rank", "--nproc-per-node=2", "-t", "0:1,1:2", "--log-dir={log_dir}", W),
    one("tee-pet", "--nproc-per-node=2", W, env=pet(TEE="3", LOG_DIR="{log_dir}")),
    one("log-dir-alone", "--nproc-per-node=2", "--log-dir={log_dir}", W),
    one("local-ranks-filter", "--nproc-per-node=2", "--local-ranks-filter=1", W),
    one("local-ranks-filter-tee", "--nproc-per-node=2", "--local_ranks_filter=0", "-t", "3", W),
    one(
        "local-ranks-filter-pet",
        "--nproc-per-node=2",
        "-t",
        "3",
        W,
        env=pet(LOCAL_RANKS_FILTER="1"),
    ),
    one(
        "log-line-prefix-template",
        "--nproc-per-node=2",
        "-t",
        "3",
        W,
        env=(("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}/${rank}/${local_rank}] "),),
        compare_line_prefix=True,
    ),
    one(
        "duplicate-stdout-filters",
        "--nproc-per-node=2",
        "-t",
        "3",
        "--log-dir={log_dir}",
        "--duplicate-stdout-filters=compat-stdout",
        "--duplicate_stderr_filters=compat-stderr",
        W,
        needs=("--duplicate-stdout-filters",),
    ),
    one(
        "log-line-prefix-template-flag",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--tee",
        "3",
        "--log-line-prefix-template",
        "${hostname}:${rank}: ",
        W,
        compare_line_prefix=True,
        needs=("--log-line-prefix-template",),
    ),
    one(
        "log-line-prefix-template-hostname-env",  # ${hostname} came with the flag (torch 2.14)
        "--nproc-per-node=2",
        "-t",
        "3",
        W,
        env=(("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${hostname}:${rank}: "),),
        compare_line_prefix=True,
        needs=("--log-line-prefix-template",),
    ),
    one(
        "log-line-prefix-template-flag-beats-env",
        "--nproc-per-node=2",
        "-t",
        "3",
        "--log_line_prefix_template=${role_name}${local_rank}> ",
        W,
        env=(("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}/${rank}/${local_rank}] "),),
        compare_line_prefix=True,
        needs=("--log-line-prefix-template",),
    ),
]

NPROC = [
    one("nproc-auto", "--nproc-per-node=auto", W),
    one("nproc-cpu", "--nproc_per_node=cpu", W),
    one("nproc-gpu-without-gpu", "--nproc-per-node=gpu", W, error_mentions="not available"),
    one("nproc-xpu-without-xpu", "--nproc-per-node=xpu", W, error_mentions="not available"),
    one("nproc-pet", W, env=pet(NPROC_PER_NODE="2")),
    one("nproc-flag-beats-pet", "--nproc-per-node=2", W, env=pet(NPROC_PER_NODE="3")),
    one("omp-one-worker-unset", "--nproc-per-node=1", W),
    one("omp-user-value-kept", "--nproc-per-node=2", W, env=(("OMP_NUM_THREADS", "4"),)),
]

LAUNCH = [
    one("start-method-spawn", "--nproc-per-node=2", "--start-method=spawn", W),
    one("start-method-fork", "--nproc-per-node=2", "--start-method", "fork", W),
    one("start-method-forkserver", "--nproc-per-node=2", "--start_method=forkserver", W),
    one("start-method-pet", "--nproc-per-node=2", W, env=pet(START_METHOD="forkserver")),
    one("max-restarts-fail-once", "--nproc-per-node=2", "--max-restarts=1", W, env=FAIL_ONCE),
    one("max-restarts-underscore", "--nproc-per-node=2", "--max_restarts=2", W, env=FAIL_ONCE),
    one("max-restarts-pet", "--nproc-per-node=2", W, env=(*FAIL_ONCE, *pet(MAX_RESTARTS="1"))),
    one("failure-no-restarts", "--nproc-per-node=2", W, env=FAIL_ALWAYS),
    one("failure-restarts-exhausted", "--nproc-per-node=2", "--max-restarts=1", W, env=FAIL_ALWAYS),
    two(
        "failure-2-nodes",
        (*C10D_2_NODES[:2], "--max-restarts=1", *C10D_2_NODES[3:], W),
        env=FAIL_ALWAYS,
    ),
    one("role", "--nproc-per-node=2", "--role=trainer", W),
    one("monitor-interval", "--nproc-per-node=2", "--monitor-interval=0.5", W),
    one("local-addr", "--nproc-per-node=2", "--standalone", "--local-addr=127.0.0.1", W),
    one(
        "rdzv-conf",
        "--nproc-per-node=2",
        "--standalone",
        "--rdzv-conf=join_timeout=600,read_timeout=60",
        W,
    ),
    # torch 2.15's c10d rendezvous setting (older releases ignore it, as every unknown key)
    two(
        "rdzv-conf-cas-backoff-2-nodes",
        (*C10D_2_NODES, "--rdzv-conf=cas_backoff_max_seconds=0.5", W),
    ),
    one(
        "event-log-handler",
        "--nproc-per-node=2",
        "--event-log-handler=null",
        W,
        needs=("--event-log-handler",),
    ),
    one(
        "signals-to-handle",
        "--nproc-per-node=2",
        "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        W,
        needs=("--signals-to-handle",),
    ),
    one(
        "shutdown-timeout",
        "--nproc-per-node=2",
        "--shutdown-timeout=5",
        W,
        needs=("--shutdown-timeout",),
    ),
    one(
        "virtual-local-rank",
        "--nproc-per-node=2",
        "--virtual-local-rank",
        W,
        needs=("--virtual-local-rank",),
    ),
    one(
        "numa-binding-without-gpu",
        "--nproc-per-node=2",
        "--numa-binding=node",
        W,
        needs=("--numa-binding",),
        # torchrun fails without a GPU (no NUMA node to read); ours says it does not bind
        error_mentions="NUMA binding is not supported",
    ),
    one(
        "file-timer",
        "--nproc-per-node=2",
        W,
        env=(("TORCHELASTIC_ENABLE_FILE_TIMER", "1"),),
    ),
    one(
        "nccl-async-error-handling-kept",
        "--nproc-per-node=2",
        W,
        env=(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"),),
    ),
    one(
        "pet-launch-settings",
        W,
        env=pet(
            NPROC_PER_NODE="2",
            ROLE="trainer",
            MONITOR_INTERVAL="0.5",
            LOCAL_ADDR="127.0.0.1",
            RDZV_BACKEND="c10d",
            RDZV_ENDPOINT="localhost:0",
            RDZV_ID="job7",
            RDZV_CONF="join_timeout=600",
        ),
    ),
    one("pet-standalone", W, env=pet(STANDALONE="1", NPROC_PER_NODE="2", NNODES="1")),
    one("pet-standalone-0", "--nproc-per-node=2", W, env=pet(STANDALONE="0")),
    one(
        "pet-module-0-flag-wins",
        "--nproc-per-node=2",
        "--module",
        "compat_worker",
        env=pet(MODULE="0"),
    ),
    one(
        "underscore-spellings",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=localhost:0",
        "--rdzv_id=job7",
        "--rdzv_conf=join_timeout=60",
        "--max_restarts=1",
        "--monitor_interval=0.2",
        "--start_method=spawn",
        "--log_dir={log_dir}",
        "--local_addr=127.0.0.1",
        W,
    ),
]

ERRORS = [
    one("error-no-script", "--nproc-per-node=2", error_mentions="training_script"),
    one("error-unknown-flag", "--bogus-flag", W, error_mentions="--bogus-flag"),
    one("error-nnodes-not-a-number", "--nnodes=two", W, error_mentions="two"),
    one("error-nnodes-min-above-max", "--nnodes=3:1", W, error_mentions="3:1"),
    one("error-nnodes-three-parts", "--nnodes=1:2:3", W, error_mentions="1:2:3"),
    one("error-nproc-unsupported", "--nproc-per-node=many", W, error_mentions="many"),
    one("error-max-restarts-negative", "--max-restarts=-1", W, error_mentions="-1"),
    one("error-max-restarts-not-int", "--max-restarts=two", W, error_mentions="two"),
    one("error-start-method", "--start-method=threads", W, error_mentions="threads"),
    one("error-no-python-and-module", "--no-python", "-m", W, error_mentions="-python"),
    one("error-local-ranks-filter", "--local-ranks-filter=a,b", W, error_mentions="a,b"),
    one("error-logs-specs-unknown", "--logs-specs=nope", W, error_mentions="nope"),
    one("error-rdzv-conf-item", "--rdzv-conf=join_timeout", W, error_mentions="join_timeout"),
    one("error-rdzv-backend-unknown", "--rdzv-backend=nope", W, error_mentions="nope"),
    one("error-pet-flag-not-0-or-1", W, env=pet(STANDALONE="yes"), error_mentions="yes"),
    one(
        "print-completion-without-shtab",
        "--print-completion",
        "bash",
        error_mentions="shtab",
        needs=("--print-completion",),
    ),
    one("error-pet-nproc-unsupported", W, env=pet(NPROC_PER_NODE="many"), error_mentions="many"),
]

FORMS = USAGE + ENTRY_POINTS + LOGS + NPROC + LAUNCH + ERRORS
