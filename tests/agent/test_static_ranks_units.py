"""Duplicate and missing ``--node-rank`` of a static rendezvous, named from the claims in the
agents' store."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import config_from_args
from torchx_elastic.agent.rendezvous import static_ranks
from torchx_elastic.agent.rendezvous.diagnosis import Problem, RendezvousDiagnosis
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry, RollCall
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner
from torchx_elastic.agent.rendezvous.static_ranks import UnreadableClaim, check_claims
from torchx_elastic.contract import STATIC_RANK_KEY_PREFIX

FIX = "give each node its own --node-rank, 0 to --nnodes - 1"


def claim_together(ranks: list[int], nodes: int, round_: int = 0, store: Any = None) -> list[str]:
    """Every node's check, at once: the line each would print ('' for none)."""
    store = store or HashStore()
    found = [""] * len(ranks)

    def node(i: int) -> None:
        problem = check_claims(store, round_, ranks[i], nodes, f"h{i} (pid {i})", wait_s=10)
        found[i] = problem.line() if isinstance(problem, Problem) else ""

    threads = [threading.Thread(target=node, args=(i,)) for i in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return found


def test_distinct_ranks_pass_every_round() -> None:
    store = HashStore()
    assert claim_together([1, 0, 2], 3, store=store) == ["", "", ""]
    assert claim_together([1, 0, 2], 3, round_=1, store=store) == ["", "", ""]  # a restart


def test_a_rank_given_twice_and_one_given_to_nobody_is_named_by_every_node() -> None:
    lines = claim_together([0, 1, 1], 3)
    assert lines[0] == (
        "--node-rank 1 was given to h1 (pid 1) and h2 (pid 2); no node has --node-rank 2 of 3;"
        f" {FIX}"
    ) or lines[0] == (
        "--node-rank 1 was given to h2 (pid 2) and h1 (pid 1); no node has --node-rank 2 of 3;"
        f" {FIX}"
    )
    late = 1 if lines[1].startswith("--node-rank 1 is taken") else 2
    first = 3 - late
    assert (
        lines[late]
        == f"--node-rank 1 is taken by h{first} (pid {first}), which joined first; {FIX}"
    )
    assert lines[first] == lines[0]


def test_an_extra_node_with_a_taken_rank_is_the_only_one_told() -> None:
    store = HashStore()
    assert claim_together([0, 1], 2, store=store) == ["", ""]
    line = check_claims(store, 0, 1, 2, "h9 (pid 9)", wait_s=0)
    assert line is not None
    assert line.line() == f"--node-rank 1 is taken by h1 (pid 1), which joined first; {FIX}"


def test_a_node_that_replaces_a_lost_one_is_not_a_duplicate() -> None:
    """A new pod of the same index starts its rounds at 0 again, long after the job began:
    its predecessor's claim is no mistake, and neither are the others' round-0 claims."""
    store = HashStore()
    assert claim_together([0, 1], 2, store=store) == ["", ""]
    later = lambda: time.time() + 3600  # noqa: E731
    assert check_claims(store, 0, 1, 2, "h7 (pid 7)", wait_s=0, clock=later) is None
    # the same rank claimed twice within the minute is a mistake
    line = check_claims(store, 0, 0, 2, "h8 (pid 8)", wait_s=0)
    assert line is not None and line.line().startswith("--node-rank 0 is taken by h0 (pid 0)")


def test_a_claim_that_is_not_ours_gives_no_verdict() -> None:
    store = HashStore()
    store.set(f"{STATIC_RANK_KEY_PREFIX}0/1/count", "1")
    store.set(f"{STATIC_RANK_KEY_PREFIX}0/1/1", "not json")
    with pytest.raises(UnreadableClaim, match=f"^{STATIC_RANK_KEY_PREFIX}0/1/1: "):
        check_claims(store, 0, 1, 2, "h1 (pid 1)", wait_s=0)


def test_a_peer_that_claims_nothing_leaves_the_check_silent() -> None:
    assert check_claims(HashStore(), 0, 0, 2, "h0 (pid 0)", wait_s=0.2) is None


def test_the_handler_goes_on_with_a_warning_past_an_unreadable_claim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torchx_elastic.agent.rendezvous.static_ranks import CheckedStaticRanks

    store = HashStore()
    store.set(f"{STATIC_RANK_KEY_PREFIX}0/1/count", "1")
    store.set(f"{STATIC_RANK_KEY_PREFIX}0/1/1", "not json")

    class Static:
        def next_rendezvous(self) -> Any:
            return (store, 1, 2)

    argv = ["--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "n0:29500"]
    config = config_from_args(build_parser().parse_args([*argv, "--node-rank", "1", "x.py"]))
    checked = CheckedStaticRanks(Static(), config, StoreSigner(b"s"))  # type: ignore[arg-type]
    assert checked.next_rendezvous() == (store, 1, 2)
    assert caplog.messages == [
        f"node ranks not checked: unreadable claim {STATIC_RANK_KEY_PREFIX}0/1/1:"
        " Expecting value: line 1 column 1 (char 0)"
    ]


def test_a_peer_on_the_c10d_backend_is_named_at_once_with_both_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A c10d node hosts the store a static node of rank 1 reaches: the static node reads
    its roll-call entry, signed with the job's secret, and names the mismatch (before the
    claims of node ranks, which wait for the other nodes' claims)."""
    from torch.distributed import PrefixStore  # type: ignore[attr-defined]

    from torchx_elastic.agent.rendezvous.static_ranks import CheckedStaticRanks

    store, signer = HashStore(), StoreSigner(b"s")
    c10d = NodeEntry("h0", 7, "job", "h0", "2", 1, 0, "c10d")
    RollCall(store, c10d, signer)

    class Static:
        def next_rendezvous(self) -> Any:
            return (PrefixStore("job", store), 1, 2)

    argv = ["--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "h0:29500"]
    args = [*argv, "--rdzv-id", "job", "--node-rank", "1", "x.py"]
    config = config_from_args(build_parser().parse_args(args))
    claims_checked: list[object] = []
    monkeypatch.setattr(static_ranks, "check_claims", lambda *a, **k: claims_checked.append(a))
    with pytest.raises(RendezvousDiagnosis) as failed:
        CheckedStaticRanks(Static(), config, signer).next_rendezvous()  # type: ignore[arg-type]
    assert claims_checked == []  # named before the claims' wait for a peer
    me = NodeEntry.of_this_node(config).name
    assert str(failed.value).endswith(
        f"nodes disagree on --rdzv-backend: static on {me}, c10d on h0 (pid 7);"
        " start every node of run id 'job' with the same --rdzv-backend"
    ), str(failed.value)
    # the c10d node reads this node's entry in the same store
    entries, _ = RollCall(store, c10d, signer).entries()
    assert [e.rdzv_backend for e in entries] == ["c10d", "static", "c10d"]


class HostedStore:
    """A store whose host goes away ``linger_s`` after :meth:`leave`: every call then fails
    as torch's client does on a closed connection."""

    def __init__(self) -> None:
        self._store, self._gone_at = HashStore(), float("inf")

    def leave(self, linger_s: float) -> None:
        self._gone_at = time.monotonic() + linger_s

    def __getattr__(self, name: str) -> Any:
        if time.monotonic() >= self._gone_at:
            raise RuntimeError("Failed to recv, got 0 bytes. Connection was likely closed.")
        return getattr(self._store, name)


def test_a_c10d_peer_that_publishes_itself_during_the_claims_wait_is_named_then() -> None:
    """The c10d node that hosts the store publishes itself after the static node's first
    look, names the mismatch, lingers and takes its store away: the static node names it
    too while it waits for claims that never come, not a lost connection."""
    from torchx_elastic.agent.rendezvous.parameters import HOST_LINGER_S
    from torchx_elastic.agent.rendezvous.static_ranks import CheckedStaticRanks

    store, signer = HostedStore(), StoreSigner(b"s")

    class Static:
        def next_rendezvous(self) -> Any:
            return (store, 1, 2)

    argv = ["--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "h0:29500"]
    args = [*argv, "--rdzv-id", "job", "--node-rank", "1", "x.py"]
    config = config_from_args(build_parser().parse_args(args))
    checked = CheckedStaticRanks(Static(), config, signer)  # type: ignore[arg-type]

    def host_publishes_once_claimed() -> None:
        while not store.check([f"{STATIC_RANK_KEY_PREFIX}0/count"]):  # it waits from here
            time.sleep(0.01)
        RollCall(store, NodeEntry("h0", 7, "job", "h0", "2", 1, 0, "c10d"), signer)
        store.leave(HOST_LINGER_S)

    host = threading.Thread(target=host_publishes_once_claimed)
    host.start()
    with pytest.raises(RendezvousDiagnosis, match="nodes disagree on --rdzv-backend: static"):
        checked.next_rendezvous()
    host.join()


def test_node_rank_0_says_what_it_waits_for_while_the_store_blocks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--nnodes", "3", "--rdzv-backend", "static", "--rdzv-endpoint", "h0:29500"]
    config = config_from_args(build_parser().parse_args([*argv, "--rdzv-id", "job", "t.py"]))
    monkeypatch.setattr(static_ranks, "POLL_S", 0.01)
    interval = static_ranks.GrowingInterval
    monkeypatch.setattr(static_ranks, "GrowingInterval", lambda: interval(0.05, 0.05))
    line = static_ranks.host_waiting_line(config, "10:00:00")
    lines_said = threading.Semaphore(0)

    def line_said() -> str:
        lines_said.release()
        return line

    def blocks_until_said_twice() -> str:  # the store's wait, until the line came twice
        for _ in range(2):
            assert lines_said.acquire(timeout=60), "the waiting line was not said twice"
        return "info"

    assert static_ranks.said_while_waiting(blocks_until_said_twice, line_said) == "info"
    said = capsys.readouterr().err.splitlines()
    assert len(said) >= 2 and set(said) == {
        "torchx-elastic: waiting for nodes: this node (--node-rank 0) hosts the static"
        " rendezvous at h0:29500 and waits for the other 2 nodes (--node-rank 1 to 2) to"
        " connect; gives up at 10:00:00 (--rdzv-conf timeout=900)"
    }
    assert static_ranks.said_while_waiting(lambda: "at once", lambda: line) == "at once"
    assert capsys.readouterr().err == ""  # nothing said when nothing was waited for
    err = RuntimeError("Timed out after 901 seconds waiting for clients. 2/3 clients joined.")
    assert static_ranks.host_timed_out(config, err).line() == (
        "only 2 of 3 nodes connected to this node's static rendezvous within 900s; start the"
        " missing node(s) with --rdzv-backend static --rdzv-endpoint h0:29500 and their own"
        " --node-rank, or raise the limit with --rdzv-conf timeout=SECONDS"
    )
