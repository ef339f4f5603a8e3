"""The line a node prints while its first round waits, as the node count grows."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import AgentConfig, config_from_args
from torchx_elastic.agent.config.rdzv_settings import DEFAULT_JOIN_TIMEOUT_S
from torchx_elastic.agent.rendezvous import diagnosis, roll_call, waiting
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry, RollCall
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.waiting import Deadline, progress_line, waiting_line


def config(nnodes: str) -> AgentConfig:
    argv = ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29500"]
    return config_from_args(build_parser().parse_args([*argv, "--rdzv-id", "job", "train.py"]))


# the lines' deadline: its wall-clock time and the default join timeout (600 s)
DEADLINE = Deadline("10:00:00", DEFAULT_JOIN_TIMEOUT_S)
ROUND_WAIT_S = 60.0  # a bound on a hang, not a speed


def peers(count: int) -> list[NodeEntry]:
    return [NodeEntry(f"n{i}", 7, "job", f"n{i}", "1:3", 1, 0, "c10d") for i in range(count)]


def test_a_fixed_size_job_counts_what_is_missing() -> None:
    assert waiting_line(peers(1), config("2"), True, DEADLINE) == (
        "waiting for nodes: 1 of 2 joined; here: n0 (pid 7); missing: 1 node; hosting the"
        " rendezvous at n0:29500, run id 'job'; gives up at 10:00:00 (join timeout 600s)"
    )
    assert progress_line(peers(1), config("2")) == (
        "[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node"
    )


def test_an_elastic_job_below_its_minimum_and_in_its_last_call() -> None:
    assert progress_line(peers(1), config("2:3")) == (
        "[job progress] waiting for nodes: 1 of 2 joined (starts with 2, takes up to 3);"
        " missing: 1 node"
    )
    # its minimum is here: the round waits its last call for more (never "2 of 1 joined")
    assert waiting_line(peers(2), config("1:3"), False, DEADLINE) == (
        "waiting for nodes: 2 joined, enough to start (takes up to 3; the round closes after"
        " its last call); here: n0 (pid 7), n1 (pid 7); missing: none; rendezvous at"
        " n0:29500, run id 'job'; gives up at 10:00:00 (join timeout 600s)"
    )


@dataclass(frozen=True)
class Node:
    addr: str
    pid: int


@pytest.mark.parametrize(
    ("setting", "flag", "mine", "theirs"),
    [
        ("nnodes", "--nnodes", "2", "3"),
        ("nproc_per_node", "--nproc-per-node", 2, 4),
        ("max_restarts", "--max-restarts", 0, 3),
        ("rdzv_backend", "--rdzv-backend", "c10d", "static"),
        ("liveness", "--rdzv-conf liveness", "keys", "state"),
    ],
)
def test_a_peer_with_another_shared_setting_is_named_with_both_values_and_hosts(
    setting: str, flag: str, mine: object, theirs: object
) -> None:
    """Each node publishes its settings in the roll call; the first to read a peer's that
    differ names the flag, both values and both nodes (nothing is said while they agree)."""
    store = HashStore()
    base = NodeEntry("h0", 5, "job", "h0", "2", 1, 0, "c10d")
    me = NodeEntry(**{**base.__dict__, setting: mine})
    peer = NodeEntry(**{**base.__dict__, "host": "h1", "pid": 6, setting: theirs})
    call = RollCall(store, me, StoreSigner(None))
    RollCall(store, NodeEntry(**{**peer.__dict__, setting: mine}), StoreSigner(None))
    assert roll_call.settings_mismatch(call.entries()[0], me) is None
    RollCall(store, peer, StoreSigner(None))
    problem = roll_call.settings_mismatch(call.entries()[0], me)
    assert problem is not None
    assert problem.line() == (
        f"nodes disagree on {flag}: {mine} on h0 (pid 5), {theirs} on h1 (pid 6); start every"
        f" node of run id 'job' with the same {flag}"
    )


def test_a_peer_that_said_the_mismatch_first_and_left_is_still_named() -> None:
    """Both nodes of a mismatch name it: the one that saw it first leaves the roll call as it
    fails; the other, checking after, still finds its entry (CI: it found none, and said its
    job had finished)."""
    store = HashStore()
    me = NodeEntry("h0", 5, "job", "h0", "3", 1, 0, "c10d")
    peer = RollCall(store, NodeEntry("h1", 6, "job", "h1", "2", 1, 0, "c10d"), StoreSigner(None))
    peer.leave()
    call = RollCall(store, me, StoreSigner(None))
    problem = roll_call.settings_mismatch(call.entries()[0], me)
    assert problem is not None
    assert problem.line() == (
        "nodes disagree on --nnodes: 3 on h0 (pid 5), 2 on h1 (pid 6); start every node of run"
        " id 'job' with the same --nnodes"
    )


def test_a_first_round_left_for_the_moved_job_says_nothing_more() -> None:
    """A node that follows the job to its moved rendezvous (failover.py) while its first
    round waits makes no report of that round after it left: CI once printed "waiting for
    nodes ... hosting the rendezvous at h0:29500" after "this node joins the job there"."""
    release = threading.Event()

    class Waits:
        def next_rendezvous(self) -> None:
            release.wait(30)

    class LeftDuringTheFirstPoll(threading.Event):
        """Not left when the wait starts; left from then on (the move came during a poll)."""

        def __init__(self) -> None:
            super().__init__()
            self.asked = 0

        def is_set(self) -> bool:
            self.asked += 1
            return self.asked > 1

    explained = object.__new__(waiting.ExplainedRendezvous)
    explained.handler = Waits()  # type: ignore[assignment]
    explained._abandoned = LeftDuringTheFirstPoll()
    ticks: list[bool] = []
    try:
        with pytest.raises(waiting.RendezvousError, match="left the rendezvous"):
            explained._join(ticks.append)
    finally:
        release.set()
    assert ticks == []


