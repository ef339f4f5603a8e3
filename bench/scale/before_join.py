"""What nodes that have not joined yet read of the rendezvous state.

``python -m bench.scale.before_join [--nodes 64] [--joined 8] [--seconds 12]
[--agent-commit C]``: one real store, ``--nodes`` simulated nodes of our agent (as
``python -m bench.scale`` builds them, in this one process); ``--joined`` of them start
their first round (which waits: the job's minimum is all but one node), and for
``--seconds`` the others' store calls are counted, as before their own first round (a job
whose nodes start over a minute: most of them for most of it). Prints one JSON line: the
state's calls and the bytes of its reads by those nodes, a second per node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from bench.scale.agent_tree import agent_source, agent_tree
from bench.scale.coordinator import REPO, StoreServer, clean_env
from bench.scale.impls import Job
from bench.scale.nodes import build_nodes

JOINED_TIMEOUT_S = 60.0  # for the joined nodes to be in the state, at most


def measure(nodes: int, joined: int, seconds: float) -> dict[str, Any]:
    env = clean_env("ours")
    os.environ.update(env)
    server = StoreServer(env)
    job = Job("127.0.0.1", server.port, "before-join", nodes, nodes - 1, {}, 0.1, False, 0.0)
    built = build_nodes(job, "ours", 0, nodes)
    for node in built[:joined]:
        threading.Thread(target=node.join, daemon=True).start()
    until_in_state(built[0], joined)
    waiting = built[joined:]
    for node in waiting:
        node.store.reset()
    time.sleep(seconds)
    counted = [node.store.reset() for node in waiting]
    reads = [c.kinds["get"] for c in counted if "get" in c.kinds]
    per_node_s = len(waiting) * seconds
    return {
        "nodes": nodes,
        "joined": joined,
        "seconds": seconds,
        "state_calls_per_node_s": sum(c.purposes.get("state", 0) for c in counted) / per_node_s,
        "get_calls_per_node_s": sum(r.calls for r in reads) / per_node_s,
        "get_bytes_per_node_s": sum(r.bytes_in for r in reads) / per_node_s,
        "agent": agent_source(REPO),  # with --agent-commit, REPO is that commit's tree
    }


def until_in_state(node: Any, count: int) -> None:
    """Until ``node``'s handler has read a state of ``count`` nodes (the counting starts
    on a state that holds them all)."""
    from torchx_elastic.agent.rendezvous import membership

    deadline = time.monotonic() + JOINED_TIMEOUT_S
    while len(membership.state_node_ids(node.handler)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"a state of {count} nodes was not read in time")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.before_join")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--joined", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--agent-commit", default=None, help="the agent of this commit")
    args = parser.parse_args(argv)
    if not 0 < args.joined < args.nodes:
        raise SystemExit(f"--joined {args.joined}: from 1 to --nodes - 1 ({args.nodes - 1})")
    if args.agent_commit:  # run again with that commit's package first on the path
        tree = agent_tree(REPO, args.agent_commit)
        command = [sys.executable, "-m", "bench.scale.before_join"]
        command += ["--nodes", str(args.nodes), "--joined", str(args.joined)]
        command += ["--seconds", str(args.seconds)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        return subprocess.run(command, cwd=tree, env=env, check=False).returncode
    print(json.dumps(measure(args.nodes, args.joined, args.seconds)), flush=True)
    os._exit(0)  # the nodes' threads end with the process


if __name__ == "__main__":
    sys.exit(main())
