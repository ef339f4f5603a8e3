"""The job's progress exchanged across nodes over a real torch TCPStore (a server and a
client in this process: the rank-0 node's store and another node's), and the rendezvous
hook that hands each round's store to it (the summary's forms and aggregation:
tests/unit/test_job_progress_units.py)."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
)

from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.agent.console.progress.exchange import (
    MAX_REPORTS_PER_S,
    JobProgressExchange,
    exchange_interval_s,
)
from torchx_elastic.agent.rendezvous.observed import ObservedRendezvous
from torchx_elastic.contract import JOB_PROGRESS_FILE, PROGRESS_KEY_PREFIX, PROGRESS_PUBLISHERS_KEY
from torchx_elastic.contract.job_progress import NodeCounts, read_file, read_nodes_file

# the progress exchange calls torch's store from a thread of its own: it ends with the test
pytestmark = pytest.mark.usefixtures("threads_ended")


def _publish(store: Any, node: int, seq: int, step: int, sent_s: float) -> None:
    """A node's report as its agent writes it: one rank stepping at 10 steps/s."""
    report = {
        "node": node,
        "seq": seq,
        "final": False,
        "ranks": [[node, step, 300, 10.0, 0.0, 0, 0.0]],
        "sent": sent_s,
    }
    store.set(f"{PROGRESS_KEY_PREFIX}{node}", json.dumps(report))


def test_the_line_counts_live_nodes_and_shows_no_spread_in_lockstep(
    stores: tuple[Any, Any],
) -> None:
    """Three nodes in lockstep; node 2 goes silent (a cut link: its last report stays)."""
    store0, store1 = stores
    now, wall = [100.0], [5000.0]
    activity = RankActivity(clock=lambda: now[0])
    node0 = JobProgressExchange(
        activity,
        None,
        interval_s=60,  # exchanges are driven by hand
        stale_after_s=5.0,
        same_moment_s=2.0,
        clock=lambda: now[0],
        wall_clock=lambda: wall[0],
    )
    lines = []
    try:
        node0.start_round(store0, 0, 3)
        node0.set_ranks({0: 0})
        for second in range(1, 13):
            for tenth in range(10):  # node 0's rank: 10 steps/s, every step reported
                now[0] += 0.1
                wall[0] += 0.1
                activity.progress(0, 0, 10 * second + tenth - 9, 300)
            step = 10 * second  # node 0's rank now; the others published 0.9 s ago
            for node in (1, 2) if second <= 4 else (1,):
                _publish(store1, node, second, step - 9, wall[0] - 0.9)
            node0.exchange()
            summary = node0.latest()
            assert summary is not None
            lines.append(summary.line())
            if 5 < second < 10:  # node 2 is late (last heard 2 to 5 s ago) and still live
                assert (summary.step, summary.slowest_rank) == (31, 2)
                assert summary.fastest_step == step - 9  # the others: as of 0.9 s ago
            else:
                assert summary.fastest_step == summary.step  # the same moment: no spread
    finally:
        node0.close()
    assert lines[3] == (
        "[job progress] 31/300 (10.3%) of 3/3 ranks on 3/3 nodes, slowest r0 (n0) 31,"
        " fastest r2 (n2) 31, 10 steps/s, ETA 27s"
    )
    # node 2's report stopped changing after the 4th exchange: live for 5 s, then not counted
    assert "of 3/3 ranks on 3/3 nodes" in lines[8]
    assert lines[9] == (
        "[job progress] 91/300 (30.3%) of 2/3 ranks on 2/3 nodes, slowest r0 (n0) 91,"
        " fastest r1 (n1) 91, 10 steps/s, ETA 21s"
    )
    assert all("of 2/3 ranks on 2/3 nodes" in line for line in lines[9:])


@pytest.fixture
def stores() -> tuple[Any, Any]:
    """The round's store on the rank-0 node (it hosts the TCPStore) and on another node."""
    # port 0: a free one, bound at once
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = TCPStore("127.0.0.1", server.port, is_master=False)
    prefix = "torch.rendezvous.test.1"
    return PrefixStore(prefix, server), PrefixStore(prefix, client)


