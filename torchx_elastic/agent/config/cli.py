"""Command line of the agent: torchrun's whole command line, plus a few flags of our own.

Every flag has both spellings (``--a-b`` and ``--a_b``) and reads ``PET_A_B`` from the
environment when it is not on the command line, exactly as torchrun's flags do (switches
such as ``--standalone`` read ``PET_STANDALONE=1``). Defaults are torchrun's. The flags are
data, one row each in :data:`TORCHRUN_FLAGS` and :data:`OWN_FLAGS` (a new flag is a new
row); :func:`build_parser` turns the rows into ``argparse`` calls. The parsed flags go
through :func:`torchx_elastic.agent.config.launch.config_from_args` once; nothing else reads
them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torchx_elastic.agent import compat
from torchx_elastic.agent.console.output.display import DEFAULT_STATUS_INTERVAL_S
from torchx_elastic.contract import PREFIX_TEMPLATE_ENV, SHUTDOWN_TIMEOUT_ENV
from torchx_elastic.contract.agent_args import (
    CONSOLE_MODES,
    DEFAULT_START_METHOD,
    FORK_SERVER,
    START_METHODS,
    START_METHODS_TEXT,
)

TORCHRUN_GROUP = "torchrun's flags"
OWN_GROUP = "torchx-elastic's own flags"
NUMA_BINDING_MODES = ("node", "socket", "exclusive", "core-complex")
COMPLETION_SHELLS = ("bash", "zsh", "tcsh")  # torchrun's choices without shtab installed
COMPLETION_PROG = "torchx-elastic-agent"  # the console script (pyproject.toml)


class _Adder(Protocol):
    """An argument parser or one of its groups."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


def env_name(dest: str) -> str:
    return "PET_" + dest.upper()


def _env_default(dest: str, default: Any) -> Any:
    """``PET_<DEST>`` where it is set, else ``default`` (torchrun's ``env`` action)."""
    return os.environ.get(env_name(dest), default)


def _env_switch(dest: str) -> bool:
    """Whether ``PET_<DEST>=1`` turns the switch on (torchrun's ``check_env`` action)."""
    text = os.environ.get(env_name(dest), "0")
    try:
        return bool(int(text))
    except ValueError:
        raise ValueError(
            f"{env_name(dest)}={text!r} is not 0 or 1 (it stands for the --"
            f"{dest.replace('_', '-')} switch)"
        ) from None


def _spellings(name: str, short: str | None = None) -> list[str]:
    flags = [short] if short else []
    flags.append(f"--{name}")
    if "-" in name:
        flags.append("--" + name.replace("-", "_"))
    return flags


class _PrintCompletion(argparse.Action):
    """torchrun's ``--print-completion SHELL``: the completion script made by the optional
    ``shtab`` package from this parser, for the ``torchx-elastic-agent`` command; exit."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            import shtab
        except ImportError:
            parser.exit(1, f"{option_string} requires the 'shtab' package: pip install shtab\n")
        parser.prog = COMPLETION_PROG
        print(shtab.complete(parser, shell=values))
        parser.exit()


def _comma_separated(text: str) -> list[str]:
    """torchrun's list format: ``a,b``; ``,,`` stands for a literal comma."""
    placeholder = "\0"
    return [item.replace(placeholder, ",") for item in text.replace(",,", placeholder).split(",")]


@dataclass(frozen=True)
class Flag:
    """One flag of the table: ``--a-b`` and ``--a_b`` (and ``short``), default ``PET_A_B`` if
    set, else (torchrun's flags) the installed torchrun's, else ``default``."""

    name: str
    default: Any
    help: str
    short: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    own_default: bool = False
    """A torchrun flag whose default is ours, not the installed torchrun's."""


@dataclass(frozen=True)
class Switch:
    """A switch (``store_true``); ``PET_A_B=1`` turns it on, ``0`` leaves it off."""

    name: str
    help: str
    short: str | None = None


@dataclass(frozen=True)
class ActionFlag:
    """A flag that acts when given (``--print-completion``): no default, no ``PET_*``."""

    name: str
    action: type[argparse.Action]
    choices: tuple[str, ...]
    help: str


Row = Flag | Switch | ActionFlag

DESCRIPTION = (
    "torchx-elastic's elastic agent, a drop-in torchrun: rendezvous with the other"
    " nodes, start --nproc-per-node workers running SCRIPT (or -m MODULE) with"
    " torchrun's environment, show their output as whole lines prefixed by node and"
    " rank, restart them on failure and report the root cause. Every flag also reads"
    " PET_<FLAG> from the environment (e.g. PET_NNODES=2:4)."
)

