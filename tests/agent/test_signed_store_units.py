"""The job's secret, signed store entries and the signed rendezvous state (no network)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous import job_secret
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.contract import FAILURE_KEY_PREFIX, SECRET_ENV, SECRET_FILE_ENV
from torchx_elastic.contract.job_secret import read_secret

KEY = "torch.rendezvous.job"


def test_signed_store_entries_and_what_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    store = HashStore()
    ours, theirs = SignedStore(store, StoreSigner(b"s")), SignedStore(store, StoreSigner(b"t"))
    ours.set("k", "value")
    assert ours.get("k") == b"value"
    with pytest.raises(RefusedEntry, match="'k' has a wrong signature"):
        theirs.get("k")
    store.set("k", "plain")
    with caplog.at_level(logging.WARNING):
        assert ours.read("k", "the thing") is None
        assert ours.read("k", "the thing") is None
    assert [r.getMessage() for r in caplog.records] == [
        "refused the thing from the rendezvous store: 'k' is not signed (written by a process"
        " outside the job, or by a node given another secret); it is ignored and the job goes on"
    ]
    unauthenticated = SignedStore(store, StoreSigner(None))
    unauthenticated.set("u", "as is")
    assert store.get("u") == b"as is" and unauthenticated.get("u") == b"as is"


def test_the_secret_from_the_environment_or_a_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert read_secret({SECRET_ENV: " abc\n"}) == b"abc"
    path = tmp_path / "secret"
    path.write_text("from file\n")
    assert read_secret({SECRET_FILE_ENV: str(path)}) == b"from file"
    assert read_secret({}) is None
    with pytest.raises(
        ValueError, match=r"TORCHX_ELASTIC_RDZV_SECRET_FILE=.*/missing: cannot read"
    ):
        read_secret({SECRET_FILE_ENV: str(tmp_path / "missing")})
    path.write_text("\n")
    with pytest.raises(ValueError, match="the file is empty; write the secret in it"):
        read_secret({SECRET_FILE_ENV: str(path)})
    with caplog.at_level(logging.WARNING):
        assert job_secret.job_secret(b"given", 2) == b"given"
        assert len(job_secret.job_secret(None, 1) or b"") == 32  # a single node makes its own
        assert caplog.records == []
        assert job_secret.job_secret(None, 2) is None  # two nodes, or one node and a spare
    assert [r.getMessage() for r in caplog.records] == [job_secret.UNAUTHENTICATED_WARNING]
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(
            "this multi-node rendezvous is NOT authenticated: any process that reaches the store"
            " port can join the job and run code in its agents"
        )
    )


def test_a_node_without_the_secret_is_told_why_it_cannot_read_the_state() -> None:
    from torch.distributed.elastic.rendezvous import RendezvousStateError

    from torchx_elastic.agent.rendezvous.handler import describe_error

    try:
        try:
            pickle.loads(b"txe1 not a pickle")
        except pickle.UnpicklingError as inner:
            raise RendezvousStateError(
                "The rendezvous state is corrupt. See inner exception for details."
            ) from inner
    except RendezvousStateError as err:
        text = describe_error(err)
    assert text.startswith("The rendezvous state is corrupt: ")
    assert text.endswith(
        " (the other nodes sign it with the job's secret: give this node the same one in"
        " TORCHX_ELASTIC_RDZV_SECRET or TORCHX_ELASTIC_RDZV_SECRET_FILE, docs/security.md)"
    )


def test_the_jobs_first_failure_is_agreed_on_signed_entries_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torchx_elastic.agent.console.failure.first_failure import FirstFailure, agree

    store = HashStore()
    node0, node1 = (SignedStore(store, StoreSigner(b"s")) for _ in range(2))
    first, second = FirstFailure(3, 1, "exit code 1"), FirstFailure(0, 0, "exit code 2")
    assert agree(node0, 0, first) == first
    assert agree(node1, 0, second) == first  # the first offer wins, read back verified
    forged = FirstFailure(9, 9, "forged").to_json()
    store.set(f"{FAILURE_KEY_PREFIX}1", forged)  # an outsider, first
    with caplog.at_level(logging.WARNING):
        assert agree(node0, 1, second) == second  # what this node knows
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped the job's first failure from the store: '{FAILURE_KEY_PREFIX}1' is not signed"
    ]


def test_many_entries_are_read_in_one_call_and_a_forged_one_does_not_hide_the_others() -> None:
    store = HashStore()
    signed = SignedStore(store, StoreSigner(b"s"))
    signed.set("a", "1")
    store.set("b", b"forged")
    signed.set("c", "3")
    a, b, c = signed.multi_get(["a", "b", "c"])
    assert (a, c) == (b"1", b"3")
    assert isinstance(b, RefusedEntry) and str(b) == "'b' is not signed"
    unsigned = SignedStore(store, StoreSigner(None))  # an unauthenticated job: as stored
    assert unsigned.multi_get(["b"]) == [b"forged"]
