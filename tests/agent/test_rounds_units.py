"""The agent's own rendezvous (agent/rendezvous/rounds/): nodes as threads on a real
``TCPStore``, each with its own connection, as agents on several hosts have."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

from torchx_elastic.agent import compat
from torchx_elastic.agent.rendezvous import membership
from torchx_elastic.agent.rendezvous.rounds import outcome
from torchx_elastic.agent.rendezvous.rounds.handler import RoundsRendezvous
from torchx_elastic.agent.rendezvous.rounds.keys import Keys, Node
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner

SIGNER = StoreSigner(b"the job's secret")


def new_store() -> Any:
    return TCPStore(  # type: ignore[call-arg]
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )


@pytest.fixture
def port() -> Iterator[int]:
    server = new_store()
    yield int(server.port)


def node(
    port: int,
    addr: str,
    min_nodes: int,
    max_nodes: int,
    last_call_s: float = 1.0,
    join_timeout_s: float = 30.0,
) -> RoundsRendezvous:
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    return RoundsRendezvous(
        store,
        SignedStore(store, SIGNER),
        "job",
        min_nodes,
        max_nodes,
        addr,
        last_call_s,
        join_timeout_s,
    )


class Joining:
    """``next_rendezvous`` of a node on a thread: its (rank, nodes) or its error."""

    def __init__(self, handler: RoundsRendezvous) -> None:
        self.handler = handler
        self.result: tuple[int, int] | None = None
        self.error: BaseException | None = None
        self.took_s = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            info = self.handler.next_rendezvous()
            self.result = (info.rank, info.world_size)
        except BaseException as err:  # noqa: BLE001 - the test reads it
            self.error = err
        self.took_s = time.monotonic() - started

    def wait(self, timeout_s: float = 20.0) -> Joining:
        self._thread.join(timeout_s)
        return self

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def until(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_fixed_job_admits_its_nodes_and_a_third_stands_by(port: int) -> None:
    a, b, spare = (node(port, f"h{i}", 2, 2) for i in range(3))
    first = [Joining(a), Joining(b)]
    for j in first:
        assert j.wait().result is not None
    assert sorted(j.result for j in first if j.result) == [(0, 2), (1, 2)]
    standing = Joining(spare)
    until(lambda: spare.standbys() == (1, True))
    assert not standing.done
    assert a.num_nodes_waiting() == 0  # a spare does not re-form a job at its maximum
    assert a.standbys() == (1, False)
    assert {n.addr for n in a.members().values()} == {"h0", "h1"}
    assert spare.node.id in a.state_node_ids()
    # as read by that look (the keyed liveness looks every beat), with no store call: what
    # the network watch counts among a member's peers once the store's host is silent
    a._signed = None  # any store call fails from here on
    assert [n.addr for n in a.waiting_seen()] == ["h2"]
    assert membership.peer_hosts(a) == ["h1", "h2"]


def test_a_node_said_dead_is_replaced_by_the_spare_at_once(port: int) -> None:
    a, b, spare = (node(port, f"h{i}", 2, 2, last_call_s=30.0) for i in range(3))
    joins = [Joining(a), Joining(b)]
    for j in joins:
        j.wait()
    Joining(spare)
    until(lambda: spare.standbys()[1])
    survivor, lost = (a, b) if a.rank == 0 else (b, a)
    assert survivor.drop({lost.node.id})
    assert survivor.num_nodes_waiting() >= 1 and survivor.moved_on()
    again = Joining(survivor).wait()
    assert again.result is not None and again.result[1] == 2, again.error
    assert again.took_s < 5.0  # no last call: the members that come back are there
    assert {n.addr for n in survivor.members().values()} == {survivor.node.addr, "h2"}
    assert lost.dropped()


def test_a_spare_whose_store_went_as_its_first_round_started_knows_the_round_it_saw(
    port: int,
) -> None:
    """A spare comes into a round and the store goes as the round starts (its host was
    stopped): the failover counts, with no store call, from the last round the spare saw
    complete while it stood by, the one its peer trained in; not the round it came into,
    whatever it read of it (a Kubernetes run: the spare took itself for the successor, the
    survivor too, and each hosted the rendezvous alone)."""
    a, b, spare = (node(port, f"h{i}", 2, 2, last_call_s=30.0) for i in range(3))
    for joined in [Joining(a), Joining(b)]:
        joined.wait()
    standing = Joining(spare)
    until(lambda: spare.standbys()[1])
    survivor, lost = (a, b) if a.rank == 0 else (b, a)
    assert survivor.drop({lost.node.id})
    again = Joining(survivor)
    assert standing.wait().result is not None, standing.error
    assert again.wait().result is not None, again.error
    assert spare.node.addr in {n.addr for n in spare.members().values()}  # read, and then
    spare._signed = None  # the store is gone: any store call fails
    assert membership.round_addresses_seen_waiting(spare) == {0: "h0", 1: "h1"}


def test_members_that_come_back_take_their_places_before_spares(port: int) -> None:
    a, b = node(port, "h0", 2, 2, 30.0), node(port, "h1", 2, 2, 30.0)
    spares = [node(port, f"s{i}", 2, 2, 30.0) for i in range(2)]
    for j in [Joining(a), Joining(b)]:
        j.wait()
    waiting = [Joining(s) for s in spares]
    until(lambda: a.standbys()[0] == 2)
    restarts = [Joining(a), Joining(b)]  # both restart their workers (a failure)
    for j in restarts:
        assert j.wait().result is not None, j.error
    assert sorted(j.result for j in restarts if j.result) == [(0, 2), (1, 2)]
    assert all(not j.done for j in waiting)


def test_an_elastic_job_completes_at_its_last_call_and_takes_a_newcomer_in(port: int) -> None:
    a, b, c = (node(port, f"h{i}", 1, 3, last_call_s=0.5) for i in range(3))
    first = [Joining(a), Joining(b)]
    for j in first:
        assert j.wait().result is not None
    assert {j.result[1] for j in first if j.result} == {2}
    newcomer = Joining(c)
    until(lambda: a.num_nodes_waiting() == 1)
    again = [Joining(a), Joining(b)]
    for j in [*again, newcomer]:
        assert j.wait().result is not None, j.error
    assert sorted(j.result for j in [*again, newcomer] if j.result) == [(0, 3), (1, 3), (2, 3)]


def test_a_spare_ends_with_the_closed_rendezvous_saying_it_stood_by(port: int) -> None:
    a, b, spare = (node(port, f"h{i}", 2, 2) for i in range(3))
    for j in [Joining(a), Joining(b)]:
        j.wait()
    standing = Joining(spare)
    until(lambda: spare.standbys()[1])
    assert a.shutdown() and a.is_closed()
    err = standing.wait().error
    assert err is not None and compat.job_ended(err) and compat.stood_by(err)
    assert "the rendezvous of run 'job' is closed" in str(err)


def test_a_round_short_of_its_minimum_times_out_saying_how_many_came(port: int) -> None:
    alone = node(port, "h0", 2, 2, join_timeout_s=0.5)
    err = Joining(alone).wait().error
    assert isinstance(err, RendezvousTimeoutError)
    assert str(err) == "round 1 of the rendezvous did not complete in 0.5s (1 of 2 nodes came)"


def test_a_slot_written_without_the_jobs_secret_is_not_admitted(port: int) -> None:
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    keys = Keys("job")
    store.add(keys.count(0), 1)  # an intruder takes slot 0 and writes an unsigned node
    store.set(keys.slot(0, 0), Node("evil", 1, 1).encode())
    a, b = node(port, "h0", 2, 2, last_call_s=0.2), node(port, "h1", 2, 2, last_call_s=0.2)
    joins = [Joining(a), Joining(b)]
    for j in joins:
        assert j.wait(30).result is not None, j.error
    assert {n.addr for n in a.members().values()} == {"h0", "h1"}


def test_the_outcome_admits_returning_members_first_and_ranks_by_address() -> None:
    came = [
        Node("spare", 1, 1),
        Node("b", 2, 2, last_round=3, last_rank=1),
        Node("a", 3, 3, last_round=3, last_rank=0),
        None,
        Node("new", 4, 4),
    ]
    arrivals = outcome.Arrivals(4, came, back=2, expected=2)
    # ranked by address, as torch's c10d rendezvous ranks nodes
    assert outcome.members(arrivals, set(), 3) == [2, 1, 4]
    assert outcome.members(arrivals, {came[4].id}, 3) == [2, 1, 0]  # type: ignore[union-attr]
    assert outcome.members(arrivals, set(), 2) == [2, 1]  # the spare and the new one wait
    assert outcome.ready(arrivals, 2, 2, last_call_passed=False)
    short = outcome.Arrivals(4, came, back=1, expected=2)
    assert not outcome.ready(short, 2, 2, last_call_passed=False)  # a member is on its way
    assert outcome.ready(short, 2, 2, last_call_passed=True)
    first = outcome.Arrivals(0, [Node("a", 1, 1)], back=0, expected=0)
    assert not outcome.ready(first, 1, 2, last_call_passed=False)
    assert outcome.ready(first, 1, 1, last_call_passed=False)


def test_a_forged_opening_of_a_round_is_passed_over_and_said_once(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = node(port, "h0", 2, 2), node(port, "h1", 2, 2)
    for j in [Joining(a), Joining(b)]:
        assert j.wait().result is not None
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    store.set(Keys("job").opened(1), b"a pickle, say")  # not signed with the job's secret
    with caplog.at_level("WARNING"):
        assert [a.num_nodes_waiting() for _ in range(3)] == [0, 0, 0]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].startswith(
        "refused the rendezvous state of run 'job' from the rendezvous store:"
    )
    again = [Joining(a), Joining(b)]  # a real opening of round 1 replaces the forged one
    assert sorted(j.wait().result for j in again) == [(0, 2), (1, 2)]  # type: ignore[type-var]
    assert a.round == 1


def test_a_node_new_to_the_job_at_a_lost_members_address_comes_before_a_spare() -> None:
    came = [Node("aa-spare", 1, 1), Node("lost-host", 9, 9), Node("a", 3, 3, 0, 0)]
    arrivals = outcome.Arrivals(1, came, back=1, expected=1)
    assert outcome.members(arrivals, set(), 2, frozenset({"a", "lost-host"})) == [2, 1]
    assert outcome.members(arrivals, set(), 2) == [2, 0]  # "a" < "aa-spare"


def test_the_nodes_said_dead_are_an_index_each_node_reads_from_where_it_left_off(
    port: int,
) -> None:
    a, b, c = (node(port, f"h{i}", 3, 3) for i in range(3))
    for j in [Joining(a), Joining(b), Joining(c)]:
        assert j.wait().result is not None
    watcher = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    own = SignedStore(watcher, SIGNER)  # the liveness' own connection
    assert a.dropped_ids(own) == set()
    assert a.drop({c.node.id}, own) and not b.drop({c.node.id})  # said once, by one watcher
    assert a.dropped_ids() == b.dropped_ids() == {c.node.id}
    assert c.node.id not in a.state_node_ids() and c.dropped()
    b.drop({"gone_1_1"})  # a node that was never a member: dropped, no round moved
    assert a.dropped_ids(own) == {c.node.id, "gone_1_1"}
    assert int(watcher.add(Keys("job").dropped_count, 0)) == 2


def test_the_slots_written_are_found_in_a_few_checks_not_one_per_slot(port: int) -> None:
    a = node(port, "h0", 1, 1)
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    keys = [f"k{i}" for i in range(64)]
    for key in keys[:40] + keys[41:]:  # one taken, not written yet
        store.set(key, "x")
    checks: list[int] = []

    class Counted:
        def check(self, wanted: list[str]) -> bool:
            checks.append(len(wanted))
            return bool(store.check(wanted))

    assert a._written(keys, Counted()) == keys[:40] + keys[41:]  # noqa: SLF001
    assert len(checks) <= 2 * 7  # log2(64) levels, two halves each


def test_a_nodes_looks_at_the_nodes_waiting_read_each_arrival_once(port: int) -> None:
    a, b = node(port, "h0", 2, 2), node(port, "h1", 2, 2)
    for j in [Joining(a), Joining(b)]:
        assert j.wait().result is not None
    spares = [node(port, f"s{i}", 2, 2) for i in range(3)]
    for spare in spares:
        Joining(spare)
    until(lambda: a.standbys()[0] == 3)
    read: list[str] = []
    multi_get = a._signed.multi_get  # noqa: SLF001

    def counted(keys: list[str]) -> Any:
        read.extend(keys)
        return multi_get(keys)

    a._signed.multi_get = counted  # type: ignore[method-assign]  # noqa: SLF001
    assert {n.addr for n in a.waiting_nodes()} == {"s0", "s1", "s2"}
    assert {n.addr for n in a.waiting_nodes()} == {"s0", "s1", "s2"}
    assert len([k for k in read if "/slot/" in k]) == 3  # the second look read none again


def test_the_first_round_where_the_job_moved_re_forms_once_the_survivors_came(
    port: int,
) -> None:
    # an elastic job of three (2:3) loses h0, the rendezvous host: its two survivors meet on
    # the store the job moved to. That round needs no last call (30 s here): both came
    before = [node(port, f"h{i}", 2, 3, last_call_s=30.0) for i in range(3)]
    joins = [Joining(h) for h in before]
    assert all(j.wait(40).result for j in joins)
    for handler in before:
        handler.members()  # read once per round, as the liveness ring does
    moved = new_store()
    survivors = [node(int(moved.port), f"h{i}", 2, 3, last_call_s=30.0) for i in (1, 2)]
    for new, old in zip(survivors, before[1:], strict=True):
        new.continue_from(old, lambda member: member.addr == "h0")
        assert new.node.id == old.node.id  # the same node, to the watchers too
    again = [Joining(h) for h in survivors]
    assert sorted(j.wait().result or () for j in again) == [(0, 2), (1, 2)]
    assert max(j.took_s for j in again) < 5.0
    # a node new to the job on that store waits out the last call as a first round does
    fresh = new_store()
    first = [Joining(node(int(fresh.port), f"h{i}", 2, 3, last_call_s=2.0)) for i in (1, 2)]
    assert all(j.wait().result for j in first)
    assert min(j.took_s for j in first) >= 2.0
