"""The rendezvous-at-scale harness (bench/scale/): its counted store, and a whole run of
4 nodes for torch's handler and ours (a stopped node is found lost and the round re-forms)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import TCPStore

from bench.scale.__main__ import main
from bench.scale.counting import CountingStore, NodeStopped
from bench.scale.nodes import node_address, stacks_of
from bench.scale.summary import assess, percentile, render_table, summarize
from torchx_elastic.contract import PROGRESS_KEY_PREFIX

STATE_KEY = "torch.rendezvous.test"
# small enough for a few seconds, safe from torch's own drop right after a round forms
# (two missed beats drop a node whose last join heartbeat is a beat old)
FAST_CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1"


@pytest.fixture
def server() -> Iterator[Any]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    yield store


def _client(server: Any) -> CountingStore:
    timeout = datetime.timedelta(seconds=10)
    client = TCPStore("127.0.0.1", server.port, is_master=False, multi_tenant=True, timeout=timeout)
    return CountingStore(client, STATE_KEY)


def test_calls_are_counted_by_kind_with_their_bytes(server: Any) -> None:
    store = _client(server)
    store.set("a", "xyz")
    assert store.get("a") == b"xyz"
    assert store.add("n", 2) == 2
    assert store.check(["a"])
    counters = store.reset()
    assert {k: v.calls for k, v in counters.kinds.items()} == {
        "set": 1,
        "get": 1,
        "add": 1,
        "check": 1,
    }
    assert counters.kinds["set"].bytes_out == len("a") + len("xyz")
    assert counters.kinds["get"].bytes_in == len("xyz")
    assert store.reset().kinds == {}  # counting starts again


def test_a_lost_state_cas_is_a_conflict_and_the_next_success_a_beat(server: Any) -> None:
    first, second = _client(server), _client(server)
    first.compare_set(STATE_KEY, "", "v0")  # the backend's first write: not a heartbeat
    assert first.compare_set(STATE_KEY, "v0", "v1") == b"v1"
    assert second.compare_set(STATE_KEY, "v0", "v2") == b"v1"  # another node wrote first
    assert second.compare_set(STATE_KEY, "v1", "v2") == b"v2"
    counters = second.reset()
    assert (counters.cas_attempts, counters.cas_conflicts) == (2, 1)
    assert counters.beat_retries == [1]
    assert counters.state_bytes == len("v2")
    assert counters.purposes["state"] == 2
    assert counters.purpose_bytes["state"] == 2 * (len(STATE_KEY) + 6)  # key, 2 values, answer


def test_a_liveness_verdict_is_told_from_either_connection_of_the_node(server: Any) -> None:
    from torchx_elastic.agent.rendezvous.keyed_liveness import beat_key, dead_key

    store = _client(server)
    twin = store.connect_again()  # the liveness' own connection
    named: list[str] = []
    store.on_verdict = named.append
    twin.set(dead_key("job", "127.0.0.5_77_0"), "dead 3")
    store.set(beat_key("job", "127.0.0.6_77_0"), "1")  # a heartbeat: no verdict
    store.set("torchx_elastic/other/dead/x", "1")
    assert named == ["127.0.0.5_77_0"]


def test_healthy_nodes_said_dead_while_they_joined_are_counted() -> None:
    raw: dict[str, Any] = {
        "loss": {"victim": 9, "victim_address": "127.0.0.10"},
        "form": {"go_at": 100.0},
        "lost": [{"ev": "lost", "node": 1, "t": 110.0, "names": ["127.0.0.10 (agent pid 7)"]}],
        "verdicts": [  # written by liveness threads, the nodes inside a join
            {"ev": "verdict", "node": 2, "t": 109.0, "named": "127.0.0.10_7_0"},
            {"ev": "verdict", "node": 3, "t": 120.0, "named": "127.0.0.4_7_0"},
            {"ev": "verdict", "node": 5, "t": 121.0, "named": "127.0.0.4_7_0"},
        ],
    }
    record = summarize(raw)
    assert record["false_drops"] == []  # none saw itself dropped: each was inside a join
    assert record["declared_dead_healthy"] == ["127.0.0.4"]
    assert [(e["ev"], e["node"], e["s_after_go"]) for e in record["events"]] == [
        ("verdict", 2, 9.0),
        ("lost", 1, 10.0),
        ("verdict", 3, 20.0),
        ("verdict", 5, 21.0),
    ]
    assert "| ours | 1000 | - | - | - | 0 / 1 |" in render_table(
        [{"impl": "ours", "nodes": 1000, **record}]
    )


def test_a_prefixed_round_store_is_counted_through_torch(server: Any) -> None:
    from torch.distributed import PrefixStore

    store = _client(server)
    PrefixStore("torch.rendezvous.test.1", store).set(f"{PROGRESS_KEY_PREFIX}0", "{}")
    assert store.reset().purposes["progress"] == 1


def test_a_frozen_node_reaches_nothing_and_ends_when_released(server: Any) -> None:
    import threading

    store = _client(server)
    store.freeze()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            store.get("a")
        except NodeStopped as err:
            errors.append(err)

    caller = threading.Thread(target=call)
    caller.start()
    store.release()
    caller.join()
    assert len(errors) == 1
    assert store.reset().kinds == {}


def test_every_node_has_an_address_of_its_own() -> None:
    addresses = [node_address(i) for i in range(70_000)]
    assert len(set(addresses)) == len(addresses)
    assert "127.0.0.1" not in addresses  # the store's


def test_a_straggler_is_shown_where_its_thread_waits() -> None:
    """A round that did not re-form in time: the harness shows where the late nodes'
    threads wait, and every thread of the process grouped by its innermost frames."""
    release = threading.Event()

    def waits_for_the_store() -> None:
        release.wait(30)

    threads = [threading.Thread(target=waits_for_the_store, name=f"node-{i}") for i in (7, 8)]
    for thread in threads:
        thread.start()
    try:
        runners = {7: SimpleNamespace(thread=threads[0]), 8: SimpleNamespace(thread=threads[1])}
        found = stacks_of(runners, [7])  # type: ignore[arg-type]
    finally:
        release.set()
    assert list(found["nodes"]) == ["7"]
    frames = found["nodes"]["7"]
    assert frames[-1].startswith("wait (threading.py:")  # innermost last
    assert any(f.startswith("waits_for_the_store (test_scale_harness.py:") for f in frames)
    grouped = [k for k, n in found["threads"].items() if n == 2 and k.startswith("node-: ")]
    assert len(grouped) == 1 and "waits_for_the_store" in grouped[0]


def test_percentile_is_a_nearest_rank() -> None:
    assert percentile([], 99) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_four_nodes_of_each_rendezvous_are_measured(tmp_path: Path) -> None:
    output = tmp_path / "scale.json"
    argv = ["--nodes", "4", "--impl", "torch,ours", "--window", "2", "--settle", "1"]
    argv += ["--torch-conf", FAST_CONF, "--ours-conf", FAST_CONF, "--form-timeout", "60"]
    argv += ["--reform-timeout", "60", "--output", str(output), "--log-dir", str(tmp_path)]
    assert main(argv) == 0
    document = json.loads(output.read_text())
    records = {r["impl"]: r for r in document["records"]}
    assert set(records) == {"torch", "ours"}
    # torch's keep-alive: a CAS of the whole state (ours may keep its liveness elsewhere)
    assert records["torch"]["settings"]["keep_alive_interval_s"] == 1.0
    torch_steady = records["torch"]["steady"]
    assert torch_steady["cas"]["beats"] > 0 and torch_steady["cas"]["state_bytes"] > 0
    assert torch_steady["store"]["by_purpose_per_s"]["state"] > 0
    for impl, record in records.items():
        assert record["form"]["formed"] and record["form"]["all_in_s"] > 0, impl
        steady = record["steady"]
        assert steady["live_nodes"] == 4
        assert steady["store"]["ops_per_s"] > 0
        assert sum(k["per_s"] for k in steady["store"]["by_kind"].values()) > 0
        assert record["false_drops"] == [] and record["declared_dead_healthy"] == [], impl
        assert record["errors"] == []
        assert record["harness"]["harness_cores"] > 0
        loss = record["loss"]
        assert loss["reformed"] and loss["survivors_in_new_round"] == 3, impl
        assert loss["stragglers"] is None
        assert all(0 <= said["joined"] <= 3 for said in loss["progress"])
        assert loss["reformed_s"] > 0
        # each phase's traffic, counted from its start: the first round's, the re-forming's
        for phase, nodes in ((record["form"], 4), (loss, 3)):
            traffic = phase["traffic"]
            assert traffic["live_nodes"] == nodes, impl
            assert traffic["state_bytes_per_s_per_node"] > 0, impl
            assert traffic["bytes_per_s_per_node"] >= traffic["state_bytes_per_s_per_node"]
            if impl == "torch":
                assert traffic["cas_attempts"] >= nodes, impl  # each node's join is a write
            else:  # ours: a round's outcome is one CAS (rounds/handler.py), a verdict opens
                # the next round with one CAS of the round counter
                assert traffic["cas_attempts"] >= 1
        assert record["store_server"]["libuv"]
    # ours finds the stopped node lost by itself; torch's agent is told (its workers failed)
    assert records["ours"]["loss"]["detected_first_s"] is not None
    assert records["ours"]["steady"]["store"]["by_purpose_per_s"]["progress"] > 0
    assert records["torch"]["loss"]["told_at_once"]
    table = document["table_markdown"]
    assert table == render_table(document["records"])
    assert "| torch | 4 |" in table and "| ours | 4 |" in table


def test_a_bound_harness_of_agents_that_check_often_is_told_of_a_quieter_interval() -> None:
    def assessed(monitor_s: float, cores: float) -> dict[str, Any]:
        record: dict[str, Any] = {
            "monitor_interval_s": monitor_s,
            "settings": {"keep_alive_interval_s": 2.0},
            "harness": {"harness_cores": cores, "store_cores": 0.1, "lag_ms_p99": 1.0},
        }
        assess(record, cpus=2)
        return record["harness"]

    said = (
        "each simulated agent checks every 0.1 s, a thread's wake-up each: most of the"
        " harness's CPU in steady state; --monitor-interval 1 makes the same store calls"
        " with less of it (docs/bench.md)"
    )
    bound = assessed(0.1, 1.8)
    assert bound["bound_reasons"] == ["harness + store use 1.90 of 2 CPUs"]
    assert bound["notes"] == [said]
    assert assessed(1.0, 1.8)["notes"] == []  # checks once a second already
    quiet = assessed(0.1, 0.5)  # not bound: nothing to say
    assert not quiet["bound"] and quiet["notes"] == []


def test_threads_late_by_half_the_dead_node_time_after_a_loss_bound_the_harness() -> None:
    def assessed(lag_s: float, interval_s: float = 2.0, attempts: int = 5) -> dict[str, Any]:
        record: dict[str, Any] = {
            "impl": "ours",
            "settings": {"keep_alive_interval_s": interval_s, "keep_alive_max_attempt": attempts},
            "harness": {"harness_cores": 0.5, "store_cores": 0.1, "lag_ms_p99": 1.0},
            "loss": {"progress": [{"lag_s_max": 0.3}, {"lag_s_max": lag_s}]},
        }
        assess(record, cpus=2)
        return record["harness"]

    starved = assessed(7.4)
    assert starved["bound_reasons"] == [
        "threads woke up to 7.4 s late after the loss, against a dead-node time of 10 s: a"
        " healthy node's beats may have waited that long"
    ]
    assert starved["reform_lag_s_max"] == 7.4
    assert starved["notes"] == [
        "a longer dead-node time keeps the harness's starvation under it: --ours-conf"
        " keep_alive_interval=5,keep_alive_max_attempt=3 (torch's values) re-formed 1,000"
        " nodes on two CPUs (docs/bench.md)"
    ]
    assert not assessed(4.0)["bound"]  # under half of it: the agent's figures
    torchs = assessed(8.3, 5.0, 3)  # bound at torch's values too: nothing longer to say
    assert torchs["bound"] and torchs["notes"] == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_nodes_that_have_not_joined_yet_seldom_read_the_state() -> None:
    """Before its first round a node reads the state only for the audit, whose chance is of
    the job's size (about two of its nodes an interval): not every interval, as each node
    did while its own state was still empty."""
    command = [sys.executable, "-m", "bench.scale.before_join"]
    command += ["--nodes", "40", "--joined", "2", "--seconds", "4"]
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        command, cwd=repo, capture_output=True, text=True, timeout=100, check=True
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["nodes"] == 40 and measured["joined"] == 2
    # every interval (2 s) would be 0.5; the job's size makes it 2 in 40 an interval
    assert measured["get_calls_per_node_s"] < 0.25, measured
    assert measured["agent"]["tree"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nodes_waiting_in_a_forming_round_read_a_large_changing_round_at_its_pace() -> None:
    """A forming round of 600 arrivals (about 40 KB as stored, signed) that more nodes join
    several times a second: a waiting node reads the round's arrivals once a liveness
    interval (2 s: its watch list), not at every poll of its join (ten a second)."""
    command = [sys.executable, "-m", "bench.scale.while_forming", "--state-nodes", "600"]
    command += ["--waiting", "3", "--changes", "5", "--seconds", "8"]
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        command, cwd=repo, capture_output=True, text=True, timeout=280, check=True
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["state_nodes"] == 600 and measured["state_bytes"] > 12 * 1024, measured
    # it changed (a busy machine slows the writer); a read of the round sends its slots'
    # keys twice (check, multi_get) and gets their values: about 2.3 times the stored
    # bytes, every 2 s (1.2 a second, with slack); at every poll it would be 20 or more
    assert measured["changes_per_s"] > 0.5 and measured["stored_bytes"] > 32_000, measured
    assert 0 < measured["state_reads_per_s_per_node"] < 2.5, measured


def test_while_forming_says_what_it_takes() -> None:
    from bench.scale.while_forming import main as while_forming

    with pytest.raises(SystemExit) as err:
        while_forming(["--waiting", "0"])
    assert str(err.value) == "--state-nodes and --waiting: 1 or more; --changes: more than 0"


def test_before_join_says_which_joined_counts_it_takes() -> None:
    from bench.scale.before_join import main as before_join

    with pytest.raises(SystemExit) as err:
        before_join(["--nodes", "4", "--joined", "4"])
    assert str(err.value) == "--joined 4: from 1 to --nodes - 1 (3)"


def test_a_state_that_never_holds_the_nodes_is_said_and_the_run_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from bench.scale import before_join

    monkeypatch.setattr(before_join, "JOINED_TIMEOUT_S", -1.0)
    node = SimpleNamespace(handler=SimpleNamespace())  # no rendezvous of the agent's own
    with pytest.raises(SystemExit) as err:
        before_join.until_in_state(node, 3)
    assert str(err.value) == "a state of 3 nodes was not read in time"


def test_while_forming_ends_where_its_round_cannot_be_written_first() -> None:
    from bench.scale.while_forming import _Writer

    class Joined:  # a round that others joined already
        def add(self, key: str, amount: int) -> int:
            return amount + 3

    with pytest.raises(SystemExit) as err:
        _Writer(Joined(), "run", 2)
    assert str(err.value) == "the round's arrivals could not be written first"


def test_ranks_of_a_round_decided_twice_are_said() -> None:
    from bench.scale.coordinator import rank_conflicts

    def join(rank: int, world: int, rnd: int = 1) -> dict[str, Any]:
        return {"round": rnd, "rank": rank, "world": world}

    assert rank_conflicts([join(0, 2), join(1, 2), join(0, 1, rnd=2)]) == []
    assert rank_conflicts([join(0, 2), join(1, 2), join(1, 3), join(2, 2)]) == [
        "round 1: sizes [2, 3]",
        "round 1: ranks [1] given twice",
        "round 1: ranks [2] outside the round's size",
    ]
