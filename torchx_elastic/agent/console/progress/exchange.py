"""Progress across nodes: every agent publishes its node's ranks, the rank-0 agent sums up.

Over what the job already shares, no new port: the store of the current rendezvous round
(a ``PrefixStore`` of the c10d rendezvous ``TCPStore`` on the rank-0 host, handed out by
torch's public ``RendezvousHandler.next_rendezvous``). Every ``interval_s`` each agent sets
``torchx_elastic/progress/node<N>`` to a small JSON :class:`NodeReport` of its ranks (step,
total, rate, seconds since each last spoke). The node-rank-0 agent reads every node's
report and :func:`aggregate` makes one :class:`~torchx_elastic.contract.job_progress.JobSummary`:
the job-wide line it prints, the live bar of ``local_cwd`` (through the file it rewrites in
its log directory) and ``torchx status`` all show that one summary. While no rank of the
job has reported progress (a script that never calls ``torchx_elastic.progress``), node rank 0
has only the nodes to say, and says them once the job has had a standby (:class:`NodeCounts`,
in the same line's place and file).

The store's load stays flat per node as the job grows: node rank 0 reads every published report
in one ``multi_get`` (while a node's report is missing it checks for all the missing ones in one
call, and for each only when the round's count of publishers says a new one published), and the
exchange's interval grows with the number of nodes, so that node rank 0 reads at most
``MAX_REPORTS_PER_S`` reports a second (1 s up to 256 nodes, 4 s at 1,000): every node
publishes once an interval, whatever the job's size.

A report carries ages, and the rank-0 agent adds how long a node's report has not changed (a
node that stopped publishing goes quiet too). Only live nodes count: a node whose report has
not changed for ``STALE_AFTER_INTERVALS`` exchange intervals (its agent is gone or cut off,
long before the next rendezvous round drops it) adds no rank to the figures.

Ranks are compared at one moment: a rank's step is as old as its last progress message plus
its node's report, so the fresher ranks of a lockstep job are projected back at their rate to
the moment of the oldest figure said within ``SAME_MOMENT_INTERVALS`` intervals (the exchange's
own lag) and show no spread that is only that lag; an older figure stays as it was said (that
rank is late, and shows as the slowest until its node is no longer live). A report's age is
the publisher's wall-clock stamp held within what the rank-0 agent saw itself: not younger
than the time since it first read it, not older than the time since its previous read (skewed
clocks move it by one interval at most).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.contract import PROGRESS_KEY_PREFIX, PROGRESS_PUBLISHERS_KEY
from torchx_elastic.contract.events import PROGRESS, PROGRESS_FIELDS, PROGRESS_INTERVAL_S
from torchx_elastic.contract.job_progress import JobSummary, NodeCounts, QuietRank, write_file

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
MAX_REPORTS_PER_S = 256.0  # node rank 0 reads no more reports a second: the interval grows
DEFAULT_QUIET_AFTER_S = 30.0
STALE_AFTER_INTERVALS = 5  # a node whose report did not change for that long is not live
DEFAULT_STALE_AFTER_S = STALE_AFTER_INTERVALS * DEFAULT_INTERVAL_S
SAME_MOMENT_INTERVALS = 2  # figures said within that long are compared at one moment
DEFAULT_SAME_MOMENT_S = SAME_MOMENT_INTERVALS * DEFAULT_INTERVAL_S
FINAL_WAIT_S = 30.0  # node rank 0, for the other nodes' last reports (as the exit barrier)
GONE_CHECK_S = 0.5  # node rank 0, in that wait: how often it asks which nodes are gone


SKIPPED = "skipped node %d's progress report from the store: %s"


def _report_key(node: int) -> str:
    return f"{PROGRESS_KEY_PREFIX}{node}"


class KeyValueStore(Protocol):
    """The part of ``torch.distributed.Store`` used here."""

    def set(self, key: str, value: str) -> None: ...

    def add(self, key: str, value: int) -> int: ...

    def check(self, keys: list[str]) -> bool: ...

    def multi_get(self, keys: list[str]) -> Sequence[bytes | ValueError]:
        """The values (a signed store returns the one it refused as its error)."""


@dataclass(frozen=True)
class RankReport:
    rank: int  # global
    step: int | None
    total: int | None
    rate_per_s: float | None
    silent_s: float | None  # since its last message; None: it sent none
    finished: bool
    step_age_s: float | None = None  # since the message that said ``step``


@dataclass(frozen=True)
class NodeReport:
    node: int
    seq: int  # +1 per publish: the rank-0 agent sees whether a node still publishes
    final: bool  # the node's last report (its agent is closing)
    ranks: tuple[RankReport, ...]
    sent_s: float | None = None  # the publisher's wall-clock time (seconds since the epoch)

    def to_json(self) -> str:
        ranks = [
            [r.rank, r.step, r.total, r.rate_per_s, r.silent_s, int(r.finished), r.step_age_s]
            for r in self.ranks
        ]
        data = {
            "node": self.node,
            "seq": self.seq,
            "final": self.final,
            "ranks": ranks,
            "sent": self.sent_s,
        }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeReport:
        """The report in ``text``; ``ValueError`` when it is not one."""
        try:
            data = json.loads(text)
            ranks = tuple(
                RankReport(
                    _whole(r[0]),
                    _whole(r[1], None),
                    _whole(r[2], None),
                    _number(r[3]),
                    _number(r[4]),
                    bool(r[5]),
                    _number(r[6]) if len(r) > 6 else None,  # an older agent's report
                )
                for r in data["ranks"]
            )
            return cls(
                _whole(data["node"]),
                _whole(data["seq"]),
                bool(data["final"]),
                ranks,
                _number(data.get("sent")),
            )
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"not a node progress report: {err}") from None


@dataclass(frozen=True)
class SeenReport:
    """A node's latest report as the rank-0 agent sees it."""

    report: NodeReport
    unchanged_s: float  # since the rank-0 agent first read it: the node's liveness
    age_s: float  # since its node published it (see the module's docstring)


