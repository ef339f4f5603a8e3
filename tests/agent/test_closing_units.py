"""The agent that hosts the rendezvous store leaves last; the others never wait."""

from __future__ import annotations

import threading
import time

from torch.distributed import HashStore  # type: ignore[attr-defined]

from torchx_elastic.agent.compat import Round
from torchx_elastic.agent.rendezvous.closing import leave_last
from torchx_elastic.contract import LEFT_KEY

FOREVER_S = 3600.0  # a wait that only the other nodes' leaving ends
JOIN_S = 60.0  # a bound on a hang, not a speed


def _round(store: object, nodes: int) -> Round:
    return Round(store, 0, nodes, "h0", 1)  # type: ignore[arg-type]


def _in_thread(rnd: Round, hosts_store: bool, wait_s: float = FOREVER_S) -> threading.Thread:
    thread = threading.Thread(target=leave_last, args=(rnd, hosts_store, wait_s), daemon=True)
    thread.start()
    return thread


def test_the_host_waits_for_every_node_and_the_others_do_not() -> None:
    store = HashStore()
    rnd = _round(store, 3)
    host = _in_thread(rnd, hosts_store=True)
    peer = _in_thread(rnd, hosts_store=False)  # counts itself out, and leaves
    peer.join(JOIN_S)
    assert not peer.is_alive(), "a peer waited for the other nodes"
    assert int(store.add(LEFT_KEY, 0)) >= 1
    # a host that did not wait would end meanwhile (not a wait for an event: one that waits
    # is alive after it, however long it is)
    time.sleep(0.3)
    assert host.is_alive()  # one node is still using the store
    leave_last(rnd, hosts_store=False)
    host.join(JOIN_S)
    assert not host.is_alive(), "the host went on waiting after every node left"


def test_the_host_waits_a_bounded_time_for_a_node_that_never_leaves() -> None:
    started = time.monotonic()
    host = _in_thread(_round(HashStore(), 2), hosts_store=True, wait_s=0.3)
    host.join(JOIN_S)
    assert not host.is_alive(), "the host waited past its wait for a node that never left"
    assert time.monotonic() - started >= 0.3  # it did wait for it
    leave_last(None, hosts_store=True)  # never joined a round: nothing to do
