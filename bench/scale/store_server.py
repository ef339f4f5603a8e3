"""The rendezvous store, in a process of its own: ``python -m bench.scale.store_server``.

The store the agent hosts (``listen.hosted_store``: torch's ``TCPStore`` server listening
on ``127.0.0.1`` only). Where this torch's libuv server cannot take the agent's listening
socket (its older server then runs instead), a libuv server of its own listening on every
interface (as torchrun's): ``listens`` says which. Prints ``{"port": ..., "libuv": ...}``
and serves until its stdin closes; the coordinator reads its CPU time from ``/proc``.
"""

from __future__ import annotations

import json
import resource
import sys


def main() -> None:
    from torch.distributed import TCPStore

    from torchx_elastic.agent.rendezvous import listen

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per node
    store = listen.hosted_store(listen.LOOPBACK, 0, 60.0, multi_tenant=True)
    listens = listen.LOOPBACK
    if not getattr(store, "libuvBackend", False):
        del store
        store = TCPStore(listen.LOOPBACK, 0, is_master=True, use_libuv=True, multi_tenant=True)
        listens = "every interface"
    facts = {
        "port": store.port,
        "libuv": bool(getattr(store, "libuvBackend", False)),
        "listens": listens,
        "fd_limit": hard,
    }
    print(json.dumps(facts), flush=True)
    sys.stdin.read()  # until the coordinator closes it


if __name__ == "__main__":
    main()