def exchange_interval_s(base_s: float, num_nodes: int) -> float:
    """The interval of a round of ``num_nodes``: ``base_s``, or longer where node rank 0 would
    read more than :data:`MAX_REPORTS_PER_S` reports a second."""
    return max(base_s, num_nodes / MAX_REPORTS_PER_S)


def _whole(value: Any, *absent: None) -> Any:
    """``value`` when it is a whole number (or None, where ``absent`` allows it)."""
    if value is None and absent:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not a whole number")
    return value


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def node_report(
    activity: RankActivity,
    global_ranks: Mapping[int, int],
    node: int,
    seq: int,
    now_s: float,
    final: bool = False,
    sent_s: float | None = None,
) -> NodeReport:
    """This node's ranks (local rank -> global rank) as they last reported; ``now_s`` on the
    activity's (monotonic) clock, ``sent_s`` the wall-clock time."""
    snapshot = activity.snapshot()
    ranks = []
    for local_rank, rank in sorted(global_ranks.items()):
        seen = snapshot.get(local_rank)
        if seen is None:
            ranks.append(RankReport(rank, None, None, None, None, False))
            continue
        ranks.append(
            RankReport(
                rank,
                seen.step,
                seen.total,
                seen.rate_per_s,
                round(max(0.0, now_s - seen.last_seen_s), 3),
                activity.is_finished(local_rank),
                None if seen.stepped_s is None else round(max(0.0, now_s - seen.stepped_s), 3),
            )
        )
    return NodeReport(node, seq, final, tuple(ranks), sent_s)


@dataclass
class _LiveRanks:
    """The ranks of the nodes' reports, sorted for :func:`aggregate`."""

    stepping: list[tuple[RankReport, int, float]]  # rank, node, age of its step
    quiet: list[QuietRank]
    ranks: int = 0  # of every node, live or not
    live_nodes: int = 0


