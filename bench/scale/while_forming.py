"""What nodes that wait in a forming round read of a state that others keep changing.

``python -m bench.scale.while_forming [--state-nodes 1000] [--waiting 8] [--changes 10]
[--seconds 15] [--agent-commit C]``: one real store and a rendezvous state of
``--state-nodes`` nodes that no process runs (written as the agent writes it: signed, its
counter bumped), which ``--waiting`` simulated nodes of our agent join (as ``python -m
bench.scale`` builds them, in this one process); the round never completes (its minimum is
more nodes than there are). A writer then swaps one of the state's nodes for another
``--changes`` times a second (nodes coming and going while a round forms: the state's size
stays) and for ``--seconds`` the waiting nodes' store calls are counted. Prints one JSON line:
the state's size (pickled, and as stored: signed, in base64) and the bytes of it the waiting
nodes read, a second per node. A state of
N nodes without N processes: the reads of a 4,000-node round on two CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from bench.scale.agent_tree import agent_source, agent_tree
from bench.scale.before_join import until_in_state
from bench.scale.coordinator import REPO, StoreServer, clean_env
from bench.scale.impls import Job, ours_config
from bench.scale.nodes import build_nodes

# no verdicts on the nodes no process runs: their heartbeats are never written
CONF = {"keep_alive_max_attempt": "100000"}


def measure(state_nodes: int, waiting: int, changes: float, seconds: float) -> dict[str, Any]:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from torchx_elastic.agent.rendezvous.handler import state_backend
    from torchx_elastic.agent.rendezvous.signed_store import StoreSigner

    env = clean_env("ours")
    os.environ.update(env)
    server = StoreServer(env)
    most = state_nodes + waiting + 1  # never reached: the round waits
    job = Job("127.0.0.1", server.port, "while-forming", most, most, CONF, 0.1, False, 0.0)
    client = TCPStore(job.host, job.port, is_master=False, timeout=timedelta(seconds=60))
    signer = StoreSigner(ours_config(job).job_secret)  # as the nodes sign it
    writer = _Writer(state_backend(client, job.run_id, signer, True), state_nodes)
    built = build_nodes(job, "ours", 0, waiting)
    for node in built:
        threading.Thread(target=node.join, daemon=True).start()
    until_in_state(built[0], state_nodes + waiting)
    stop = threading.Event()
    threading.Thread(target=writer.run, args=(changes, stop), daemon=True).start()
    time.sleep(2.0)  # every waiting node past its first read of a changing state
    for node in built:
        node.store.reset()
    time.sleep(seconds)
    counted = [node.store.reset() for node in built]
    stop.set()
    per_node_s = waiting * seconds
    state_read = sum(c.purpose_bytes["state"] for c in counted) / per_node_s
    stored = len(client.get(job.state_key))  # as read: torch's backend stores it in base64
    return {
        "state_nodes": state_nodes,
        "waiting": waiting,
        "changes_per_s": writer.written / max(seconds + 2.0, 1e-3),
        "seconds": seconds,
        "state_bytes": writer.size,
        "stored_bytes": stored,
        "state_bytes_per_s_per_node": state_read,
        "state_reads_per_s_per_node": state_read / max(stored, 1),
        "agent": agent_source(REPO),  # with --agent-commit, REPO is that commit's tree
    }


class _Writer:
    """The state's nodes that no process runs, written first; then one swapped for another
    at a time (torch's state holder, as the agent's nodes write it)."""

    def __init__(self, backend: Any, count: int) -> None:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

        from torchx_elastic.agent.rendezvous.liveness import TORCH_KEEP_ALIVE_OFF_S

        self._dr = dr
        settings = dr.RendezvousSettings(
            "while-forming",
            1,
            count + 1,
            dr.RendezvousTimeout(),
            timedelta(seconds=TORCH_KEEP_ALIVE_OFF_S),
            1,
        )
        self._holder = dr._BackendRendezvousStateHolder(backend, settings, 0)
        self._next = 0
        self.written = 0
        self.size = 0
        state = dr._RendezvousState()
        for _ in range(count):
            self._add(state)
        result = backend.set_state(pickle.dumps(state))
        if not result or not result[2]:
            raise SystemExit("the state could not be written first")

    def _add(self, state: Any) -> None:
        node = self._dr._NodeDesc(f"zz-not-run-{self._next:06d}", 1, 0)  # sorted after ours
        self._next += 1
        state.participants[node] = 0
        state.last_heartbeats[node] = datetime.now(timezone.utc)

    def run(self, changes: float, stop: threading.Event) -> None:
        while not stop.wait(1.0 / changes):
            while True:
                self._holder.sync()
                state = self._holder.state
                gone = min(n for n in state.participants if n.addr.startswith("zz-"))
                del state.participants[gone], state.last_heartbeats[gone]
                self._add(state)
                self._holder.mark_dirty()
                if self._holder.sync():
                    break
            self.written += 1
            self.size = len(pickle.dumps(self._holder.state))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.while_forming")
    parser.add_argument("--state-nodes", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=8)
    parser.add_argument("--changes", type=float, default=10.0, help="state changes a second")
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
