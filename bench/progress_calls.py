"""The progress benchmark's process: ``--calls`` calls in a tight loop, timed in the process.

``--kind progress``: ``torchx_elastic.worker.progress(step, calls)`` as a training script
calls it (the harness puts the agent's channel in the environment, so the calls are live,
not the no-op of a script started without the agent); ``--kind trivial``: a Python function
of the same arguments that does nothing (the floor of any call); ``--kind sendto``: one
``socket.sendto`` per call of a datagram of the same size, on the kind of socket the worker
uses (a non-blocking Unix datagram socket, to an abstract-namespace address): what every
call would cost without the worker's rate limit. Writes ``{"seconds", "calls", "dropped"}``
as JSON to ``--result-file``; the calls alone are timed (not the interpreter's start, the
imports or emptying the receiving socket).
"""

import argparse
import json
import os
import socket
import time
from collections.abc import Callable

from torchx_elastic.contract import RESTART_COUNT_ENV
from torchx_elastic.worker import progress, socket_address

KINDS = ("progress", "trivial", "sendto")
SEND_BATCH = 8  # datagrams sent before the receiving socket is emptied (it queues 10)


def trivial(step: int, total: int | None = None) -> None:
    """The floor: a call of progress()'s shape that does nothing."""


def timed_calls(call: Callable[[int, int], None], calls: int) -> float:
    started = time.perf_counter()
    for step in range(1, calls + 1):
        call(step, calls)
    return time.perf_counter() - started


def timed_sends(calls: int) -> tuple[float, int]:
    """``calls`` datagrams as large as progress()'s last one, each sent by one ``sendto``;
    (seconds, how many could not be sent).

    To a socket of this process's own, emptied between batches (untimed): a Unix datagram
    socket queues few datagrams (``net.unix.max_dgram_qlen``, 10 by default), and a send that
    fails on a full queue costs an exception more than one that succeeds.
    """
    payload = f"p {calls} {calls} {os.environ.get('LOCAL_RANK', '0')} "
    data = (payload + os.environ.get(RESTART_COUNT_ENV, "0")).encode()
    name = f"@torchx-elastic-bench-{os.getpid()}"
    seconds, dropped, left = 0.0, 0, calls
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender,
    ):
        receiver.bind(socket_address(name))
        receiver.setblocking(False)
        sender.setblocking(False)  # as the worker's
        address = socket_address(name)
        while left:
            batch = min(SEND_BATCH, left)
            started = time.perf_counter()
            for _ in range(batch):
                try:
                    sender.sendto(data, address)
                except OSError:
                    dropped += 1
            seconds += time.perf_counter() - started
            left -= batch
            for _ in range(batch):
                try:
                    receiver.recv(512)
                except BlockingIOError:
                    break
    return seconds, dropped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--result-file", required=True)
    args = parser.parse_args()
    dropped = 0
    if args.kind == "sendto":
        seconds, dropped = timed_sends(args.calls)
    else:
        seconds = timed_calls(progress if args.kind == "progress" else trivial, args.calls)
    result = {"seconds": seconds, "calls": args.calls, "dropped": dropped}
    with open(args.result_file, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main()