def _feed(activity: RankActivity, local_rank: int, step: int, total: int = 100) -> None:
    activity.progress(local_rank, 0, step, total)


def test_two_nodes_exchange_over_the_rendezvous_store(
    stores: tuple[Any, Any], tmp_path: Path
) -> None:
    store0, store1 = stores
    activity0, activity1 = RankActivity(), RankActivity()
    node0 = JobProgressExchange(activity0, str(tmp_path), interval_s=60, final_wait_s=5)
    node1 = JobProgressExchange(activity1, None, interval_s=60, final_wait_s=5)
    try:
        node0.start_round(store0, 0, 2)
        node1.start_round(store1, 1, 2)
        node0.set_ranks({0: 0, 1: 1})
        node1.set_ranks({0: 2, 1: 3})
        node1.exchange()
        node0.exchange()
        assert node0.latest() is None  # no rank reported a step yet
        assert not store0.check([f"{PROGRESS_KEY_PREFIX}1"])  # nothing to say: nothing published
        _feed(activity0, 0, 30), _feed(activity0, 1, 25)
        _feed(activity1, 0, 10), _feed(activity1, 1, 40)
        node1.exchange()
        node0.exchange()
        summary = node0.latest()
        assert summary is not None
        assert (summary.step, summary.slowest_rank, summary.slowest_node) == (10, 2, 1)
        assert (summary.fastest_step, summary.fastest_rank, summary.fastest_node) == (40, 3, 1)
        assert (summary.ranks_reporting, summary.nodes_reporting, summary.nodes) == (4, 2, 2)
        assert node1.latest() is None  # only node rank 0 sums up
        assert read_file(str(tmp_path / JOB_PROGRESS_FILE)) == summary
        assert int(store0.add(PROGRESS_PUBLISHERS_KEY, 0)) == 2

        # the end: node 1's final report comes in while node 0 waits for it
        for local_rank, step in ((0, 100), (1, 100)):
            _feed(activity0, local_rank, step), _feed(activity1, local_rank, step)
            activity0.finish(local_rank, 0), activity1.finish(local_rank, 0)
        node1.workers_ended()
        node0.workers_ended()
        final = node0.latest()
        assert final is not None and (final.step, final.fastest_step) == (100, 100)
        assert read_file(str(tmp_path / JOB_PROGRESS_FILE)) == final
        store0.set(f"{PROGRESS_KEY_PREFIX}1", "garbage")  # after the end nothing is read any more
        node0.exchange()
        assert node0.latest() == final
    finally:
        node0.close()
        node1.close()


def test_the_summary_counts_the_spares_once_the_job_had_one(stores: tuple[Any, Any]) -> None:
    store0, _ = stores
    activity = RankActivity()
    node0 = JobProgressExchange(activity, None, interval_s=60)
    standing_by = [0]
    node0.count_standbys(lambda: standing_by[0])
    try:
        node0.start_round(store0, 0, 1)
        node0.set_ranks({0: 0})
        _feed(activity, 0, 10)
        summaries = []
        for count in (0, 1, 0):  # none yet; one came; it took a lost node's place
            standing_by[0] = count
            node0.exchange()
            summaries.append(node0.latest())
    finally:
        node0.close()
    assert [s.standbys if s else "no summary" for s in summaries] == [None, 1, 0]
    assert summaries[2] is not None
    assert "of 1/1 ranks on 1/1 nodes, 0 standby, slowest" in summaries[2].line()


