"""A rendezvous handler that says what it waits for, and why it cannot complete.

It wraps the c10d handler (torch's public ``RendezvousHandler``) for this node's first
round: torch's ``next_rendezvous()`` runs in a thread while this one reads the roll call
(roll_call.py) and says, within seconds and then at a growing interval, how many of the
job's nodes have come, which, at which endpoint and when it gives up; the same line goes to
the agent's log directory for ``torchx status`` (waiting_file.py). A later round (after a
restart or a lost node) that takes longer than re-forming does is said too, from torch's
rendezvous state: who is back, and which members of the last round are not. A
peer started with other settings fails the rendezvous at once with a line that names both
values and both hosts; at the join timeout the error says who came and who is missing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousTimeoutError,
)

from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import liveness, membership, roll_call
from torchx_elastic.agent.rendezvous.diagnosis import (
    JOIN_TIMEOUT_HINT,
    GrowingInterval,
    Problem,
    RendezvousDiagnosis,
    answers,
    gives_up_at,
    listed,
    resolved,
    say,
)
from torchx_elastic.agent.rendezvous.parameters import HOST_LINGER_S
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous
from torchx_elastic.contract import WAITING_FOR_NODES, waiting_file
from torchx_elastic.contract.job_progress import WAITING_LINE_PREFIX

log = logging.getLogger(__name__)

# told the job-wide progress line while the first round waits; None once it is complete
WaitingListener = Callable[[str | None], None]

POLL_S = 0.5
PEER_PROBE_S = 2.0  # a peer's published address answers a connect within this, or is named
REPROBE_S = 30.0  # a peer's address that did not answer is probed again after this
# a later round re-forms within seconds (its last call is 3 s): said once it takes longer
LATER_ROUND_FIRST_S = 10.0


@dataclass(frozen=True)
class Deadline:
    """When a round's wait for nodes gives up (the wall-clock time the lines name) and the
    join timeout that set it (read once, where the handler was made: handler.py)."""

    at: str
    timeout_s: float

    @classmethod
    def from_now(cls, timeout_s: float) -> Deadline:
        return cls(gives_up_at(timeout_s), timeout_s)

    def timeout_text(self) -> str:
        return f"{self.timeout_s:g}s"

    def text(self) -> str:
        """``gives up at 10:00:00 (join timeout 600s)``."""
        return f"gives up at {self.at} (join timeout {self.timeout_text()})"


def joined_text(peers: list[roll_call.NodeEntry], config: AgentConfig) -> str:
    """``1 of 2 joined (starts with ...)``: how many of the job's nodes are here; once an
    elastic job has its minimum, ``2 joined, enough to start (...)``: the round waits its
    last call for more, up to the maximum."""
    needed = config.min_nodes
    if len(peers) >= needed and config.max_nodes > needed:
        return (
            f"{len(peers)} joined, enough to start (takes up to {config.max_nodes}; the round"
            " closes after its last call)"
        )
    text = f"{len(peers)} of {needed} joined"
    if config.max_nodes > needed:
        text += f" (starts with {needed}, takes up to {config.max_nodes})"
    return text


def missing_text(peers: list[roll_call.NodeEntry], config: AgentConfig) -> str:
    missing = max(0, config.min_nodes - len(peers))
    if missing == 0:
        return "missing: none"
    return f"missing: {missing} node{'s' if missing != 1 else ''}"


def waiting_line(
    peers: list[roll_call.NodeEntry], config: AgentConfig, hosting: bool, deadline: Deadline
) -> str:
    """``waiting for nodes: 1 of 2 joined (...)``: the state of the first round."""
    here = listed([peer.name for peer in peers]) or "none"
    role = "hosting the rendezvous" if hosting else "rendezvous"
    text = f"{WAITING_FOR_NODES}{joined_text(peers, config)}; here: {here}"
    text += f"; {missing_text(peers, config)}"
    text += f"; {role} at {config.rdzv_endpoint}, run id {config.run_id!r}"
    return text + f"; {deadline.text()}"


def standby_line(here: int, config: AgentConfig, hosting: bool) -> str:
    """``standing by: the job has its 2 nodes ...``: this node came (or came back) once the
    job had its maximum of nodes, and waits (for the next round) to take a lost node's
    place."""
    role = "hosting the rendezvous" if hosting else "rendezvous"
    return (
        f"standing by: the job has its {config.max_nodes} node"
        f"{'s' if config.max_nodes != 1 else ''} ({here} here); this node takes the"
        f" place of the first one lost, at the next round; {role} at {config.rdzv_endpoint},"
        f" run id {config.run_id!r}"
    )


def progress_line(peers: list[roll_call.NodeEntry], config: AgentConfig) -> str:
    """``[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node``: the job-wide
    progress line while the first round waits (the rendezvous host's console prints it)."""
    return f"{WAITING_LINE_PREFIX}{joined_text(peers, config)}; {missing_text(peers, config)}"


def later_round_line(
    round_: int,
    here: list[str],
    missing: dict[int, str],
    config: AgentConfig,
    deadline: Deadline,
) -> str:
    """``waiting for nodes (round 2): 1 of 2 here (...); not back since the last round:
    node 1: h1 (agent pid 7); ...``: a round after the first, from the rendezvous."""
    text = f"waiting for nodes (round {round_}): {len(here)} of {config.min_nodes} here"
    text += f" ({listed(sorted(here))})" if here else ""
    if missing:
        text += f"; not back since the last round: {listed(liveness.node_names(missing))}"
    return text + f"; at {config.rdzv_endpoint}, {deadline.text()}"


def timed_out(
    peers: list[roll_call.NodeEntry], in_rendezvous: int, config: AgentConfig, timeout_s: float
) -> Problem:
    """Why the first round did not form within the join timeout: too few nodes came
    (``peers``, the roll call), or enough came and only ``in_rendezvous`` of them got into
    the rendezvous state (their joins, writes of the whole state one after another, took
    longer)."""
    here = listed([peer.name for peer in peers]) or "none"
    if len(peers) < config.min_nodes:
        return Problem(
            f"only {len(peers)} of {config.min_nodes} nodes joined within {timeout_s:g}s"
            f" (here: {here})",
            f"start the missing node(s) with --rdzv-endpoint {config.rdzv_endpoint}"
            f" --rdzv-id {config.run_id}, or {JOIN_TIMEOUT_HINT}",
        )
    return Problem(
        f"{len(peers)} nodes came (the job starts with {config.min_nodes}) but only"
        f" {in_rendezvous} of them were in the rendezvous within {timeout_s:g}s (here: {here})",
        "each join takes a slot in the rendezvous store, one store call after another: a"
        " rendezvous host short of CPU, or thousands of nodes at once, take longer;"
        f" {JOIN_TIMEOUT_HINT}",
    )


class ExplainedRendezvous(WrappedRendezvous):
    def __init__(
        self,
        handler: RendezvousHandler,
        call: roll_call.RollCall,
        config: AgentConfig,
        hosting: bool,
        join_timeout_s: float,
        on_waiting: WaitingListener | None = None,
    ) -> None:
        super().__init__(handler)
        self._on_waiting = on_waiting if hosting else None  # one line per job: its host's
        self._call = call
        self._config = config
        self._hosting = hosting
        self._join_timeout_s = join_timeout_s
        self._rounds = 0
        self._entries: list[roll_call.NodeEntry] = []
        self._unverified: list[roll_call.NodeEntry] = []
        self._said: set[str] = set()
        self._checked = (0, 0)  # (verified, unverified) roll-call entries checked so far
        self._mismatch: Problem | None = None
        self._sample: list[roll_call.NodeEntry] = []  # the peers whose addresses it checks
        self._reached: set[str] = set()  # published addresses that answered this node
        self._resolved: set[str] = set()  # published names that resolved here
        self._abandoned = threading.Event()
        self._speaking = threading.Lock()  # a line is said whole, or not after abandon()
        self._probe_after_s: dict[str, float] = {}
        self._last_members: dict[int, str] = {}  # node rank -> name, of the last round
        self._read()

    def abandon(self) -> None:
        """This node follows the job elsewhere (rendezvous/failover.py): a first round that
        still waits here says nothing more: a line being said as it is called ends first,
        and none follows (the tick reads the store outside the lock, so this never waits on
        a lost host)."""
        with self._speaking:
            self._abandoned.set()

    def _say(self, line: str, then: Callable[[], None] = lambda: None) -> None:
        """Say ``line`` (and do ``then``) unless this node left the round: see :meth:`abandon`."""
        with self._speaking:
            if not self._abandoned.is_set():
                say(line)
                then()

    # -- the first round, said out loud ------------------------------------------------

    def _join(self, tick: Callable[[bool], None]) -> dict[str, Any]:
        """torch's ``next_rendezvous()`` on a thread; ``tick(still_waiting)`` every
        :data:`POLL_S` meanwhile. Its ``info``, or the ``error`` it raised."""
        outcome: dict[str, Any] = {}

        def join() -> None:
            try:
                outcome["info"] = self.handler.next_rendezvous()
            except BaseException as err:  # noqa: BLE001 (handed to the caller's thread)
                outcome["error"] = err

        joiner = threading.Thread(target=join, name="rendezvous-join", daemon=True)
        joiner.start()
        while joiner.is_alive() and not self._abandoned.is_set():
            joiner.join(POLL_S)
            if self._abandoned.is_set():  # left while it waited: its report would be stale
                break
            tick(joiner.is_alive())
        if self._abandoned.is_set():
            raise RendezvousError("this node left the rendezvous for the job's moved one")
        return outcome

    def _later_round(self) -> RendezvousInfo:
        last = self._last_members
        deadline = Deadline.from_now(self._join_timeout_s)
        reports = GrowingInterval(first_s=LATER_ROUND_FIRST_S)

        def tick(waiting: bool) -> None:
            if waiting and reports.due():
                try:
                    here = sorted(membership.present_members(self.handler))
                    missing = liveness.absent_members(last, self.handler)
                    standing_by = membership.standbys(self.handler)[1]
                except RuntimeError:  # the state changed as it was read: the next report
                    return
                if standing_by:  # dropped (or back) once the job had its nodes again
                    self._say(standby_line(len(here), self._config, self._hosting))
                else:
                    self._say(later_round_line(self._rounds, here, missing, self._config, deadline))

        outcome = self._join(tick)
        if "error" in outcome:
            raise outcome["error"]
        self._last_members = membership.round_members(self.handler)
        return outcome["info"]  # type: ignore[no-any-return]

    def next_rendezvous(self) -> RendezvousInfo:
        self._rounds += 1
        if self._rounds > 1:
            return self._later_round()
        self._publish()
        self._check_settings()  # a node late to a running job: before it takes a place
        deadline = Deadline.from_now(self._join_timeout_s)
        reports = GrowingInterval()

        def tick(waiting: bool) -> None:
            self._check()
            if waiting and reports.due():
                self._report(deadline)

        try:
            outcome = self._join(tick)
        finally:
            self._clear_status()
        if "error" in outcome:
            err = outcome["error"]
            self._check()  # a peer with other settings is why it failed
            everyone = self._entries + self._unverified
            other_job = roll_call.other_jobs(everyone, self._call.me, self._endpoint)
            if other_job is not None and not isinstance(err, RendezvousTimeoutError):
                raise RendezvousDiagnosis(self._config.rdzv_endpoint, other_job) from err
            if isinstance(err, RendezvousTimeoutError):
                raise RendezvousDiagnosis(self._config.rdzv_endpoint, self._timed_out()) from err
            raise err
        self._check()  # the round may have taken in a mismatched peer
        self._last_members = membership.round_members(self.handler)
        return outcome["info"]  # type: ignore[no-any-return]

    def _publish(self) -> None:
        """This node in the roll call, as it comes to its first round."""
        try:
            self._call.publish()
        except Exception:  # noqa: BLE001 (an extra: the rendezvous goes on without it)
            log.warning(
                "cannot publish this node in the roll call at %s",
                self._config.rdzv_endpoint,
                exc_info=True,
            )

    def _read(self) -> list[roll_call.NodeEntry]:
        try:
            self._entries, self._unverified = self._call.entries()
        except Exception:  # the store went away: keep the last view  # noqa: BLE001
            log.debug("roll call not readable", exc_info=True)
        return self._entries

    @property
    def _endpoint(self) -> str:
        return str(self._config.rdzv_endpoint)

    def _check(self) -> None:
        """The roll call's problems, said once each. Entries only ever come in (roll_call.py):
        the settings of each new one are compared once, and what is derived from all of them
        is derived again only when some came, so a tick costs the same at any job size."""
        self._check_settings()
        me = self._call.me
        problems = roll_call.unresolvable_addresses(self._sample, me, self._resolves)
        self._say_once(problems + self._unreachable_addresses(self._sample, me))

    def _check_settings(self) -> None:
        """:class:`RendezvousDiagnosis` where a node of the roll call has other settings
        (this node withdrawn from the rendezvous first: no round takes it in); another job or
        another secret said once."""
        entries = self._read()
        me = self._call.me
        if (len(entries), len(self._unverified)) != self._checked:
            self._mismatch = self._mismatch or roll_call.settings_mismatch(
                entries[self._checked[0] :], me
            )
            self._checked = (len(entries), len(self._unverified))
            self._sample = roll_call.sampled_peers(entries, me)
            self._say_once(
                [
                    roll_call.other_jobs(entries + self._unverified, me, self._endpoint),
                    roll_call.other_secret(self._unverified, me),
                ]
            )
        if self._mismatch is not None:
            membership.withdraw(self.handler)
            if self._hosting:
                time.sleep(HOST_LINGER_S)
            raise RendezvousDiagnosis(self._config.rdzv_endpoint, self._mismatch)

    def _say_once(self, problems: Sequence[Problem | None]) -> None:
        for problem in problems:
            if problem is not None and problem.cause not in self._said:
                self._said.add(problem.cause)
                self._say(f"warning: {problem.line()}")

    def _resolves(self, host: str) -> bool:
        """Whether ``host`` resolves here; a name that resolved once is not looked up again
        (every tick checks the sampled peers)."""
        if host not in self._resolved:
            if not resolved(host):
                return False
            self._resolved.add(host)
        return True

    def _unreachable_addresses(
        self, sample: list[roll_call.NodeEntry], me: roll_call.NodeEntry
    ) -> list[Problem]:
        """Of the sampled peers (``roll_call.sampled_peers``), those whose published address
        resolves but does not answer from this node (a TCP connect to the rendezvous port:
        refused is an answer), each probed until it answers once, at most every
        :data:`REPROBE_S`."""
        port = self._config.rdzv_endpoint.port
        problems: list[Problem] = []
        for peer in sample:
            addr = peer.addr
            if addr in self._reached or time.monotonic() < self._probe_after_s.get(addr, 0):
                continue
            self._probe_after_s[addr] = time.monotonic() + REPROBE_S
            if not self._resolves(addr):
                continue  # said by unresolvable_addresses
            if answers(addr, port, PEER_PROBE_S):
                self._reached.add(addr)
            else:
                problems.append(roll_call.unreachable_address(peer, me, port, PEER_PROBE_S))
        return problems

    def _peers(self) -> list[roll_call.NodeEntry]:
        return roll_call.job_peers(self._entries, self._config.run_id)

    def _report(self, deadline: Deadline) -> None:
        if membership.standbys(self.handler)[1]:
            self._say(standby_line(len(self._peers()), self._config, self._hosting))
            return
        line = waiting_line(self._peers(), self._config, self._hosting, deadline)

        def told() -> None:
            self._write_status(line)
            if self._on_waiting is not None:
                self._on_waiting(progress_line(self._peers(), self._config))

        self._say(line, told)

    def _timed_out(self) -> Problem:
        in_rendezvous = len(membership.state_node_ids(self.handler))
        return timed_out(self._peers(), in_rendezvous, self._config, self._join_timeout_s)

    def _write_status(self, line: str) -> None:
        if self._config.log_dir:
            try:
                waiting_file.write(self._config.log_dir, line)
            except OSError:
                log.debug("cannot write the waiting state", exc_info=True)

    def _clear_status(self) -> None:
        if self._on_waiting is not None:
            self._on_waiting(None)
        if self._config.log_dir:
            waiting_file.clear(self._config.log_dir)

    def _leave(self) -> None:
        try:
            self._call.leave()
        except Exception:  # noqa: BLE001 (only what the others' messages say)
            log.debug("cannot update the roll call", exc_info=True)

    def shutdown(self) -> bool:
        self._leave()  # this node is gone for the others' messages
        return self.handler.shutdown()


def explained(
    handler: RendezvousHandler,
    store: Any,
    config: AgentConfig,
    signer: StoreSigner,
    hosting: bool,
    join_timeout_s: float,
    on_waiting: WaitingListener | None = None,
) -> RendezvousHandler:
    """``handler`` that says what its first round waits for (the roll call on ``store``);
    on the host of the rendezvous, ``on_waiting`` gets the job-wide progress line too."""
    me = roll_call.NodeEntry.of_this_node(config)
    node = membership.this_node(handler)
    if node is not None and (node.addr, node.pid) == (me.addr, me.pid):  # peers can name it
        me = replace(me, local_id=node.local_id)
    call = roll_call.RollCall(store, me, signer, publish=False)  # once it joins
    return ExplainedRendezvous(handler, call, config, hosting, join_timeout_s, on_waiting)