@pytest.mark.parametrize("leaves", [True, False])
def test_a_report_under_way_as_the_node_leaves_its_first_round_is_not_said(
    monkeypatch: pytest.MonkeyPatch, leaves: bool
) -> None:
    """The move can also come while a tick reads the store for its report (CI again:
    "waiting for nodes ... hosting the rendezvous at h0:29500" after "this node joins the job
    there"): ``abandon()`` does not wait for that read, and the report is not said. A node
    that stays says it."""
    reading, left = threading.Event(), threading.Event()
    said: list[str] = []

    def standbys(handler: object) -> tuple[int, bool]:
        reading.set()
        left.wait(ROUND_WAIT_S)
        return 0, False

    monkeypatch.setattr(waiting.membership, "standbys", standbys)
    monkeypatch.setattr(waiting, "say", said.append)
    me = NodeEntry("h0", 7, "job", "h0", "2", 1, 0, "c10d")
    call = RollCall(HashStore(), me, StoreSigner(None))
    explained = waiting.ExplainedRendezvous(None, call, config("2"), True, 600)  # type: ignore[arg-type]
    report = threading.Thread(target=explained._report, args=(DEADLINE,))
    report.start()
    assert reading.wait(ROUND_WAIT_S)
    if leaves:
        explained.abandon()  # returns at once: the report's store read holds no lock
    left.set()
    report.join(ROUND_WAIT_S)
    assert not report.is_alive()
    expected = waiting_line([me], config("2"), True, DEADLINE)
    assert said == ([] if leaves else [expected])