def test_without_progress_node_rank_0_says_the_nodes_once_the_job_had_a_standby(
    stores: tuple[Any, Any], tmp_path: Path
) -> None:
    """A script that never calls progress(): no summary, but once a spare stood by, the
    nodes line (printed every status interval, unchanged or not) and the same in the file."""
    from torchx_elastic.agent.console.output.display import PlainConsole

    store0, _ = stores
    activity = RankActivity()
    node0 = JobProgressExchange(activity, str(tmp_path), interval_s=60, wall_clock=lambda: 7.0)
    standing_by = [0]
    node0.count_standbys(lambda: standing_by[0])
    err = io.BytesIO()
    console = PlainConsole(activity, io.BytesIO(), err, status_interval_s=0, job=node0)
    path = str(tmp_path / JOB_PROGRESS_FILE)
    try:
        node0.start_round(store0, 0, 2)
        node0.set_ranks({0: 0})
        node0.exchange()
        console.print_status(again=True)
        assert node0.latest_nodes() is None and err.getvalue() == b""  # a plain job: nothing
        assert read_nodes_file(path) is None
        for count in (1, 1, 0):  # a spare came; stands by; took a lost node's place
            standing_by[0] = count
            node0.exchange()
            console.print_status(again=True)
        assert node0.latest_nodes() == NodeCounts(2, 0, 7.0)
        assert read_nodes_file(path) == NodeCounts(2, 0, 7.0)
        assert read_file(path) is None  # no summary there: local_cwd's bar draws none
        console.print_status()  # the progress line's rule: unchanged, not repeated
        assert err.getvalue().decode().splitlines() == [
            "[job progress] nodes: 2 training, 1 standby",
            "[job progress] nodes: 2 training, 1 standby",
            "[job progress] nodes: 2 training, 0 standby",
        ]
        _feed(activity, 0, 10)  # a rank reports: the progress line is back, with the standbys
        node0.exchange()
        summary = node0.latest()
        assert summary is not None and summary.standbys == 0
        assert node0.latest_nodes() is None and read_file(path) == summary
        console.print_status(again=True)
        assert err.getvalue().decode().splitlines()[-1] == summary.line()
    finally:
        console.close()
        node0.close()


def test_node_rank_0_waits_a_bounded_time_for_a_lost_node(stores: tuple[Any, Any]) -> None:
    store0, _ = stores
    activity = RankActivity()
    node0 = JobProgressExchange(activity, None, interval_s=60, final_wait_s=0.5)
    try:
        node0.start_round(store0, 0, 2)
        node0.set_ranks({0: 0})
        _feed(activity, 0, 100)
        node0.workers_ended()  # node 1 never reports: returns after final_wait_s
        summary = node0.latest()
        assert summary is not None and (summary.nodes_reporting, summary.nodes) == (1, 2)
    finally:
        node0.close()


def test_node_rank_0_waits_for_no_final_report_of_a_node_known_gone(
    stores: tuple[Any, Any],
) -> None:
    """A node whose agent died never sends its final report: where the presence probe says it
    is gone, node rank 0 stops waiting within a second, not after the final wait (30 s: the
    supervision loop, which waits in this call, saw a lost node's peers fail that late)."""
    store0, store1 = stores
    activity = RankActivity()
    node0 = JobProgressExchange(activity, None, interval_s=60, final_wait_s=30)
    asked: list[list[int]] = []

    def gone(nodes: Sequence[int]) -> set[int]:
        asked.append(list(nodes))
        return {1} & set(nodes)

    node0.nodes_gone(gone)
    try:
        node0.start_round(store0, 0, 3)
        node0.set_ranks({0: 0})
        _feed(activity, 0, 40)
        _publish(store1, 1, 1, 40, time.time())  # node 1 reported, then its agent died
        _publish(store1, 2, 1, 40, time.time())
        final_2 = json.loads(store0.get(f"{PROGRESS_KEY_PREFIX}2"))
        store1.set(f"{PROGRESS_KEY_PREFIX}2", json.dumps({**final_2, "seq": 2, "final": True}))
        started_s = time.monotonic()
        node0.workers_ended()
        waited_s = time.monotonic() - started_s
    finally:
        node0.close()
    assert waited_s < 5, waited_s
    assert asked == [[1]]  # node 2's final report is in: only node 1 is asked about


def test_node_rank_0_waits_for_no_final_report_of_a_node_that_stopped_publishing(
    stores: tuple[Any, Any],
) -> None:
    """A node cut off (no probe can tell): its report stopped changing, so it is not live,
    and node rank 0 waits no longer than the stale time for it."""
    store0, store1 = stores
    now = [1000.0]

    def clock() -> float:
        now[0] += 0.05  # each look at the clock: time passes as the wait polls
        return now[0]

    activity = RankActivity(clock=clock)
    node0 = JobProgressExchange(
        activity, None, interval_s=0.1, final_wait_s=30, stale_after_s=2, clock=clock
    )
    try:
        node0.start_round(store0, 0, 2)
        node0.set_ranks({0: 0})
        _feed(activity, 0, 40)
        _publish(store1, 1, 1, 40, time.time())
        node0.exchange()
        started_s = now[0]
        node0.workers_ended()
        waited_s = now[0] - started_s
    finally:
        node0.close()
    assert 2 <= waited_s < 4, waited_s


