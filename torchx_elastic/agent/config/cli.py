"""Command line of the agent: torchrun's flag names where they mean the same thing.

Every flag also reads ``PET_<FLAG>`` from the environment (as torchrun does), e.g.
``PET_NNODES=2:4``, ``PET_LOG_DIR=/logs``; a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from torchx_elastic.agent.console.display import CONSOLE_MODES, DEFAULT_STATUS_INTERVAL_S
from torchx_elastic.agent.console.output import DEFAULT_PREFIX


@dataclass(frozen=True)
class NodeRange:
    min_nodes: int
    max_nodes: int

    @classmethod
    def parse(cls, text: str) -> NodeRange:
        low, _, high = text.partition(":")
        try:
            min_nodes = int(low)
            max_nodes = int(high) if high else min_nodes
        except ValueError:
            raise ValueError(f"--nnodes {text!r} is not N or MIN:MAX (e.g. 2 or 1:4)") from None
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"--nnodes {text!r}: need 1 <= MIN <= MAX (e.g. 2 or 1:4)")
        return cls(min_nodes, max_nodes)


def _env_default(name: str, default: str | None) -> str | None:
    return os.environ.get("PET_" + name.upper().replace("-", "_"), default)


def _add(
    parser: argparse.ArgumentParser, name: str, default: str | None, help: str, **kw: object
) -> None:
    """Add ``--a-b`` with its torchrun alias ``--a_b`` and the ``PET_A_B`` default."""
    flags = [f"--{name}"]
    if "-" in name:
        flags.append("--" + name.replace("-", "_"))
    parser.add_argument(*flags, default=_env_default(name, default), help=help, **kw)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchx_elastic.agent",
        description=(
            "torchx-elastic's elastic agent: rendezvous with the other nodes, start"
            " --nproc-per-node workers running SCRIPT (or -m MODULE) with the standard"
            " torch.distributed environment, show their output as whole lines prefixed"
            " by node and rank, restart them on failure and report the root cause."
        ),
    )
    _add(parser, "nnodes", "1", "number of nodes, N or MIN:MAX (elastic)")
    _add(parser, "nproc-per-node", "1", "worker processes on this node")
    _add(parser, "rdzv-backend", "c10d", "rendezvous backend (c10d, static, etcd-v2)")
    _add(
        parser,
        "rdzv-endpoint",
        "localhost:0",
        "HOST:PORT of the rendezvous store on the rank-0 node; ${VAR:-default} is expanded"
        " (port 0 picks a free port: single node only)",
    )
    _add(parser, "rdzv-id", "none", "job id shared by all nodes of the job")
    _add(
        parser, "rdzv-conf", "", "extra rendezvous settings, KEY=VALUE,... (e.g. join_timeout=600)"
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="single node: rendezvous on a free local port (ignores --rdzv-* flags)",
    )
    _add(
        parser,
        "max-restarts",
        "0",
        "in-place restarts of the worker group before failing",
        type=int,
    )
    _add(parser, "monitor-interval", "0.1", "seconds between checks of the workers", type=float)
    _add(parser, "role", "default", "role name of the workers")
    _add(
        parser, "log-dir", None, "directory for per-rank logs (default: a new temporary directory)"
    )
    _add(
        parser,
        "tee",
        "3",
        "worker streams shown on the console: 0 none, 1 stdout, 2 stderr, 3 both"
        " (the log files always keep both)",
        type=int,
    )
    _add(
        parser,
        "log-line-prefix-template",
        DEFAULT_PREFIX,
        "prefix of each worker line; fields {node}, {rank}, {local_rank}, {role}",
    )
    _add(
        parser,
        "console-ranks",
        "all",
        "global ranks whose lines the console shows, e.g. 0 or 0,2-3 (the log files keep all)",
    )
    _add(
        parser,
        "console",
        "auto",
        "auto: a live progress bar when stdout is a terminal, plain lines otherwise",
        choices=CONSOLE_MODES,
    )
    _add(
        parser,
        "status-interval-s",
        str(DEFAULT_STATUS_INTERVAL_S),
        "seconds between plain progress lines when the console is not a terminal (0: none)",
        type=float,
    )
    _add(
        parser,
        "exit-barrier-timeout",
        "30",
        "seconds a finished node waits for the other nodes to finish",
        type=float,
    )
    _add(
        parser,
        "term-timeout-s",
        "30",
        "seconds workers get to exit after SIGTERM (agent stopped, restart) before SIGKILL",
        type=float,
    )
    _add(
        parser,
        "hang-timeout-s",
        "0",
        "restart (or fail) when a rank sends no progress()/heartbeat() for this many seconds;"
        " every rank's Python stack is dumped to its log first (0: off)",
        type=float,
    )
    _add(
        parser,
        "start-method",
        "spawn",
        "how workers start: spawn (a fresh interpreter per worker) or fork-server (forked"
        " from a process that imported torch once: much faster starts and restarts, but"
        " forked workers sometimes hang at exit; see docs/agent.md)",
        choices=("fork-server", "spawn"),
    )
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="run SCRIPT as a Python module, as `python -m SCRIPT`",
    )
    parser.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        help="run SCRIPT as an executable, not through the Python interpreter",
    )
    parser.add_argument(
        "training_script", metavar="SCRIPT", help="script (or module with -m) to run"
    )
    parser.add_argument(
        "training_script_args", metavar="ARGS", nargs=argparse.REMAINDER, help="its arguments"
    )
    return parser


def parse_rdzv_conf(text: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--rdzv-conf item {item!r} is not KEY=VALUE (e.g. join_timeout=600)")
        conf[key] = value
    return conf