def _live_ranks(
    reports: Sequence[SeenReport], quiet_after_s: float, stale_after_s: float
) -> _LiveRanks:
    """The stepping ranks of the live nodes and the quiet ranks (see :func:`aggregate`)."""
    found = _LiveRanks([], [])
    for seen in reports:
        report = seen.report
        found.ranks += len(report.ranks)
        live = report.final or seen.unchanged_s <= stale_after_s
        found.live_nodes += live
        for rank in report.ranks:
            if rank.step is not None and live:
                step_age_s = rank.step_age_s if rank.step_age_s is not None else rank.silent_s
                found.stepping.append((rank, report.node, seen.age_s + (step_age_s or 0.0)))
            if rank.silent_s is not None and not rank.finished and not report.final:
                silent_s = rank.silent_s + seen.unchanged_s
                if silent_s > quiet_after_s:
                    found.quiet.append(QuietRank(rank.rank, report.node, round(silent_s, 1)))
    return found


def aggregate(
    reports: Sequence[SeenReport],
    num_nodes: int,
    quiet_after_s: float = DEFAULT_QUIET_AFTER_S,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
    same_moment_s: float = DEFAULT_SAME_MOMENT_S,
    time_s: float = 0.0,
) -> JobSummary | None:
    """One summary of the live nodes' ranks; None before any of them reported a step.

    A node is live while its report changes (``unchanged_s`` up to ``stale_after_s``) or once
    it is final; the ranks of the others count in ``ranks`` only. A rank is quiet when it spoke
    before, is not done, and has been silent for more than ``quiet_after_s`` (its node's
        ``unchanged_s`` added). Steps said within ``same_moment_s`` are compared at one moment
    (:func:`_steps_at_one_moment`).
    """
    live = _live_ranks(reports, quiet_after_s, stale_after_s)
    stepping = live.stepping
    if not stepping:
        return None
    steps = _steps_at_one_moment(stepping, same_moment_s)

    def key(index: int) -> tuple[int, int]:
        return (steps[index], stepping[index][0].rank)

    slowest_at = min(range(len(stepping)), key=key)
    fastest_at = max(range(len(stepping)), key=key)
    (slowest, slowest_node, _), (fastest, fastest_node, _) = (
        stepping[slowest_at],
        stepping[fastest_at],
    )
    totals = [r.total for r, _, _ in stepping if r.total is not None]
    total = max(totals) if totals else None
    rates = [r.rate_per_s for r, _, _ in stepping if r.rate_per_s is not None]
    # the job moves at the pace of its slowest rank
    rate = slowest.rate_per_s if slowest.rate_per_s is not None else (min(rates) if rates else None)
    step = steps[slowest_at]
    eta_s = None
    if total is not None and rate is not None and rate > 0:
        eta_s = max(0.0, (total - step) / rate)
    return JobSummary(
        step=step,
        total=total,
        slowest_rank=slowest.rank,
        slowest_node=slowest_node,
        fastest_rank=fastest.rank,
        fastest_node=fastest_node,
        fastest_step=steps[fastest_at],
        rate_per_s=rate,
        eta_s=eta_s,
        ranks_reporting=len(stepping),
        ranks=live.ranks,
        nodes_reporting=live.live_nodes,
        nodes=num_nodes,
        quiet=tuple(sorted(live.quiet, key=lambda q: (-q.silent_s, q.rank))),
        time_s=time_s,
    )


