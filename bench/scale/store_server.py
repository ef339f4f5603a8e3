"""The rendezvous store, in a process of its own: ``python -m bench.scale.store_server``.

The store the agent hosts (``listen.hosted_store``: torch's ``TCPStore`` server, libuv,
listening on ``127.0.0.1`` only). Prints ``{"port": ..., "libuv": ...}`` and serves until
its stdin closes; the coordinator reads its CPU time from ``/proc``.
"""

from __future__ import annotations

import json
import resource
import sys


def main() -> None:
    from torchx_elastic.agent.rendezvous import listen

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per node
    store = listen.hosted_store(listen.LOOPBACK, 0, 60.0, multi_tenant=True)
    libuv = bool(getattr(store, "libuvBackend", False))
    print(json.dumps({"port": store.port, "libuv": libuv, "fd_limit": hard}), flush=True)
    sys.stdin.read()  # until the coordinator closes it


if __name__ == "__main__":
    main()
