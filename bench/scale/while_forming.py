"""What nodes that wait in a forming round read of a round that others keep joining.

``python -m bench.scale.while_forming [--state-nodes 1000] [--waiting 8] [--changes 10]
[--seconds 15] [--agent-commit C]``: one real store and a first round of the agent's own
rendezvous (rounds/handler.py) that ``--state-nodes`` nodes no process runs have joined
(their arrival slots written as the agent writes them: signed, the round's count bumped),
which ``--waiting`` simulated nodes of our agent join (as ``python -m bench.scale`` builds
them, in this one process); the round never completes (its minimum is more nodes than
there are). A writer then adds one more arrival ``--changes`` times a second (nodes
coming while a round forms) and for ``--seconds`` the waiting nodes' store calls are
counted. Prints one JSON line: the round's arrivals (their nodes as written, and as stored:
signed) and the bytes of the rendezvous' keys the waiting nodes read, a second per node.
A round of N nodes without N processes: the reads of a 4,000-node round on two CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from bench.scale.agent_tree import agent_source, agent_tree
from bench.scale.before_join import until_in_state
from bench.scale.coordinator import REPO, StoreServer, clean_env
from bench.scale.impls import Job, ours_config
from bench.scale.nodes import build_nodes

# no verdicts on the nodes no process runs: their heartbeats are never written
CONF = {"keep_alive_max_attempt": "100000"}
NOT_RUN_PREFIX = "zz-not-run-"  # their addresses: sorted after the simulated nodes' ids


def measure(state_nodes: int, waiting: int, changes: float, seconds: float) -> dict[str, Any]:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner

    env = clean_env("ours")
    os.environ.update(env)
    server = StoreServer(env)
    most = state_nodes + waiting + 1  # never reached: the round waits
    job = Job("127.0.0.1", server.port, "while-forming", most, most, CONF, 0.1, False, 0.0)
    client = TCPStore(job.host, job.port, is_master=False, timeout=timedelta(seconds=60))
    signer = StoreSigner(ours_config(job).job_secret)  # as the nodes sign it
    writer = _Writer(SignedStore(client, signer), job.run_id, state_nodes)
    built = build_nodes(job, "ours", 0, waiting)
    for node in built:
        threading.Thread(target=node.join, daemon=True).start()
    until_in_state(built[0], state_nodes + waiting)
    stop = threading.Event()
    threading.Thread(target=writer.run, args=(changes, stop), daemon=True).start()
    time.sleep(2.0)  # every waiting node past its first read of a changing round
    for node in built:
        node.store.reset()
    time.sleep(seconds)
    counted = [node.store.reset() for node in built]
    stop.set()
    per_node_s = waiting * seconds
    state_read = sum(c.purpose_bytes["state"] for c in counted) / per_node_s
    stored = writer.stored_bytes(client)
    return {
        "state_nodes": state_nodes,
        "waiting": waiting,
        "changes_per_s": writer.written / max(seconds + 2.0, 1e-3),
        "seconds": seconds,
        "state_bytes": writer.size,
        "stored_bytes": stored,
        "state_calls_per_s_per_node": sum(c.purposes["state"] for c in counted) / per_node_s,
        "state_bytes_per_s_per_node": state_read,
        "state_reads_per_s_per_node": state_read / max(stored, 1),
        "agent": agent_source(REPO),  # with --agent-commit, REPO is that commit's tree
    }


class _Writer:
    """The round's arrivals that no process runs, written first (one ``add`` of the round's
    count for them all, then their slots: as each node's join writes its own); then one
    more arrival at a time."""

    def __init__(self, signed: Any, run_id: str, count: int) -> None:
        from torchx_elastic.agent.rendezvous.rounds.keys import Keys, Node

        self._signed = signed
        self._keys = Keys(run_id)
        self._node = Node
        self._next = 0
        self.written = 0
        self.size = 0  # the arrivals' nodes, as written (unsigned)
        self.slots = 0
        first = int(signed.add(self._keys.count(0), count)) - count
        if first != 0:
            raise SystemExit("the round's arrivals could not be written first")
        keys = [self._keys.slot(0, slot) for slot in range(count)]
        values = [self._encoded() for _ in range(count)]
        signed.multi_set(keys, values)
        self.slots = count

    def _encoded(self) -> str:
        node = self._node(f"{NOT_RUN_PREFIX}{self._next:06d}", 1, 0)
        self._next += 1
        text = node.encode()
        self.size += len(text.encode())
        return text

    def run(self, changes: float, stop: threading.Event) -> None:
        while not stop.wait(1.0 / changes):
            slot = int(self._signed.add(self._keys.count(0), 1)) - 1
            self._signed.set(self._keys.slot(0, slot), self._encoded())
            self.slots = max(self.slots, slot + 1)
            self.written += 1

    def stored_bytes(self, client: Any) -> int:
        """The round's arrival slots as stored (signed), all of them."""
        keys = [self._keys.slot(0, slot) for slot in range(int(client.add(self._keys.count(0), 0)))]
        return sum(len(value) for value in client.multi_get(keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.while_forming")
    parser.add_argument("--state-nodes", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=8)
    parser.add_argument("--changes", type=float, default=10.0, help="arrivals a second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--agent-commit", default=None, help="the agent of this commit")
    args = parser.parse_args(argv)
    if args.state_nodes < 1 or args.waiting < 1 or args.changes <= 0:
        raise SystemExit("--state-nodes and --waiting: 1 or more; --changes: more than 0")
    if args.agent_commit:  # run again with that commit's package first on the path
        tree = agent_tree(REPO, args.agent_commit)
        command = [sys.executable, "-m", "bench.scale.while_forming"]
        for flag in ("state_nodes", "waiting", "changes", "seconds"):
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        return subprocess.run(command, cwd=tree, env=env, check=False).returncode
    print(json.dumps(measure(args.state_nodes, args.waiting, args.changes, args.seconds)))
    sys.stdout.flush()
    os._exit(0)  # the nodes' threads end with the process


if __name__ == "__main__":
    sys.exit(main())