def _steps_at_one_moment(
    stepping: Sequence[tuple[RankReport, int, float]], within_s: float
) -> list[int]:
    """Each rank's step as of the moment of the oldest figure among the ranks that step at a
    known rate and said their step within ``within_s``: a fresher one is projected back at its
    rate (never forward: no step is claimed that no rank reported). A done rank, a rank without
    a rate, or one silent for longer keeps its step as it said it."""
    movable = [
        age_s
        for rank, _, age_s in stepping
        if rank.rate_per_s is not None and not rank.finished and age_s <= within_s
    ]
    moment_s = max(movable, default=0.0)  # how long ago
    steps = []
    for rank, _, age_s in stepping:
        step = rank.step or 0
        if rank.rate_per_s is not None and not rank.finished and age_s <= within_s:
            step = max(0, min(step, round(step - rank.rate_per_s * (moment_s - age_s))))
        steps.append(step)
    return steps


class JobProgressExchange:
    """Publishes this node's report every ``interval_s``; on node rank 0, also sums up.

    :meth:`start_round` (after every rendezvous round) hands it the round's store and
    :meth:`set_ranks` (when the workers of an attempt start) this node's ranks. On node
    rank 0 :meth:`latest` is the job's summary, also written to ``log_dir/job_progress.json``
    after each exchange.

    The end of an attempt (:meth:`workers_ended`, on the agent's main thread before torch's
    exit barrier) publishes a final report, and node rank 0 waits there for every node's
    final report: after that nobody touches the store, so no agent uses it after the
    agent that hosts it left (the exit barrier cannot complete before every agent ended its
    exchange). A node whose ranks report nothing publishes nothing until that final report.
    Node rank 0 does not wait for a node that is not live (its report unchanged for the stale
    time) or that :meth:`nodes_gone`'s check says is gone (its agent is dead): such a node
    never sends a final report, and the supervision loop waits in this call.
    """

    def __init__(
        self,
        activity: RankActivity,
        log_dir: str | None,
        interval_s: float = DEFAULT_INTERVAL_S,
        quiet_after_s: float = DEFAULT_QUIET_AFTER_S,
        final_wait_s: float = FINAL_WAIT_S,
        stale_after_s: float | None = None,  # STALE_AFTER_INTERVALS intervals
        same_moment_s: float | None = None,  # SAME_MOMENT_INTERVALS intervals
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        record_event: Callable[..., object] | None = None,
    ) -> None:
        self._activity = activity
        # node rank 0 samples the job's progress into the event log (``EventLog.emit``)
        self._record_event = record_event
        self._sampled: tuple[float, tuple[object, ...]] | None = None
        self._log_dir = log_dir
        self._base_interval_s = interval_s
        self._interval_s = interval_s  # this round's (exchange_interval_s)
        self._quiet_after_s = quiet_after_s
        self._final_wait_s = final_wait_s
        self._given_stale_after_s = stale_after_s
        self._given_same_moment_s = same_moment_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()  # the fields below
        self._store_lock = threading.Lock()  # one exchange at a time
        self._store: KeyValueStore | None = None
        self._skipped: set[tuple[int, str]] = set()  # reports warned about
        self._stopped = False  # this round's exchange is over (or its store failed)
        self._node = 0
        self._num_nodes = 1
        self._global_ranks: dict[int, int] = {}
        self._seq = 0
        self._published = False  # in this round
        self._publishers: set[int] = set()  # node rank 0: the nodes whose report is in the store
        # node -> (its last report, monotonic time it was first read, its age then)
        self._seen: dict[int, tuple[NodeReport, float, float]] = {}
        self._read_s: float | None = None  # monotonic time of the round's previous read
        self._latest: JobSummary | None = None
        self._nodes: NodeCounts | None = None  # node rank 0, while no rank ever reported
        self._summarized = False  # node rank 0 made a summary (a rank reported progress)
        self._standbys: Callable[[], int] | None = None  # nodes standing by, as node 0 sees
        self._had_standbys = False
        # node rank 0: which of these nodes are known gone (their agent is dead)
        self._gone_check: Callable[[Sequence[int]], Collection[int]] | None = None
        self._not_final: list[int] = []  # node rank 0: nodes whose final report is not in
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def joined(self) -> bool:
        """Whether a rendezvous round completed (before that, nothing is exchanged)."""
        with self._lock:
            return self._store is not None

    def start_round(self, store: KeyValueStore, node_rank: int, num_nodes: int) -> None:
        """The round's store and this node's place in it. An exchange of the round before
        that still holds its lock (a call on a slow store: the node rank 0 of a thousand
        nodes reads them all) keeps it, on its own store: the new round does not wait."""
        with self._lock:
            self._store_lock = threading.Lock()
        with self._store_lock, self._lock:
            self._store, self._node, self._num_nodes = store, node_rank, num_nodes
            self._stopped = False
            self._published = False
            self._seen.clear()
            self._not_final = []
            self._publishers.clear()
            self._read_s = None
            self._interval_s = exchange_interval_s(self._base_interval_s, num_nodes)
            self._latest = None
            start = self._thread is None and not self._closing.is_set()
            if start:
                self._thread = threading.Thread(
                    target=self._loop, name="torchx-elastic-job-progress", daemon=True
                )
                self._thread.start()

    def count_standbys(self, count: Callable[[], int]) -> None:
        """Where node rank 0 reads the number of nodes standing by as spares (without a
        store call): the summary carries it once the job has had one."""
        self._standbys = count

    def nodes_gone(self, check: Callable[[Sequence[int]], Collection[int]]) -> None:
        """Where node rank 0 learns, while it waits for the nodes' final reports, which of
        ``check``'s node ranks are gone (their agent is dead, as the presence port tells
        within a second): it does not wait for those."""
        self._gone_check = check

    def set_ranks(self, global_ranks: Mapping[int, int]) -> None:
        """This node's ranks in the current attempt: local rank -> global rank."""
        with self._lock:
            self._global_ranks = dict(global_ranks)

    def latest(self) -> JobSummary | None:
        """The job's latest summary (node rank 0 only; None elsewhere or before any step)."""
        with self._lock:
            return self._latest if self._node == 0 else None

    def latest_nodes(self) -> NodeCounts | None:
        """The job's nodes (node rank 0 only) while no rank has reported progress and once
        the job has had a standby; None otherwise."""
        with self._lock:
            return self._nodes if self._node == 0 and not self._summarized else None

    def _loop(self) -> None:
        while not self._closing.wait(self._interval_s):
            self.exchange()

    def exchange(self) -> None:
        """Publish this node's report (if its ranks said anything); node rank 0 sums up."""
        with self._store_lock:
            self._exchange(final=False)

    def store_lost(self) -> None:
        """The round's store went away with its host (the rendezvous moves): end this
        round's exchange now. A call stuck on that store keeps the old lock until the
        store's timeout; the next round's exchange does not wait for it."""
        with self._lock:
            self._stopped = True
            self._store = None
            self._store_lock = threading.Lock()

    def workers_ended(self) -> None:
        """The attempt's workers are gone: publish the final report; node rank 0 waits
        (up to ``final_wait_s``) for every node's, sums up once more, and the exchange of
        this round ends."""
        with self._store_lock:
            with self._lock:
                store = self._store
            deadline_s = self._clock() + self._final_wait_s
            gone: set[int] = set()
            checked_s: float | None = None
            while not self._exchange(final=True) and self._clock() < deadline_s:
                waiting = self._waited_for(gone)
                now_s = self._clock()
                if waiting and (checked_s is None or now_s - checked_s >= GONE_CHECK_S):
                    checked_s = now_s
                    gone.update(self._known_gone(waiting))
                    waiting = [node for node in waiting if node not in gone]
                if not waiting:
                    break
                # five polls an interval at most (a second's: one read of every report each)
                time.sleep(
                    min(0.2, self._base_interval_s) * self._interval_s / self._base_interval_s
                )
            with self._lock:
                if self._store is store:  # not a later round's
                    self._stopped = True

    def _waited_for(self, gone: Collection[int]) -> list[int]:
        """The nodes whose final report node rank 0 still waits for: not in yet, live (a
        report that stopped changing is not), and not known to be ``gone``."""
        now_s = self._clock()
        stale_after_s = self._given_stale_after_s
        if stale_after_s is None:
            stale_after_s = STALE_AFTER_INTERVALS * self._interval_s
        with self._lock:
            stale = {
                node
                for node, (report, first_read_s, _) in self._seen.items()
                if not report.final and now_s - first_read_s > stale_after_s
            }
            return [node for node in self._not_final if node not in stale and node not in gone]

    def _known_gone(self, nodes: Sequence[int]) -> Collection[int]:
        if self._gone_check is None:
            return ()
        try:
            return self._gone_check(nodes)
        except Exception as err:  # noqa: BLE001 - a shortcut: the wait's bound remains
            log.debug("cannot tell which nodes are gone: %s", err)
            return ()

    def _exchange(self, final: bool) -> bool:
        """One exchange; whether every node's final report is in (always True off node 0)."""
        with self._lock:
            if self._store is None or self._stopped:
                return True
            store, node, num_nodes = self._store, self._node, self._num_nodes
            first = not self._published
            self._seq += 1
            report = node_report(
                self._activity,
                self._global_ranks,
                node,
                self._seq,
                self._clock(),
                final,
                self._wall_clock(),
            )
        spoke = any(r.silent_s is not None for r in report.ranks)
        try:
            if spoke or final:
                store.set(_report_key(node), report.to_json())
                if first:
                    store.add(PROGRESS_PUBLISHERS_KEY, 1)
                    with self._lock:
                        self._published = True
            if node != 0 or (final and not spoke):
                return True  # node 0 waits for the others only when its ranks report
            publishers = store.add(PROGRESS_PUBLISHERS_KEY, 0)
            if not spoke and publishers == 0:  # nobody reports (scripts without progress())
                self._count_nodes(store, num_nodes)
                return True
            reports = self._read_reports(store, num_nodes, publishers)
        except Exception as err:  # the store went away (the job is ending): best effort
            log.debug("job progress exchange failed: %s", err)
            with self._lock:
                if self._store is store:  # not a later round's
                    self._stopped = True
            return True
        summary, all_final = self._sum_up(reports, num_nodes)
        with self._lock:
            if self._store is store:
                self._latest = summary
                self._summarized = self._summarized or summary is not None
        if summary is not None and self._log_dir:
            try:
                write_file(self._log_dir, summary)
            except OSError as err:
                log.debug("cannot write the job progress file: %s", err)
        if summary is not None:
            self._sample(summary, final)
        return all_final

    def _count_nodes(self, store: KeyValueStore, num_nodes: int) -> None:
        """Node rank 0 where no rank reports progress: the round's nodes and the standbys,
        kept (and written to the file) once the job has had a standby and until a rank
        reports progress."""
        standbys = self._count_standbys()
        with self._lock:
            if standbys is None or self._summarized or self._store is not store:
                return
            self._had_standbys = self._had_standbys or standbys > 0
            if not self._had_standbys:
                return
            counts = self._nodes = NodeCounts(num_nodes, standbys, self._wall_clock())
        if self._log_dir:
            try:
                write_file(self._log_dir, counts)
            except OSError as err:
                log.debug("cannot write the job progress file: %s", err)

    def _sample(self, summary: JobSummary, final: bool) -> None:
        """A ``progress`` event when the figures changed, every ``PROGRESS_INTERVAL_S`` at most,
        and the final figures (one line of about 300 bytes, whatever the job's size)."""
        if self._record_event is None:
            return
        figures = tuple(getattr(summary, name) for name in PROGRESS_FIELDS)
        now_s = self._clock()
        previous = self._sampled
        if previous is not None and (
            previous[1] == figures or (not final and now_s - previous[0] < PROGRESS_INTERVAL_S)
        ):
            return
        self._sampled = (now_s, figures)
        self._record_event(PROGRESS, **dict(zip(PROGRESS_FIELDS, figures, strict=True)))

    def _read_reports(
        self, store: KeyValueStore, num_nodes: int, publishers: int
    ) -> list[NodeReport]:
        """The nodes' reports, in one round trip; a forged or malformed one is skipped (one
        warning each). ``publishers``: the round's count of nodes that published, which says
        when to look for a new node's key (``multi_get`` would wait for a missing one)."""
        missing = [node for node in range(num_nodes) if node not in self._publishers]
        keys = [_report_key(node) for node in missing]
        if missing and store.check(keys):  # every missing report is there: one call
            self._publishers.update(missing)
        elif missing and publishers > len(self._publishers):  # some are: which
            self._publishers.update(
                n for n, key in zip(missing, keys, strict=True) if store.check([key])
            )
        nodes = sorted(self._publishers)
        if not nodes:
            return []
        reports = []
        for node, value in zip(
            nodes, store.multi_get([_report_key(n) for n in nodes]), strict=True
        ):
            try:
                if isinstance(value, ValueError):
                    raise value
                report = NodeReport.from_json(value)
                if report.node != node:
                    raise ValueError(f"it says it is node {report.node}'s")
                reports.append(report)
            except ValueError as err:
                with self._lock:
                    told = (node, str(err)) in self._skipped
                    self._skipped.add((node, str(err)))
                if not told:
                    log.warning(SKIPPED, node, err)
        return reports

    def _sum_up(self, reports: list[NodeReport], num_nodes: int) -> tuple[JobSummary | None, bool]:
        now_s, wall_s = self._clock(), self._wall_clock()
        seen: list[SeenReport] = []
        with self._lock:
            # a report read for the first time was published since the previous read
            oldest_s = self._interval_s if self._read_s is None else now_s - self._read_s
            self._read_s = now_s
            for report in reports:
                previous = self._seen.get(report.node)
                if previous is None or previous[0].seq != report.seq:
                    claimed_s = 0.0 if report.sent_s is None else wall_s - report.sent_s
                    self._seen[report.node] = (report, now_s, min(max(claimed_s, 0.0), oldest_s))
                _, first_read_s, age_s = self._seen[report.node]
                unchanged_s = now_s - first_read_s
                seen.append(SeenReport(report, unchanged_s, age_s + unchanged_s))
        stale_after_s = self._given_stale_after_s
        if stale_after_s is None:
            stale_after_s = STALE_AFTER_INTERVALS * self._interval_s
        same_moment_s = self._given_same_moment_s
        if same_moment_s is None:
            same_moment_s = SAME_MOMENT_INTERVALS * self._interval_s
        summary = aggregate(
            seen, num_nodes, self._quiet_after_s, stale_after_s, same_moment_s, wall_s
        )
        finals = {r.node for r in reports if r.final}
        all_final = len(reports) == num_nodes and len(finals) == len(reports)
        with self._lock:
            self._not_final = [node for node in range(num_nodes) if node not in finals]
        standbys = self._count_standbys() if summary is not None else None
        if summary is not None and standbys is not None:
            self._had_standbys = self._had_standbys or standbys > 0
            if self._had_standbys:
                summary = dataclasses.replace(summary, standbys=standbys)
        return summary, all_final

    def _count_standbys(self) -> int | None:
        """The nodes standing by (None: unknown), read from the rendezvous state that the
        keep-alive thread may be replacing meanwhile."""
        if self._standbys is None:
            return None
        try:
            return self._standbys()
        except Exception as err:  # noqa: BLE001 - a count, never the exchange's end
            log.debug("cannot count the standbys: %s", err)
            return None

    def close(self) -> None:
        """Stop exchanging (without waiting for a store that stopped answering)."""
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
            self._stopped = True
            thread = self._thread
        if thread is not None:
            thread.join(timeout=self._interval_s + 1.0)
