"""The job's secret, signed store entries and the signed rendezvous state (no network)."""

from __future__ import annotations

import base64
import logging
import pickle
from pathlib import Path

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from torchx_elastic.agent.console.store_entry import RefusedEntry
from torchx_elastic.agent.rendezvous import job_secret
from torchx_elastic.agent.rendezvous.signed_backend import SignedRendezvousBackend
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.contract import FAILURE_KEY_PREFIX, SECRET_ENV, SECRET_FILE_ENV
from torchx_elastic.contract.job_secret import read_secret

KEY = "torch.rendezvous.job"


def _backends(
    secret: bytes = b"s",
) -> tuple[HashStore, SignedRendezvousBackend, SignedRendezvousBackend]:
    store = HashStore()
    make = lambda: SignedRendezvousBackend(  # noqa: E731
        C10dRendezvousBackend(store, "job"), StoreSigner(secret), "job"
    )
    return store, make(), make()


def test_a_signed_state_goes_from_node_to_node() -> None:
    _, a, b = _backends()
    assert a.get_state() is None
    state, token, has_set = a.set_state(b"state 1")  # type: ignore[misc]
    assert (state, has_set) == (b"state 1", True)
    assert b.get_state()[0] == b"state 1"  # type: ignore[index]
    assert b.set_state(b"state 2", b.get_state()[1])[2] is True  # type: ignore[index]
    assert a.get_state()[0] == b"state 2"  # type: ignore[index]


def test_a_forged_state_is_refused_once_and_replaced_by_the_next_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, a, b = _backends()
    a.set_state(b"genuine")
    b.get_state()
    forged = base64.b64encode(pickle.dumps({"anything": 1}))
    store.set(KEY, forged)
    with caplog.at_level(logging.WARNING):
        state, token = b.get_state()  # type: ignore[misc]
        assert b.get_state()[0] == b"genuine"  # type: ignore[index]
    assert state == b"genuine"  # the last verified state, never the forged one
    refused = [r.getMessage() for r in caplog.records]
    assert refused == [
        f"refused the rendezvous state '{KEY}' from the rendezvous store: '{KEY}' is not signed"
        " (written by a process outside the job, or by a node given another secret); it is"
        " ignored and the job goes on"
    ]
    assert b.set_state(b"next", token)[2] is True  # type: ignore[index]
    assert a.get_state()[0] == b"next"  # type: ignore[index]


def test_a_refused_state_is_repaired_with_the_last_verified_one_where_it_is_found() -> None:
    store, a, b = _backends()
    assert b.repair() is False  # no state yet: nothing verified, nothing written
    a.set_state(b"genuine")
    genuine = store.get(KEY)
    assert b.repair() is False and store.get(KEY) == genuine  # it verifies: not written
    forged = base64.b64encode(pickle.dumps({"anything": 1}))
    store.set(KEY, forged)
    assert b.repair() is True
    assert store.get(KEY) != forged
    assert a.get_state()[0] == b"genuine"  # type: ignore[index]  # verified, not refused
    assert a.repair() is False
    stranger = _backends()[1]  # a node that verified no state of this store
    store.set(KEY, forged)
    assert stranger.repair() is False and store.get(KEY) == forged


def test_another_secret_an_emptied_and_a_replayed_state_are_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, a, b = _backends()
    a.set_state(b"one")
    old = store.get(KEY)
    a.set_state(b"two", a.get_state()[1])  # type: ignore[index]
    assert b.get_state()[0] == b"two"  # type: ignore[index]
    outsider = SignedRendezvousBackend(
        C10dRendezvousBackend(store, "job"), StoreSigner(b"x"), "job"
    )
    with caplog.at_level(logging.WARNING):
        outsider.set_state(b"evil", b.get_state()[1])  # type: ignore[index]
        assert b.get_state()[0] == b"two"  # type: ignore[index]
        store.set(KEY, old)  # a genuine but older state
        assert b.get_state()[0] == b"two"  # type: ignore[index]
        store.set(KEY, "Y2FuaW1hZGFt")  # torch's "no state" sentinel
        assert b.get_state()[0] == b"two"  # type: ignore[index]
    reasons = [r.getMessage().split(": ", 1)[1].split(" (written")[0] for r in caplog.records]
    assert reasons == [
        f"'{KEY}' has a wrong signature",
        "an older state (#1, newest #2)",
        "it was emptied",
    ]


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