def test_each_node_checks_the_addresses_of_a_bounded_sample_of_peers_and_looks_each_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the first round waits every node checks, each tick, that its peers' published
    addresses resolve and answer: with 20 nodes, n5 checks the 8 after it in the roll call
    (each peer is checked by 8 nodes, whatever the job's size), looks each name up once, and
    probes each once it answered."""
    store = HashStore()
    entries = [NodeEntry(f"h{i}", 7, "job", f"n{i}", "20", 1, 0, "c10d") for i in range(20)]
    calls = [RollCall(store, entry, StoreSigner(None)) for entry in entries]
    looked_up: list[str] = []
    probed: list[str] = []
    monkeypatch.setattr(waiting, "resolved", lambda host: looked_up.append(host) or {"10.0.0.9"})
    monkeypatch.setattr(
        waiting, "answers", lambda host, port, timeout_s: probed.append(host) or True
    )
    explained = waiting.ExplainedRendezvous(None, calls[5], config("20"), False, 600)  # type: ignore[arg-type]
    for _ in range(3):  # three ticks
        explained._check()
    sample = [f"n{i}" for i in range(6, 14)]
    assert looked_up == sample and probed == sample
    assert [p.addr for p in roll_call.sampled_peers(entries, entries[18])] == [
        f"n{i}" for i in (19, 0, 1, 2, 3, 4, 5, 6)
    ]
    assert [p.addr for p in roll_call.sampled_peers(entries[:4], entries[2])] == ["n3", "n0", "n1"]


def test_a_waiting_line_of_a_thousand_nodes_names_sixteen() -> None:
    line = waiting_line(peers(1000), config("1000"), False, DEADLINE)
    assert line == (
        "waiting for nodes: 1000 of 1000 joined; here: "
        + ", ".join(f"n{i} (pid 7)" for i in range(16))
        + " and 984 more; missing: none; rendezvous at n0:29500, run id 'job'; gives up at"
        " 10:00:00 (join timeout 600s)"
    )


def test_a_first_round_that_did_not_form_says_whether_nodes_were_missing() -> None:
    few = waiting.timed_out(peers(1), 1, config("2"), 14)
    assert (few.cause, few.fix) == (
        "only 1 of 2 nodes joined within 14s (here: n0 (pid 7))",
        "start the missing node(s) with --rdzv-endpoint n0:29500 --rdzv-id job, or raise the"
        " limit with --rdzv-conf join_timeout=SECONDS",
    )
    # all came (the roll call) but their joins of the state did not all land in time: never
    # "only 1000 of 999 nodes joined"
    slow = waiting.timed_out(peers(1000), 370, config("999:1000"), 600)
    assert slow.cause == (
        "1000 nodes came (the job starts with 999) but only 370 of them were in the"
        " rendezvous within 600s (here: "
        + ", ".join(f"n{i} (pid 7)" for i in range(16))
        + " and 984 more)"
    )
    assert slow.fix == (
        "each join takes a slot in the rendezvous store, one store call after another: a"
        " rendezvous host short of CPU, or thousands of nodes at once, take longer; raise the"
        " limit with --rdzv-conf join_timeout=SECONDS"
    )


def test_each_tick_compares_only_the_entries_that_came_since_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tick of the first round (twice a second on every node) costs the same at any job
    size: the settings of each roll-call entry are compared once, and a peer that comes
    later with other settings is still named."""
    store = HashStore()
    entries = [NodeEntry(f"h{i}", 7, "job", f"h{i}", "3", 1, 0, "c10d") for i in range(100)]
    calls = [RollCall(store, entry, StoreSigner(None)) for entry in entries]
    compared: list[int] = []
    mismatch = roll_call.settings_mismatch
    monkeypatch.setattr(
        roll_call,
        "settings_mismatch",
        lambda found, me: compared.append(len(found)) or mismatch(found, me),
    )
    monkeypatch.setattr(waiting, "resolved", lambda host: {"10.0.0.9"})
    monkeypatch.setattr(waiting, "answers", lambda host, port, timeout_s: True)
    explained = waiting.ExplainedRendezvous(None, calls[5], config("3"), False, 600)  # type: ignore[arg-type]
    for _ in range(5):
        explained._check()
    assert compared == [100]
    RollCall(store, NodeEntry("late", 8, "job", "late", "2", 1, 0, "c10d"), StoreSigner(None))
    with pytest.raises(diagnosis.RendezvousDiagnosis, match="nodes disagree on --nnodes: 3 on"):
        explained._check()
    assert compared == [100, 1]
