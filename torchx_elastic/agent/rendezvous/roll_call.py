"""Who came to the rendezvous, with which settings: each node publishes itself in the store.

Every node that reaches the c10d rendezvous store appends, as its first round starts, one
JSON entry (its host, agent pid, run id, the address it publishes to its peers, the number
of its torch node descriptor, and the settings all nodes must share) under
``torchx_elastic/roll_call/``. Any node reads them all to say who is there, and to name,
within seconds, a peer started with other settings, another job on the same endpoint, or a
peer whose published address this node cannot resolve. Entries are signed
with the job's secret (signed_store.py) and only verified ones are acted on; an entry this
job cannot verify (another job's, or a node given another secret) is read as JSON, never
unpickled, for a warning only.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous.diagnosis import Problem, resolved
from torchx_elastic.agent.rendezvous.signed_store import MAGIC, StoreSigner
from torchx_elastic.contract import ROLL_CALL_KEY_PREFIX, SECRET_ENV

PREFIX = ROLL_CALL_KEY_PREFIX
COUNT_KEY = PREFIX + "count"
# settings whose mismatch between nodes makes the job wrong or its rendezvous hang
SHARED_SETTINGS = {
    "nnodes": "--nnodes",
    "nproc_per_node": "--nproc-per-node",
    "max_restarts": "--max-restarts",
    "rdzv_backend": "--rdzv-backend",
    # a node on torch's heartbeats drops every node on keyed ones (liveness.py)
    "liveness": "--rdzv-conf liveness",
}


@dataclass(frozen=True)
class NodeEntry:
    host: str
    pid: int
    run_id: str
    addr: str
    """The address this node publishes to its peers (``--local-addr``, else its FQDN)."""
    nnodes: str
    nproc_per_node: int
    max_restarts: int
    rdzv_backend: str
    left: bool = False
    liveness: str = "state"  # an agent's entry without it: torch's heartbeats
    local_id: int | None = None
    """The number of this node's rendezvous handler in its process (a node of the
    rendezvous is ``addr``, ``pid`` and it: rounds/keys.py); None: not known."""

    @classmethod
    def of_this_node(cls, config: AgentConfig) -> NodeEntry:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            run_id=config.run_id,
            addr=config.local_addr or socket.getfqdn(),
            nnodes=config.nnodes,
            nproc_per_node=config.nproc_per_node,
            max_restarts=config.max_restarts,
            rdzv_backend=config.rdzv_backend,
            liveness=config.rdzv.liveness_mode(config.rdzv_backend),
        )

    @property
    def name(self) -> str:
        return f"{self.host} (pid {self.pid})"

    def to_json(self) -> bytes:
        values = asdict(self)
        if values["liveness"] == "state":  # as an agent without the field writes it
            del values["liveness"]
        if values["local_id"] is None:
            del values["local_id"]
        return json.dumps(values).encode()

    @classmethod
    def from_json(cls, data: bytes) -> NodeEntry | None:
        """The entry, of the fields this agent knows (a later agent's entry may have more);
        None where ``data`` is not one."""
        try:
            values: dict[str, Any] = json.loads(data)
            return cls(**{k: v for k, v in values.items() if k in _FIELDS})
        except (ValueError, TypeError, AttributeError):
            return None


_FIELDS = {f.name for f in fields(NodeEntry)}


class RollCall:
    """This node's entry in a store, and everyone's."""

    def __init__(
        self, store: Any, me: NodeEntry, signer: StoreSigner, publish: bool = True
    ) -> None:
        self._store = store
        self._signer = signer
        self.me = me
        self._fetched = 0  # entries read so far (an entry is written once, then only left)
        self._verified: list[NodeEntry] = []
        self._unverified: list[NodeEntry] = []
        self._index: int | None = None
        if publish:
            self.publish()

    def publish(self) -> None:
        """Publish this node's entry (once): it came."""
        if self._index is None:
            self._index = int(self._store.add(COUNT_KEY, 1)) - 1
            self._publish(self.me)

    @staticmethod
    def _key(index: int) -> str:
        return f"{PREFIX}{index}"

    def _publish(self, entry: NodeEntry) -> None:
        if self._index is not None:
            key = self._key(self._index)
            self._store.set(key, self._signer.seal(key, entry.to_json()))

    def entries(self) -> tuple[list[NodeEntry], list[NodeEntry]]:
        """Every node that published itself, in the order they came: those signed with
        this job's secret, and those it cannot verify. Each entry is fetched once (a poll
        costs one counter read while nobody new comes, whatever the number of nodes)."""
        count = int(self._store.add(COUNT_KEY, 0))
        keys = [self._key(i) for i in range(self._fetched, count)]
        while keys and not self._store.check(keys):  # counted, not written yet: not waited for
            keys.pop()
        if keys:
            for key, value in zip(keys, self._store.multi_get(keys), strict=True):
                blob = bytes(value)
                try:
                    entry = NodeEntry.from_json(self._signer.open(key, blob))
                    found = self._verified
                except RefusedEntry:
                    body = blob[len(MAGIC) + 32 :] if blob.startswith(MAGIC) else blob
                    entry, found = NodeEntry.from_json(body), self._unverified
                if entry is not None:
                    found.append(entry)
            self._fetched += len(keys)
        return list(self._verified), list(self._unverified)

    def leave(self) -> None:
        """Say that this node is no longer there (its agent ends; read by the nodes that
        come after), where it said it came."""
        self._publish(NodeEntry(**{**asdict(self.me), "left": True}))


def job_peers(entries: list[NodeEntry], run_id: str) -> list[NodeEntry]:
    return [e for e in entries if e.run_id == run_id and not e.left]


def settings_mismatch(entries: list[NodeEntry], me: NodeEntry) -> Problem | None:
    """The first shared setting on which a node of this job differs from this one, that node
    gone or not (it may have seen the mismatch first, said it and left)."""
    for peer in (e for e in entries if e.run_id == me.run_id):
        for field_name, flag in SHARED_SETTINGS.items():
            mine, theirs = getattr(me, field_name), getattr(peer, field_name)
            if mine != theirs:
                return Problem(
                    f"nodes disagree on {flag}: {mine} on {me.name}, {theirs} on {peer.name}",
                    f"start every node of run id {me.run_id!r} with the same {flag}",
                )
    return None


def other_secret(unverified: list[NodeEntry], me: NodeEntry) -> Problem | None:
    """A node of this run id whose entry is not signed with this node's secret."""
    strangers = sorted({e.name for e in unverified if e.run_id == me.run_id and not e.left})
    if not strangers:
        return None
    return Problem(
        f"{', '.join(strangers)} came to run id {me.run_id!r} with another secret (or none):"
        " its rendezvous state is refused",
        f"give every node the same {SECRET_ENV} (docs/security.md)",
    )


def other_jobs(entries: list[NodeEntry], me: NodeEntry, endpoint: str) -> Problem | None:
    """Another job (another run id) that uses the same rendezvous endpoint."""
    others = [e for e in entries if e.run_id != me.run_id and not e.left]
    if not others:
        return None
    names = ", ".join(sorted({f"{e.run_id!r} on {e.name}" for e in others}))
    return Problem(
        f"another job uses the rendezvous endpoint {endpoint} too (run id {names}; this"
        f" job's is {me.run_id!r}): when its host ends, this job loses its rendezvous",
        "give each job its own --rdzv-endpoint port",
    )


def unreachable_address(peer: NodeEntry, me: NodeEntry, port: int, timeout_s: float) -> Problem:
    """A peer whose published address resolves here but does not answer from this node."""
    return Problem(
        f"{peer.name} publishes its address as {peer.addr!r}, which {me.name} cannot reach"
        f" (no reply to a connection on port {port} within {timeout_s:g}s: an address of"
        " another network, or a firewall)",
        "start that node with --local-addr set to an address its peers reach (torch"
        " publishes socket.getfqdn() by default)",
    )


PEERS_SAMPLED = 8  # each node checks the published addresses of this many peers


def is_me(peer: NodeEntry, me: NodeEntry) -> bool:
    return peer.pid == me.pid and peer.host == me.host


def sampled_peers(entries: list[NodeEntry], me: NodeEntry) -> list[NodeEntry]:
    """The peers of this job whose published address this node checks: the
    :data:`PEERS_SAMPLED` after it in the roll call's order, which every node reads alike, so
    that each peer is checked by as many nodes whatever the job's size (all of them in a job
    of up to 9 nodes)."""
    peers = job_peers(entries, me.run_id)
    mine = next((i for i, peer in enumerate(peers) if is_me(peer, me)), None)
    others = peers if mine is None else peers[mine + 1 :] + peers[:mine]
    return others[:PEERS_SAMPLED]


def unresolvable_addresses(
    sample: list[NodeEntry],
    me: NodeEntry,
    resolves: Callable[[str], bool] = lambda host: bool(resolved(host)),
) -> list[Problem]:
    """Of the sampled peers (:func:`sampled_peers`), those whose published address does not
    resolve from this node (``resolves``: a lookup, or a cache of them)."""
    problems: list[Problem] = []
    for peer in sample:
        if not resolves(peer.addr):
            problems.append(
                Problem(
                    f"{peer.name} publishes its address as {peer.addr!r}, which does not"
                    f" resolve on {me.name}",
                    "start that node with --local-addr set to an address its peers reach"
                    " (torch publishes socket.getfqdn() by default)",
                )
            )
    return problems
