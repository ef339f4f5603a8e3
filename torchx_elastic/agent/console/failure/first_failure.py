"""The job's first failure, agreed by every node over the rendezvous round's store.

Each node classifies its own failed ranks (report.py). A node with a rank that failed on its
own offers it as the job's first failure of the attempt (``torchx_elastic/failure/attempt<k>``)
with ``compare_set``: the first writer wins, and every node reads the winner back (validated:
a value that is not a :class:`FirstFailure` is ignored). A node whose ranks only lost a peer
offers nothing and waits (up to ``wait_s``) for the winner. At the job's end, every node
counts itself done on ``.../left`` (after it shut its rendezvous down) and waits (up to
``wait_s``) for the others, so the agent that hosts the store leaves last.

The same store as the progress exchange (job_progress.py): no new port.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.contract import FAILURE_KEY_PREFIX
from torchx_elastic.contract.not_retried import is_not_retried

log = logging.getLogger(__name__)

DEFAULT_WAIT_S = 10.0
_POLL_S = 0.05
LOST_PROBE_S = 0.5  # between two looks for a lost peer while waiting for the first failure
LOST_NODE = "node lost"  # the ``how`` of a node whose agent is gone with its ranks


class FailureStore(Protocol):
    """The part of ``torch.distributed.Store`` used here."""

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...

    def add(self, key: str, value: int) -> int: ...

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> bytes: ...


@dataclass(frozen=True)
class FirstFailure:
    """The rank that failed first in the job, as every node names it."""

    rank: int
    node: int
    how: str  # "exit code 1", "signal SIGKILL"
    message: str = ""  # the exception line ("ValueError: boom"), if its error file had one
    where: str = ""  # 'File "/abs/train.py", line 12' of the innermost traceback frame

    @property
    def retried(self) -> bool:
        """False for a failure that ends the job at once (contract/not_retried.py)."""
        return not is_not_retried(self.message)

    def describe(self) -> str:
        """``rank 2 (node 1) failed first: ValueError: boom``: what every node's error file
        (``torchx status``) says."""
        return f"rank {self.rank} (node {self.node}) failed first: {self.message or self.how}"

    def what(self) -> str:
        """``ValueError: boom (File "/abs/train.py", line 12)`` or ``exit code 13``."""
        text = self.message or self.how
        return f"{text} ({self.where})" if self.where else text

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> FirstFailure | None:
        """The failure in ``text``; None when it is not one."""
        try:
            data = json.loads(text)
            return cls(
                int(data["rank"]),
                int(data["node"]),
                str(data["how"]),
                str(data.get("message", "")),
                str(data.get("where", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None


def innermost_frame(traceback: str) -> str:
    """The last ``File "...", line N`` line of a Python traceback ('' when there is none)."""
    frames = [ln.strip() for ln in traceback.splitlines() if ln.strip().startswith('File "')]
    return frames[-1].split(", in ")[0] if frames else ""


def agree(
    store: FailureStore,
    attempt: int,
    own: FirstFailure | None,
    wait_s: float = DEFAULT_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    lost_peer: Callable[[], FirstFailure | None] | None = None,
) -> FirstFailure | None:
    """The job's first failure of ``attempt``: ``own`` offered (None: this node's ranks only
    lost peers), the winner read back; None when nobody offered one within ``wait_s`` or the
    store is gone. While it waits, ``lost_peer`` is asked every :data:`LOST_PROBE_S`: a
    node it finds lost (its agent gone, which never names a failure) is offered instead."""
    key = f"{FAILURE_KEY_PREFIX}{attempt}"
    deadline_s = clock() + wait_s
    probe_s = clock()
    try:
        if own is not None:
            return FirstFailure.from_json(store.compare_set(key, "", own.to_json())) or own
        while not store.check([key]) and clock() < deadline_s:
            if lost_peer is not None and clock() >= probe_s:
                lost = lost_peer()
                if lost is not None:
                    return agree(store, attempt, lost)
                probe_s = clock() + LOST_PROBE_S
            time.sleep(_POLL_S)
        return FirstFailure.from_json(store.get(key)) if store.check([key]) else None
    except RefusedEntry as err:  # not written by a node of the job: what this node knows
        log.warning("skipped the job's first failure from the store: %s", err)
        return own
    except Exception as err:  # the store went away (its host left): what this node knows
        log.debug("job failure exchange failed: %s", err)
        return own


def leave_together(
    store: FailureStore,
    attempt: int,
    num_nodes: int,
    wait_s: float = DEFAULT_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """The job ends: wait (up to ``wait_s``) until every node is done with the store (read
    the first failure, shut its rendezvous down), so the agent that hosts it leaves last."""
    key = f"{FAILURE_KEY_PREFIX}{attempt}/left"
    deadline_s = clock() + wait_s
    try:
        done = store.add(key, 1)
        while done < num_nodes and clock() < deadline_s:
            time.sleep(_POLL_S)
            done = store.add(key, 0)
    except Exception as err:  # noqa: BLE001 - gone already: nothing to wait for
        log.debug("job failure exchange: %s", err)


def not_retried_line(failed: FirstFailure, restarts_left: int) -> str:
    """What the node whose rank failed first says when the failure is not retried."""
    unused = f"{restarts_left} restart{'' if restarts_left == 1 else 's'} left unused"
    return f"torchx-elastic: {failed.describe()}; the job ends without a restart ({unused})"


def lost_node_line(lost: FirstFailure, restarts_left: int, next_round: int) -> str:
    """What one survivor says when the job's first failure was a lost node: its peers' ranks
    failed only because it vanished, so the job re-forms without it and no restart is spent
    (``--spares``: a standby takes its place at once)."""
    left = f"{restarts_left} restart{'' if restarts_left == 1 else 's'} left"
    return (
        f"torchx-elastic: {lost.message}; re-forming without it: rendezvous round {next_round}"
        f" next (a lost node is not the script's failure: no restart spent, {left})"
    )


@dataclass(frozen=True)
class RestartNotice:
    """What the restart line says (and the ``restart`` event records)."""

    failed: FirstFailure | None
    attempt: int  # 0-based index of the attempt that starts now
    max_restarts: int
    next_round: int  # this node's rendezvous rounds so far, +1

    def said_by(self, node: int) -> bool:
        """Once per job: by the node whose rank failed first (node 0 when none is known, the
        first other node when that node was lost)."""
        if self.failed is None:
            return node == 0
        if self.failed.how == LOST_NODE:
            return node == (1 if self.failed.node == 0 else 0)
        return node == self.failed.node

    def line(self) -> str:
        failed = "a rank failed"
        if self.failed is not None:
            where = f"rank {self.failed.rank} (node {self.failed.node})"
            failed = f"{where} failed: {self.failed.what()}"
        left = self.max_restarts - self.attempt
        return (
            f"torchx-elastic: {failed}; restarting every node: attempt {self.attempt + 1}"
            f" of {self.max_restarts + 1} ({left} restart{'' if left == 1 else 's'} left),"
            f" rendezvous round {self.next_round} next"
        )

    def fields(self) -> dict[str, object]:
        """The same facts for ``events.jsonl``."""
        return {
            "failed_rank": None if self.failed is None else self.failed.rank,
            "failed_node": None if self.failed is None else self.failed.node,
            "failure": None if self.failed is None else self.failed.what(),
            "max_restarts": self.max_restarts,
            "restarts_left": self.max_restarts - self.attempt,
            "next_round": self.next_round,
        }
