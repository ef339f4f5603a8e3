"""Launch a Python function on N workers with the torchx-elastic agent, from Python.

A drop-in for torch's ``torch.distributed.launcher.api.elastic_launch`` (change the import)::

    from torchx_elastic.launcher import LaunchConfig, elastic_launch

    def train(lr):
        dist.init_process_group("gloo")
        ...
        return loss

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=4,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0")
    losses = elastic_launch(config, train)(0.1)    # {0: ..., 1: ..., 2: ..., 3: ...}

or the short form for one node::

    import torchx_elastic
    losses = torchx_elastic.launch(train, 0.1, nproc_per_node=4, max_restarts=1)

The workers run as the command-line agent's do: output as ``[n0 r3]``-prefixed lines, the
progress bar (``torchx_elastic.progress``), restarts with a fresh store, the hang watchdog,
the root-cause report, and no orphans: workers die with the calling process even when it is
SIGKILLed. A function raising on a rank raises one :class:`FunctionFailedError` (a torch
``ChildFailedError``) in the caller, naming the rank, the exception and its traceback.
The function and its arguments are pickled by reference (as ``multiprocessing`` does);
``start_method``: torch's ``spawn`` (the default), ``fork``, ``forkserver``, or our ``fork-server``
(the same as ``forkserver`` for a function; docs/agent.md, "How workers start").
This module's ``LaunchConfig`` is torch's without the device query torch's makes in the
caller (a worker forked after it could not use CUDA); torch's own is taken too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.distributed.launcher import api as torch_launcher

from torchx_elastic.agent import compat
from torchx_elastic.agent.function.errors import FunctionFailedError
from torchx_elastic.agent.function.launch import Entrypoint, launch_agent
from torchx_elastic.agent.function.options import AgentOptions
from torchx_elastic.agent.workers.function_call import CallPicklingError
from torchx_elastic.contract.agent_args import (
    FUNCTION_DEFAULT_START_METHOD,
    NodeRangeError,
    StartMethodError,
    check_start_method,
    parse_node_range,
)

__all__ = [
    "AgentOptions",
    "CallPicklingError",
    "FunctionFailedError",
    "LaunchConfig",
    "elastic_launch",
    "launch",
]


class LaunchConfig(torch_launcher.LaunchConfig):
    """torch's ``LaunchConfig``, less its device query: building torch's own asks CUDA for its
    devices in the caller (releases with ``numa_options``), and workers forked from the caller
    afterwards could not use CUDA (the launch then starts them by spawn, saying so)."""

    def __post_init__(self) -> None:
        compat.without_device_query(self, super().__post_init__)


class elastic_launch:  # noqa: N801 - torch's name, so that only the import changes
    """``elastic_launch(config, entrypoint)(*args)`` -> ``{global rank: return value}``.

    ``config``: torch's ``LaunchConfig``. ``entrypoint``: a function, or a program name as
    torch takes it (``sys.executable`` with ``script.py ...`` as args, or any executable;
    each rank's value is then None). ``options``: the agent's own options (console, hang
    watchdog, ...). Only this node's workers' values come back, as with torch.
    """

    def __init__(
        self,
        config: torch_launcher.LaunchConfig,
        entrypoint: Entrypoint,
        options: AgentOptions | None = None,
    ) -> None:
        self._config = config
        self._entrypoint = entrypoint
        self._options = options

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, args, self._options)


def launch(
    function: Callable[..., Any],
    *args: Any,
    nproc_per_node: int = 1,
    nnodes: str = "1",
    max_restarts: int = 0,
    rdzv_endpoint: str = "localhost:0",
    rdzv_backend: str = "c10d",
    run_id: str = "",
    start_method: str = FUNCTION_DEFAULT_START_METHOD,
    log_dir: str | None = None,
    console: str = "auto",
    console_ranks: str = "all",
    hang_timeout_s: float = 0.0,
    monitor_interval_s: float = 0.1,
    shutdown_timeout_s: int | None = None,
) -> dict[int, Any]:
    """``function(*args)`` on ``nproc_per_node`` workers; ``{global rank: return value}``.

    ``nnodes``: ``N`` or ``MIN:MAX``; more than one node needs an ``rdzv_endpoint`` with a
    fixed port (the rank-0 node's) and the same ``run_id`` on every node. ``log_dir``: where
    each launch gets a directory of per-attempt, per-rank logs (default: a temporary one).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int):
        raise TypeError(f"nproc_per_node={nproc_per_node!r} is not a whole number >= 1")
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node!r} is not a whole number >= 1")
    try:
        min_nodes, max_nodes = parse_node_range(nnodes)
        check_start_method(start_method)
    except NodeRangeError as err:
        raise ValueError(f"nnodes={err}") from None
    except StartMethodError as err:
        raise ValueError(f"start_method={err}") from None
    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc_per_node,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        run_id=run_id,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval_s,
        start_method=start_method,
        **compat.launch_config_fields(shutdown_timeout=shutdown_timeout_s),
    )
    options = AgentOptions(
        console=console, console_ranks=console_ranks, hang_timeout_s=hang_timeout_s
    )
    return launch_agent(config, function, args, options)
