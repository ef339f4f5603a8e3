"""Command line of the agent: torchrun's whole command line, plus a few flags of our own.

Every flag has both spellings (``--a-b`` and ``--a_b``) and reads ``PET_A_B`` from the
environment when it is not on the command line, exactly as torchrun's flags do (switches
such as ``--standalone`` read ``PET_STANDALONE=1``). Defaults are torchrun's. The parsed
flags go through :func:`torchx_elastic.agent.config.launch.config_from_args` once; nothing
else reads them.
"""

from __future__ import annotations

import argparse
import os
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


def _flag(
    parser: _Adder,
    name: str,
    default: Any,
    help: str,
    short: str | None = None,
    own_default: bool = False,
    **kw: Any,
) -> None:
    """``--a-b``, ``--a_b`` (and ``short``), default from ``PET_A_B`` or ``default``."""
    if getattr(parser, "title", None) == TORCHRUN_GROUP and not own_default:
        # torchrun's flags: the installed torch's torchrun's default, ours where it lacks one
        default = compat.torchrun_defaults().get(name.replace("-", "_"), default)
    default = _env_default(kw.get("dest", name.replace("-", "_")), default)
    parser.add_argument(*_spellings(name, short), default=default, help=help, **kw)


def _switch(parser: _Adder, name: str, help: str, short: str | None = None) -> None:
    default = _env_switch(name.replace("-", "_"))
    parser.add_argument(*_spellings(name, short), action="store_true", default=default, help=help)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchx_elastic.agent",
        description=(
            "torchx-elastic's elastic agent, a drop-in torchrun: rendezvous with the other"
            " nodes, start --nproc-per-node workers running SCRIPT (or -m MODULE) with"
            " torchrun's environment, show their output as whole lines prefixed by node and"
            " rank, restart them on failure and report the root cause. Every flag also reads"
            " PET_<FLAG> from the environment (e.g. PET_NNODES=2:4)."
        ),
    )
    torchrun = parser.add_argument_group(TORCHRUN_GROUP)
    _flag(torchrun, "nnodes", "1:1", "number of nodes, N or MIN:MAX (elastic)")
    _flag(
        torchrun,
        "nproc-per-node",
        "1",
        "workers on this node: a number, or cpu, gpu, xpu, auto (one per accelerator, else"
        " one per CPU)",
    )
    _flag(torchrun, "rdzv-backend", "static", "rendezvous backend (c10d, static, etcd, etcd-v2)")
    _flag(
        torchrun,
        "rdzv-endpoint",
        "",
        "HOST[:PORT] of the rendezvous store; ${VAR:-default} is expanded (port 0 picks a free"
        " port: single node only)",
    )
    _flag(torchrun, "rdzv-id", "none", "job id shared by all nodes of the job")
    _flag(
        torchrun,
        "rdzv-conf",
        "",
        "extra rendezvous settings, KEY=VALUE,... (e.g. join_timeout=600)",
    )
    _switch(
        torchrun,
        "standalone",
        "single node: rendezvous on a free local port (ignores --rdzv-* flags)",
    )
    _flag(torchrun, "max-restarts", 0, "restarts of the worker group before failing", type=int)
    _flag(torchrun, "monitor-interval", 0.1, "seconds between checks of the workers", type=float)
    _flag(
        torchrun,
        "start-method",
        DEFAULT_START_METHOD,
        f"how workers start: {START_METHODS_TEXT}; {FORK_SERVER} (the default) starts and"
        " restarts much faster (docs/agent.md); torchrun's start a script as a fresh"
        " interpreter",
        choices=START_METHODS,
        own_default=True,
    )
    _flag(
        torchrun,
        "event-log-handler",
        "null",
        "torch.distributed.elastic events handler (null, console, ...)",
    )
    _flag(torchrun, "role", "default", "role name of the workers")
    _switch(torchrun, "module", "run SCRIPT as a Python module, as `python -m SCRIPT`", short="-m")
    _switch(torchrun, "no-python", "run SCRIPT as an executable, not through Python")
    _switch(
        torchrun,
        "run-path",
        "run SCRIPT with runpy.run_path in the worker's interpreter (takes precedence over"
        " --no-python)",
    )
    _flag(
        torchrun,
        "log-dir",
        None,
        "directory for per-attempt, per-rank logs (default: a new temporary directory)",
    )
    _flag(
        torchrun,
        "redirects",
        "0",
        "streams kept off the console (the log files always get them): 0 none, 1 stdout,"
        " 2 stderr, 3 both, or per local rank, e.g. 0:1,1:2",
        short="-r",
    )
    _flag(
        torchrun,
        "tee",
        "0",
        "redirected streams shown on the console after all (same format as --redirects)",
        short="-t",
    )
    _flag(
        torchrun,
        "local-ranks-filter",
        "",
        "local ranks whose lines the console shows, e.g. 0,1 (the log files keep all)",
    )
    _flag(
        torchrun,
        "duplicate-stdout-filters",
        [],
        "copy stdout lines containing any of these words (a,b; ,, for a comma) to"
        " <log-dir>/filtered_stdout.log",
        type=_comma_separated,
    )
    _flag(
        torchrun,
        "duplicate-stderr-filters",
        [],
        "the same for stderr (<log-dir>/filtered_stderr.log)",
        type=_comma_separated,
    )
    _flag(
        torchrun,
        "node-rank",
        0,
        "rank of this node, for --rdzv-backend static",
        type=int,
    )
    _flag(
        torchrun,
        "master-addr",
        "127.0.0.1",
        "address of the rank-0 node, for --rdzv-backend static without --rdzv-endpoint",
    )
    _flag(
        torchrun,
        "master-port",
        None,
        "port on the rank-0 node, for --rdzv-backend static (default 29500; for one node, as"
        " torchrun from torch 2.5 on: a free port)",
        type=int,
    )
    _flag(
        torchrun,
        "local-addr",
        None,
        "address of this node that the other nodes use (default: looked up, else the FQDN)",
    )
    _flag(
        torchrun,
        "logs-specs",
        None,
        "name of a torchrun.logs_specs entry point: a LogsSpecs class that chooses where"
        " the log files go",
    )
    _flag(
        torchrun,
        "numa-binding",
        None,
        choices=NUMA_BINDING_MODES,
        help="bind workers to the CPUs near their GPU (needs GPUs and a torch that has it)",
    )
    _flag(
        torchrun,
        "signals-to-handle",
        None,  # torchrun's where it has the flag; torch 2.4's sets no TORCHELASTIC_SIGNALS_...
        "signals that stop the agent and its workers (comma-separated; default torchrun's)",
    )
    _flag(
        torchrun,
        "shutdown-timeout",
        None,
        "seconds workers get to exit after SIGTERM before SIGKILL (default:"
        f" {SHUTDOWN_TIMEOUT_ENV}, else --term-timeout-s)",
        type=int,
    )
    _switch(
        torchrun,
        "virtual-local-rank",
        "LOCAL_RANK=0 in every worker, each seeing only its own GPU (CUDA_VISIBLE_DEVICES)",
    )
    torchrun.add_argument(
        *_spellings("print-completion"),
        action=_PrintCompletion,
        choices=COMPLETION_SHELLS,
        help="print a shell completion script for torchx-elastic-agent and exit (e.g."
        " --print-completion zsh > ~/.zsh/completions/_torchx-elastic-agent); needs the"
        " optional 'shtab' package",
    )

    ours = parser.add_argument_group("torchx-elastic's own flags")
    _flag(
        ours,
        "log-line-prefix-template",
        None,
        "prefix of each worker line: torchrun's ${role_name}, ${rank}, ${local_rank},"
        " ${hostname} (e.g. '${hostname}:${rank}: '), or our fields {node}, {rank},"
        " {local_rank}, {role}, {hostname}"
        f" (default {PREFIX_TEMPLATE_ENV} if set, else '[n{{node}} r{{rank}}] ')",
    )
    _flag(
        ours,
        "console-ranks",
        "all",
        "global ranks whose lines the console shows, e.g. 0 or 0,2-3 (the log files keep all)",
    )
    _flag(
        ours,
        "console",
        "auto",
        "auto: a live progress bar when stdout is a terminal, plain lines otherwise (a file, a"
        " pipe, a batch job's pseudo-terminal such as Slurm's srun --unbuffered); live; plain",
        choices=CONSOLE_MODES,
    )
    _flag(
        ours,
        "status-interval-s",
        DEFAULT_STATUS_INTERVAL_S,
        "seconds between plain progress lines when the console is not a terminal (0: none)",
        type=float,
    )
    _flag(
        ours,
        "exit-barrier-timeout",
        30.0,
        "seconds a finished node waits for the other nodes to finish",
        type=float,
    )
    _flag(
        ours,
        "term-timeout-s",
        None,
        "seconds workers get to exit after SIGTERM (agent stopped, restart) before SIGKILL"
        f" (default: {SHUTDOWN_TIMEOUT_ENV}, else 30)",
        type=float,
    )
    _flag(
        ours,
        "hang-timeout-s",
        0.0,
        "restart (or fail) when a rank sends no progress()/heartbeat() for this many seconds;"
        " every rank's Python stack is dumped to its log first (0: off)",
        type=float,
    )
    parser.add_argument("training_script", help="script (or module with -m) to run")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser
