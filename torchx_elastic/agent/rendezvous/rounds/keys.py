"""Where the agent's own rendezvous keeps its state in the store: small keys per round.

Every key is under ``torchx-elastic/rounds/<run id>/``. A round ``T`` is opened by its
marker (``r<T>/opened``: the rounds only ever move forward, and a marker forged without the
job's secret is passed over), joined by taking an arrival slot (``r<T>/count``, one
``add``) and writing that slot's node (``r<T>/slot/<i>``), and completed by one node's
outcome (``r<T>/done``: the number of members and the deciding slot, written once with a
compare-and-set), after it gave each chosen slot its rank (``r<T>/o<d>/rank/<i>``) and each
rank its node (``r<T>/o<d>/member/<rank>``) in one ``multi_set``, under its own slot ``d``:
two nodes that decide at once never mix their outcomes. The nodes said dead are an index
(``dropped-count``, ``dropped-at/<i>``) that each node reads from where it left off. A node
reads its own slot's rank: no node reads the whole round unless it asks who is in it.
Values a node acts on are signed with the job's secret (signed_store.py); the counters
(``add``) cannot be, and a forged one can only make nodes wait or re-form, never admit a
node.
"""

from __future__ import annotations

import dataclasses

PREFIX = "torchx-elastic/rounds/"


@dataclasses.dataclass(frozen=True)
class Node:
    """A node of the rendezvous: the address it publishes, its agent's pid, a number that
    tells apart the agents of one process (and a replacement container from the node it
    replaces: the same host name and pid), and the round and rank it had last (``-1``: none),
    by which the returning members of a round get their places back first."""

    addr: str
    pid: int
    local_id: int
    last_round: int = -1
    last_rank: int = -1

    @property
    def id(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"

    @property
    def name(self) -> str:
        return f"{self.addr} (agent pid {self.pid})"

    def encode(self) -> str:
        return f"{self.addr} {self.pid} {self.local_id} {self.last_round} {self.last_rank}"

    @classmethod
    def decode(cls, text: str | bytes) -> Node:
        if isinstance(text, bytes):
            text = text.decode()
        addr, pid, local_id, last_round, last_rank = text.rsplit(" ", 4)
        return cls(addr, int(pid), int(local_id), int(last_round), int(last_rank))


class Keys:
    """The store keys of one run's rendezvous."""

    def __init__(self, run_id: str) -> None:
        self.base = f"{PREFIX}{run_id}/"
        self.closed = self.base + "closed"

    def dropped(self, node_id: str) -> str:
        """Set once a watcher said ``node_id`` dead: no later round admits it."""
        return f"{self.base}dropped/{node_id}"

    @property
    def dropped_count(self) -> str:
        """How many nodes were said dead: the index below, read from where a node left off."""
        return f"{self.base}dropped-count"

    def dropped_at(self, index: int) -> str:
        """The id of the ``index``-th node said dead."""
        return f"{self.base}dropped-at/{index}"

    def opened(self, rnd: int) -> str:
        """Set (signed) once round ``rnd`` is opened; round 0 always is."""
        return f"{self.base}r{rnd}/opened"

    def count(self, rnd: int) -> str:
        return f"{self.base}r{rnd}/count"

    def back(self, rnd: int) -> str:
        """How many members of the round before ``rnd`` came back to it."""
        return f"{self.base}r{rnd}/back"

    def lost(self, rnd: int) -> str:
        """How many members of ``rnd`` were said dead (they do not come back to the next)."""
        return f"{self.base}r{rnd}/lost"

    def slot(self, rnd: int, index: int) -> str:
        return f"{self.base}r{rnd}/slot/{index}"

    def done(self, rnd: int) -> str:
        return f"{self.base}r{rnd}/done"

    def rank(self, rnd: int, index: int, decider: int) -> str:
        """The rank of slot ``index`` in the outcome of the arrival that ``decider`` took
        (``done`` names the deciding slot whose outcome stands)."""
        return f"{self.base}r{rnd}/o{decider}/rank/{index}"

    def member(self, rnd: int, rank: int, decider: int) -> str:
        return f"{self.base}r{rnd}/o{decider}/member/{rank}"

    def master(self, rnd: int) -> str:
        """Where the workers of ``rnd`` would meet as torchrun's (rank 0's address, a port)."""
        return f"{self.base}r{rnd}/master"

    def store_prefix(self, run_id: str, rnd: int) -> str:
        """The prefix of the store a round hands its agents (as torch's c10d handler's)."""
        return f"torch.rendezvous.{run_id}.{rnd}"