class _Handler(RendezvousHandler):
    def __init__(self, store: Any) -> None:
        self.store = store
        self.rounds = 0

    def get_backend(self) -> str:
        return "test"

    def next_rendezvous(self) -> RendezvousInfo:
        self.rounds += 1
        return RendezvousInfo(self.store, 1, 3, RendezvousStoreInfo("localhost", 0))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return "run"

    def shutdown(self) -> bool:
        return True


def test_every_rendezvous_round_reaches_the_listener(stores: tuple[Any, Any]) -> None:
    rounds: list[tuple[Any, int, int]] = []
    inner = _Handler(stores[0])
    handler = ObservedRendezvous(
        inner, lambda store, rank, nodes: rounds.append((store, rank, nodes))
    )
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (1, 3)
    assert rounds == [(stores[0], 1, 3)]
    assert (handler.get_run_id(), handler.get_backend(), inner.rounds) == ("run", "test", 1)

    def broken(store: Any, rank: int, nodes: int) -> None:
        raise RuntimeError("listener bug")

    assert ObservedRendezvous(inner, broken).next_rendezvous().rank == 1  # never fails a round


def test_only_the_rank_0_node_prints_the_job_line(stores: tuple[Any, Any]) -> None:
    import io

    from torchx_elastic.agent.console.output.display import PlainConsole

    store0, store1 = stores
    printed: dict[int, bytes] = {}
    for node, store in ((1, store1), (0, store0)):
        activity = RankActivity()
        exchange = JobProgressExchange(activity, None, interval_s=60)
        exchange.start_round(store, node, 2)
        exchange.set_ranks({0: 2 * node, 1: 2 * node + 1})
        _feed(activity, 0, 10 + node), _feed(activity, 1, 20 + node)
        err = io.BytesIO()
        console = PlainConsole(activity, io.BytesIO(), err, status_interval_s=0, job=exchange)
        exchange.exchange()
        console.print_status()
        printed[node] = err.getvalue()
        exchange.close()
    assert printed[1] == b""  # one line per job, not one per node
    assert printed[0] == (
        b"[job progress] 10/100 (10.0%) of 4/4 ranks on 2/2 nodes, slowest r0 (n0) 10,"
        b" fastest r3 (n1) 21\n"
    )


def test_node_rank_0_samples_progress_into_the_event_log_at_a_bounded_rate(
    stores: tuple[Any, Any], tmp_path: Path
) -> None:
    from torchx_elastic.contract import events as event_records
    from torchx_elastic.contract.events import EventLog, read_events

    store0, _ = stores
    now = [0.0]
    events = EventLog.in_dir(str(tmp_path))
    activity = RankActivity(clock=lambda: now[0])
    node0 = JobProgressExchange(
        activity,
        None,
        interval_s=60,
        final_wait_s=0.5,
        clock=lambda: now[0],
        record_event=events.emit,
    )
    try:
        node0.start_round(store0, 0, 1)
        node0.set_ranks({0: 0})
        for step in range(1, 41):  # 40 exchanges, 0.25 s apart: 10 s
            now[0] += 0.25
            _feed(activity, 0, step)
            node0.exchange()
        node0.exchange()  # nothing changed: no sample
        activity.finish(0, 0)
        node0.workers_ended()
    finally:
        node0.close()
    samples = [r for r in read_events(events.path or "") if r["event"] == event_records.PROGRESS]
    interval = event_records.PROGRESS_INTERVAL_S
    assert [s["step"] for s in samples] == [1, 9, 17, 25, 33, 40]
    assert 10 / interval <= len(samples) <= 10 / interval + 2
    assert set(event_records.PROGRESS_FIELDS) <= set(samples[-1])
    assert (samples[-1]["slowest_rank"], samples[-1]["total"]) == (0, 100)


