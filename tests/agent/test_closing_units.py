"""The agent that hosts the rendezvous store leaves last; the others never wait."""

from __future__ import annotations

import threading
import time

from torch.distributed import HashStore  # type: ignore[attr-defined]

from torchx_elastic.agent.compat import Round
from torchx_elastic.agent.rendezvous.closing import leave_last


def _round(store: object, nodes: int) -> Round:
    return Round(store, 0, nodes, "h0", 1)  # type: ignore[arg-type]


def test_the_host_waits_for_every_node_and_the_others_do_not() -> None:
    rnd = _round(HashStore(), 3)
    host = threading.Thread(target=leave_last, args=(rnd, True, 30))
    host.start()
    started = time.monotonic()
    leave_last(rnd, hosts_store=False)  # a peer: counts itself out, at once
    assert time.monotonic() - started < 1
    time.sleep(0.3)
    assert host.is_alive()  # one node is still using the store
    leave_last(rnd, hosts_store=False)
    host.join(5)
    assert not host.is_alive()


def test_the_host_waits_a_bounded_time_for_a_node_that_never_leaves() -> None:
    started = time.monotonic()
    leave_last(_round(HashStore(), 2), hosts_store=True, wait_s=0.3)
    assert 0.3 <= time.monotonic() - started < 2
    leave_last(None, hosts_store=True)  # never joined a round: nothing to do
