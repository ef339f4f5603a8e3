"""The values of the agent's options that every front-end reads the same way.

The agent's command line (``agent/config``), ``launch(fn)`` (``torchx_elastic.launcher``) and
the components (``dist.ddp``'s ``-j``, ``start_method``, ``console``) all take a node range, a
start method and a console mode; this is the one list or parser of each.

Standard library only.
"""

from __future__ import annotations

from typing import Literal, get_args

# How the workers start: the one list, each name spelled once. Mind the hyphen:
# ``fork-server`` is ours, ``forkserver`` is torchrun's (multiprocessing's) and means what it
# means there; both are taken, so that a torchrun command line runs unchanged. For a script
# (the agent, dist.ddp): fork-server forks each worker from a process that imported torch
# once; torchrun's three each start a fresh interpreter, as torchrun does. For a function
# (launch(fn)): spawn is a fresh interpreter; fork, forkserver and fork-server fork the
# workers from the caller (fork even while other threads run, the other two only where none
# does, else they spawn). docs/agent.md, "How workers start", is the account for users.
FORK_SERVER = "fork-server"  # ours
SPAWN, FORK, FORKSERVER = "spawn", "fork", "forkserver"  # torchrun's
TORCHRUN_START_METHODS = (SPAWN, FORK, FORKSERVER)
START_METHODS = (FORK_SERVER, *TORCHRUN_START_METHODS)
DEFAULT_START_METHOD = FORK_SERVER  # the agent's and the components' (torchrun's: spawn)
FUNCTION_DEFAULT_START_METHOD = SPAWN  # launch(fn)'s, as torch's elastic_launch
START_METHODS_TEXT = (
    f"{FORK_SERVER} (ours, with a hyphen: workers forked from a process that imported torch"
    f" once) or torchrun's {', '.join(TORCHRUN_START_METHODS)} (as torchrun means them)"
)
# the agent's console (--console, dist.ddp's console, launch(console=)): auto: a live progress
# bar on a person's terminal, plain lines in files, pipes and batch jobs; plain; live
ConsoleMode = Literal["auto", "plain", "live"]
CONSOLE_MODES: tuple[ConsoleMode, ...] = get_args(ConsoleMode)
DEFAULT_CONSOLE: ConsoleMode = "auto"
NODE_RANGE_EXAMPLES = "N or MIN:MAX, e.g. 2 or 1:4"
# the agent's flag of the rendezvous' HOST:PORT, as the components write it (local_cwd reads it)
RDZV_ENDPOINT_FLAG = "--rdzv-endpoint"


class StartMethodError(ValueError):
    """A start method that is none of :data:`START_METHODS`."""

    def __init__(self, value: str) -> None:
        super().__init__(f"{value!r} is not a start method: {START_METHODS_TEXT}")


class NodeRangeError(ValueError):
    """A node range that is not ``N`` or ``MIN:MAX``; ``reason`` says why."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"{text!r}: {reason} ({NODE_RANGE_EXAMPLES})")
        self.reason = reason


def check_start_method(value: str) -> str:
    if value not in START_METHODS:
        raise StartMethodError(value)
    return value


def parse_node_range(text: str | int, min_low: int = 1) -> tuple[int, int]:
    """``"2"`` -> (2, 2), ``"1:4"`` -> (1, 4); ``min_low``: the smallest MIN (0 where a
    scheduler may start a job with none of its nodes up). :class:`NodeRangeError` otherwise."""
    text = str(text)
    low, colon, high = text.partition(":")
    try:
        max_nodes = int(high if colon else low)
        min_nodes = int(low)
    except ValueError:
        raise NodeRangeError(text, "not a number of nodes") from None
    if max_nodes < 1:
        raise NodeRangeError(text, "the node count (MAX) must be at least 1")
    if min_nodes > max_nodes:
        raise NodeRangeError(text, f"MIN nodes ({min_nodes}) is above MAX nodes ({max_nodes})")
    if min_nodes < min_low:
        raise NodeRangeError(text, f"MIN nodes must be at least {min_low}")
    return min_nodes, max_nodes