class _CountedCalls:
    """The round's store, each call the exchange makes counted by its name."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any) -> Any:
            self.calls.append(name)
            return method(*args)

        return counted


def test_node_rank_0_reads_every_report_in_one_call(stores: tuple[Any, Any]) -> None:
    """However many nodes publish, node rank 0's exchange is three store calls once their
    reports are in: its own report, the count of publishers and one read of all reports."""
    store0, store1 = stores
    counted = _CountedCalls(store0)
    activity = RankActivity()
    node0 = JobProgressExchange(activity, None, interval_s=60)
    nodes = 64
    try:
        node0.start_round(counted, 0, nodes)
        node0.set_ranks({0: 0})
        _feed(activity, 0, 10)
        for node in range(1, nodes):  # as their agents publish: the report, then the count
            _publish(store1, node, 1, 10, 0.0)
            store1.add(PROGRESS_PUBLISHERS_KEY, 1)
        node0.exchange()  # the first: node 0 finds the reports (one check of them all)
        assert counted.calls.count("check") == 1
        counted.calls.clear()
        for node in range(1, nodes):
            _publish(store1, node, 2, 20, 0.0)
        node0.exchange()
        assert counted.calls == ["set", "add", "multi_get"]
        summary = node0.latest()
        assert summary is not None and (summary.nodes_reporting, summary.nodes) == (64, 64)
        assert (summary.step, summary.fastest_step) == (10, 20)
    finally:
        node0.close()


def test_the_interval_grows_with_the_nodes_so_that_node_rank_0_reads_a_bounded_rate(
    stores: tuple[Any, Any],
) -> None:
    """Past MAX_REPORTS_PER_S nodes every node publishes less often, and a node counts as live
    for as many of the longer intervals."""
    assert [exchange_interval_s(1.0, n) for n in (2, 16, 256)] == [1.0, 1.0, 1.0]
    assert exchange_interval_s(1.0, 1000) == 1000 / MAX_REPORTS_PER_S == 3.90625
    assert exchange_interval_s(1.0, 4000) == 15.625
    store0, store1 = stores
    live, now = [], [0.0]
    for nodes in (2, 256 * 120):  # intervals of 60 s and of 120 s
        now[0] = 0.0
        activity = RankActivity(clock=lambda: now[0])
        node0 = JobProgressExchange(activity, None, interval_s=60, clock=lambda: now[0])
        try:
            node0.start_round(store0, 0, nodes)
            node0.set_ranks({0: 0})
            _feed(activity, 0, 10)
            _publish(store1, 1, 1, 10, 0.0)
            store1.add(PROGRESS_PUBLISHERS_KEY, 1)
            node0.exchange()
            now[0] += 400.0  # node 1's report unchanged: over 5 intervals of 60 s, not of 120 s
            _feed(activity, 0, 20)
            node0.exchange()
            summary = node0.latest()
            assert summary is not None
            live.append(summary.nodes_reporting)
        finally:
            node0.close()
    assert live == [1, 2]  # node 0, and node 1 where it is still live


class _SlowStore:
    """A round's store whose every call waits until released (a store slowed by a thousand
    nodes, or one whose host is going away)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.entered.set()
            self.release.wait(30)
            return getattr(self.store, name)(*args)

        return call


def test_a_new_round_does_not_wait_for_the_exchange_of_the_round_before(
    stores: tuple[Any, Any],
) -> None:
    store0, _ = stores
    activity = RankActivity()
    node0 = JobProgressExchange(activity, None, interval_s=60)
    slow = _SlowStore(store0)
    try:
        node0.start_round(slow, 0, 2)
        node0.set_ranks({0: 0})
        _feed(activity, 0, 10)
        stuck = threading.Thread(target=node0.exchange, daemon=True)
        stuck.start()
        assert slow.entered.wait(10)  # the exchange of round 1 holds its store call
        started = time.monotonic()
        node0.start_round(store0, 0, 1)  # round 2
        assert time.monotonic() - started < 5.0
        node0.exchange()
        assert node0.latest() is not None and node0.latest().nodes == 1  # type: ignore[union-attr]
        slow.release.set()
        stuck.join(10)
        summary = node0.latest()
        assert summary is not None and summary.nodes == 1  # round 1's late summary is not kept
    finally:
        slow.release.set()
        node0.close()
