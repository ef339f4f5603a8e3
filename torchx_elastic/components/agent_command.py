"""The command line of the bundled agent, as a role's entrypoint and args."""

from __future__ import annotations

from dataclasses import dataclass

from torchx.specs import macros

from torchx_elastic.components.errors import ComponentArgumentError
from torchx_elastic.components.job_size import JobSize
from torchx_elastic.contract.agent_args import (
    CONSOLE_MODES,
    DEFAULT_CONSOLE,
    DEFAULT_START_METHOD,
    RDZV_ENDPOINT_FLAG,
    StartMethodError,
    check_start_method,
)
from torchx_elastic.contract.not_retried import NoRetryRule

AGENT_MODULE = "torchx_elastic.agent"
PYTHON = "python3"
MAX_PORT = 65535


def _literal(arg: str) -> str:
    """Escape ``$`` so torchx's macro substitution leaves a user argument as it is."""
    return arg.replace("$", "$$")


@dataclass(frozen=True)
class AgentCommand:
    """``python3 -m torchx_elastic.agent [agent flags] (SCRIPT | -m MODULE) [ARGS...]``."""

    size: JobSize
    script: str | None
    module: str | None
    script_args: tuple[str, ...] = ()
    rdzv_port: int = 29500
    rdzv_backend: str = "c10d"
    rdzv_conf: str = ""  # KEY=VALUE,... (e.g. join_timeout=600)
    max_restarts: int = 0
    no_retry_on: str = ""  # the agent's --no-retry-on: ValueError,mypkg.ConfigError,2
    health_check: str = ""  # the agent's --health-check: a shell command
    spares: int = 0  # replicas beyond the job's size, standing by at the rendezvous
    tee: int = 3
    hang_timeout_s: float = 0
    start_method: str = DEFAULT_START_METHOD
    # the variable that holds the rank-0 host of the rendezvous (torchx's rank0_env by default)
    rank0_variable: str = macros.rank0_env
    console: str = DEFAULT_CONSOLE
    # other jobs reach this one's workers (ft.ddp's replica groups): a one-node job hosts its
    # stores and gloo's listeners on its rank-0 host too, not on loopback only
    reached_from_outside: bool = False

    def __post_init__(self) -> None:
        if self.console not in CONSOLE_MODES:
            raise ComponentArgumentError(
                f"invalid console {self.console!r}; accepted: {', '.join(CONSOLE_MODES)}"
            )
        try:
            check_start_method(self.start_method)
        except StartMethodError as err:
            raise ComponentArgumentError(f"start_method {err}") from None
        if not 0 <= self.rdzv_port <= MAX_PORT:
            raise ComponentArgumentError(
                f"invalid rdzv_port {self.rdzv_port}; accepted: a TCP port, 1 to {MAX_PORT} (0: any"
                " free port, for one node)"
            )
        if self.hang_timeout_s < 0:
            raise ComponentArgumentError(
                f"invalid hang_timeout_s {self.hang_timeout_s:g}; accepted: 0 (off) or seconds > 0"
            )
        if self.spares < 0:
            raise ComponentArgumentError(
                f"invalid spares {self.spares}; accepted: 0 (none) or more nodes standing by"
            )
        try:
            NoRetryRule.parse(self.no_retry_on)
        except ValueError as err:
            raise ComponentArgumentError(
                f"invalid no_retry_on {self.no_retry_on!r}: {err}"
            ) from None
        if (self.script is None) == (self.module is None):
            raise ComponentArgumentError(
                "exactly one of --script and -m must be given"
                " (e.g. --script train.py or -m my_pkg.train)"
            )

    @property
    def rdzv_endpoint(self) -> str:
        if self.size.max_nodes == 1 and not self.spares and self.rdzv_backend != "static":
            # one agent: port 0 lets it pick a free port, so jobs never collide (static
            # rendezvous hands its port to the workers: it needs a fixed one)
            host = "localhost"
            if self.reached_from_outside:
                host = f"$${{{self.rank0_variable}:-localhost}}"
            return f"{host}:0"
        # "$$" survives torchx's macro substitution as "$": the agent expands
        # ${<rank0 env var>:-localhost} itself, no shell involved
        return f"$${{{self.rank0_variable}:-localhost}}:{self.rdzv_port}"

    def entrypoint(self) -> str:
        return PYTHON

    def args(self) -> list[str]:
        args = [
            "-m",
            AGENT_MODULE,
            "--nnodes",
            self.size.nnodes,
            "--nproc-per-node",
            str(self.size.nproc_per_node),
            "--rdzv-backend",
            self.rdzv_backend,
            RDZV_ENDPOINT_FLAG,
            self.rdzv_endpoint,
            *(["--rdzv-conf", _literal(self.rdzv_conf)] if self.rdzv_conf else []),
            "--rdzv-id",
            macros.app_id,
            "--max-restarts",
            str(self.max_restarts),
            "--tee",
            str(self.tee),
            "--hang-timeout-s",
            f"{self.hang_timeout_s:g}",
            "--start-method",
            self.start_method,
        ]
        if self.console != DEFAULT_CONSOLE:
            args += ["--console", self.console]
        if self.no_retry_on:
            args += ["--no-retry-on", _literal(self.no_retry_on)]
        if self.health_check:
            args += ["--health-check", _literal(self.health_check)]
        if self.spares:
            args += ["--spares", str(self.spares)]
        if self.tee != 3:
            # the console shows the streams in --tee (torchrun's meaning: all others are
            # redirected to the log files only)
            args += ["--redirects", "3"]
        if self.rdzv_backend == "static":
            # static rendezvous: each node is told its rank (the replica id), as torchx's own
            args += ["--node-rank", macros.replica_id]
        if self.module is not None:
            args += ["-m", _literal(self.module)]
        else:
            args.append(_literal(str(self.script)))
        return args + [_literal(a) for a in self.script_args]