TORCHRUN_FLAGS: tuple[Row, ...] = (
    Flag("nnodes", "1:1", "number of nodes, N or MIN:MAX (elastic)"),
    Flag(
        "nproc-per-node",
        "1",
        "workers on this node: a number, or cpu, gpu, xpu, auto (one per accelerator, else"
        " one per CPU)",
    ),
    Flag("rdzv-backend", "static", "rendezvous backend (c10d, static, etcd, etcd-v2)"),
    Flag(
        "rdzv-endpoint",
        "",
        "HOST[:PORT] of the rendezvous store; ${VAR:-default} is expanded (port 0 picks a free"
        " port: single node only)",
    ),
    Flag("rdzv-id", "none", "job id shared by all nodes of the job"),
    Flag("rdzv-conf", "", "extra rendezvous settings, KEY=VALUE,... (e.g. join_timeout=600)"),
    Switch("standalone", "single node: rendezvous on a free local port (ignores --rdzv-* flags)"),
    Flag("max-restarts", 0, "restarts of the worker group before failing", type=int),
    Flag("monitor-interval", 0.1, "seconds between checks of the workers", type=float),
    Flag(
        "start-method",
        DEFAULT_START_METHOD,
        f"how workers start: {START_METHODS_TEXT}; {FORK_SERVER} (the default) starts and"
        " restarts much faster (docs/agent.md); torchrun's start a script as a fresh"
        " interpreter",
        choices=START_METHODS,
        own_default=True,
    ),
    Flag(
        "event-log-handler",
        "null",
        "torch.distributed.elastic events handler (null, console, ...)",
    ),
    Flag("role", "default", "role name of the workers"),
    Switch("module", "run SCRIPT as a Python module, as `python -m SCRIPT`", short="-m"),
    Switch("no-python", "run SCRIPT as an executable, not through Python"),
    Switch(
        "run-path",
        "run SCRIPT with runpy.run_path in the worker's interpreter (takes precedence over"
        " --no-python)",
    ),
    Flag(
        "log-dir",
        None,
        "directory for per-attempt, per-rank logs (default: a new temporary directory)",
    ),
    Flag(
        "redirects",
        "0",
        "streams kept off the console (the log files always get them): 0 none, 1 stdout,"
        " 2 stderr, 3 both, or per local rank, e.g. 0:1,1:2",
        short="-r",
    ),
    Flag(
        "tee",
        "0",
        "redirected streams shown on the console after all (same format as --redirects)",
        short="-t",
    ),
    Flag(
        "local-ranks-filter",
        "",
        "local ranks whose lines the console shows, e.g. 0,1 (the log files keep all)",
    ),
    Flag(
        "duplicate-stdout-filters",
        [],
        "copy stdout lines containing any of these words (a,b; ,, for a comma) to"
        " <log-dir>/filtered_stdout.log",
        type=_comma_separated,
    ),
    Flag(
        "duplicate-stderr-filters",
        [],
        "the same for stderr (<log-dir>/filtered_stderr.log)",
        type=_comma_separated,
    ),
    Flag("node-rank", 0, "rank of this node, for --rdzv-backend static", type=int),
    Flag(
        "master-addr",
        "127.0.0.1",
        "address of the rank-0 node, for --rdzv-backend static without --rdzv-endpoint",
    ),
    Flag(
        "master-port",
        None,
        "port on the rank-0 node, for --rdzv-backend static (default 29500; for one node, as"
        " torchrun from torch 2.5 on: a free port)",
        type=int,
    ),
    Flag(
        "local-addr",
        None,
        "address of this node that the other nodes use (default: looked up, else the FQDN)",
    ),
    Flag(
        "logs-specs",
        None,
        "name of a torchrun.logs_specs entry point: a LogsSpecs class that chooses where"
        " the log files go",
    ),
    Flag(
        "numa-binding",
        None,
        "bind workers to the CPUs near their GPU (needs GPUs and a torch that has it)",
        choices=NUMA_BINDING_MODES,
    ),
    Flag(
        "signals-to-handle",
        None,  # torchrun's where it has the flag; torch 2.4's sets no TORCHELASTIC_SIGNALS_...
        "signals that stop the agent and its workers (comma-separated; default torchrun's)",
    ),
    Flag(
        "shutdown-timeout",
        None,
        "seconds workers get to exit after SIGTERM before SIGKILL (default:"
        f" {SHUTDOWN_TIMEOUT_ENV}, else --term-timeout-s)",
        type=int,
    ),
    Switch(
        "virtual-local-rank",
        "LOCAL_RANK=0 in every worker, each seeing only its own GPU (CUDA_VISIBLE_DEVICES)",
    ),
    ActionFlag(
        "print-completion",
        _PrintCompletion,
        COMPLETION_SHELLS,
        "print a shell completion script for torchx-elastic-agent and exit (e.g."
        " --print-completion zsh > ~/.zsh/completions/_torchx-elastic-agent); needs the"
        " optional 'shtab' package",
    ),
)

OWN_FLAGS: tuple[Row, ...] = (
    Flag(
        "log-line-prefix-template",
        None,
        "prefix of each worker line: torchrun's ${role_name}, ${rank}, ${local_rank},"
        " ${hostname} (e.g. '${hostname}:${rank}: '), or our fields {node}, {rank},"
        " {local_rank}, {role}, {hostname}"
        f" (default {PREFIX_TEMPLATE_ENV} if set, else '[n{{node}} r{{rank}}] ')",
    ),
    Flag(
        "console-ranks",
        "all",
        "global ranks whose lines the console shows, e.g. 0 or 0,2-3 (the log files keep all)",
    ),
    Flag(
        "console",
        "auto",
        "auto: a live progress bar when stdout is a terminal, plain lines otherwise (a file, a"
        " pipe, a batch job's pseudo-terminal such as Slurm's srun --unbuffered); live; plain",
        choices=CONSOLE_MODES,
    ),
    Flag(
        "status-interval-s",
        DEFAULT_STATUS_INTERVAL_S,
        "seconds between plain progress lines when the console is not a terminal (0: none)",
        type=float,
    ),
    Flag(
        "exit-barrier-timeout",
        30.0,
        "seconds a finished node waits for the other nodes to finish",
        type=float,
    ),
    Flag(
        "term-timeout-s",
        None,
        "seconds workers get to exit after SIGTERM (agent stopped, restart) before SIGKILL"
        f" (default: {SHUTDOWN_TIMEOUT_ENV}, else 30)",
        type=float,
    ),
    Flag(
        "hang-timeout-s",
        0.0,
        "restart (or fail) when a rank sends no progress()/heartbeat() for this many seconds;"
        " every rank's Python stack is dumped to its log first (0: off)",
        type=float,
    ),
    Flag(
        "health-check",
        "",
        "a shell command run before each rendezvous round this node would join: any exit"
        " code but 0 (or no exit within 120s) keeps the node out of the job, and it exits 1"
        " saying why (the output is kept in the log directory)",
    ),
    Flag(
        "spares",
        0,
        "nodes that stand by at the rendezvous beyond --nnodes' maximum (dist.ddp --spares"
        " passes it): a job of one node with spares has several agents, so without a job"
        " secret it runs unauthenticated rather than each agent making its own",
        type=int,
    ),
    Flag(
        "no-retry-on",
        "",
        "failures that end the job at once, without a restart: exception classes and exit"
        " codes, comma-separated (e.g. ValueError,mypkg.ConfigError,2); a worker that raises"
        " torchx_elastic.NotRetried or exits with 78 is never retried",
    ),
)

GROUPS = ((TORCHRUN_GROUP, TORCHRUN_FLAGS), (OWN_GROUP, OWN_FLAGS))


def _add(group: _Adder, row: Row, torchruns: bool) -> None:
    """``row`` as ``add_argument`` on ``group`` (``torchruns``: torchrun's flag group)."""
    dest = row.name.replace("-", "_")
    flags = _spellings(row.name, None if isinstance(row, ActionFlag) else row.short)
    if isinstance(row, ActionFlag):
        group.add_argument(*flags, action=row.action, choices=row.choices, help=row.help)
    elif isinstance(row, Switch):
        group.add_argument(*flags, action="store_true", default=_env_switch(dest), help=row.help)
    else:
        default = row.default
        if torchruns and not row.own_default:
            # the installed torch's torchrun's default, ours where it lacks one
            default = compat.torchrun_defaults().get(dest, default)
        extra: dict[str, Any] = {"type": row.type} if row.type else {}
        if row.choices:
            extra["choices"] = row.choices
        group.add_argument(*flags, default=_env_default(dest, default), help=row.help, **extra)


def build_parser() -> argparse.ArgumentParser:
    """The agent's parser, from the flag tables (each flag's ``PET_*`` read now)."""
    parser = argparse.ArgumentParser(prog="python -m torchx_elastic.agent", description=DESCRIPTION)
    for title, rows in GROUPS:
        group = parser.add_argument_group(title)
        for row in rows:
            _add(group, row, torchruns=title == TORCHRUN_GROUP)
    parser.add_argument("training_script", help="script (or module with -m) to run")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser
