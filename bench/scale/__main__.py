"""``python -m bench.scale``: see :mod:`bench.scale`."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.scale.agent_tree import agent_source, agent_tree
from bench.scale.coordinator import REPO, HarnessError, Options, run
from bench.scale.impls import IMPLS
from bench.scale.summary import render_table, summarize

DEFAULT_OUTPUT = REPO / "bench" / "results" / "scale.json"


def _conf(text: str) -> dict[str, str]:
    """``key=value,key=value`` (as ``--rdzv-conf``)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value,key=value")
    return {key.strip(): value.strip() for key, value in pairs}


def _ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="The c10d rendezvous of N simulated nodes on one real TCPStore: torch's"
        " handler and ours, every store call counted.",
    )
    parser.add_argument("--nodes", type=_ints, default=[16, 64], help="node counts (16,64)")
    parser.add_argument(
        "--impl", default="torch,ours", help=f"comma-separated, of {','.join(IMPLS)}"
    )
    parser.add_argument("--window", type=float, default=30.0, help="steady-state seconds (30)")
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds from the round formed to the window (default: 2 keep-alive intervals + 1)",
    )
    parser.add_argument(
        "--procs", type=int, default=0, help="harness processes (0: a CPU each, 16+ nodes each)"
    )
    parser.add_argument(
        "--monitor-interval",
        type=float,
        default=0.1,
        help="seconds between an agent's checks (0.1: torchrun's and ours' default; 1.0 makes"
        " the same store calls with far less of the harness's CPU, docs/bench.md)",
    )
    parser.add_argument(
        "--torch-conf", type=_conf, default={}, help="rendezvous config of torch's nodes"
    )
    parser.add_argument(
        "--ours-conf", type=_conf, default={}, help="--rdzv-conf of our agent's nodes"
    )
    parser.add_argument(
        "--join-spread",
        type=float,
        default=0.0,
        help="seconds over which the nodes' first joins are spread (0: all at once)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=0.005,
        help="each harness process's sys.setswitchinterval (0.005: Python's); a thread waiting"
        " for the interpreter lock wakes up once an interval",
    )
    parser.add_argument("--min-nodes", type=int, default=None, help="default: nodes - 1")
    parser.add_argument(
        "--no-progress", action="store_true", help="ours: without the progress exchange"
    )
    parser.add_argument("--no-loss", action="store_true", help="skip the lost-node phase")
    parser.add_argument("--setup-timeout", type=float, default=600.0)
    parser.add_argument("--form-timeout", type=float, default=300.0)
    parser.add_argument("--reform-timeout", type=float, default=180.0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the JSON document")
    parser.add_argument("--log-dir", type=Path, default=None, help="the processes' stderr")
    parser.add_argument(
        "--agent-commit",
        default=None,
        help="simulate the agent of this commit (its torchx_elastic beside this harness, in"
        " bench/results/agent-<commit>/), not the working tree's",
    )
    return parser


def machine_facts() -> dict[str, Any]:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "nice": os.nice(0),
        "load_avg_1m": os.getloadavg()[0],
    }


def options_for(args: argparse.Namespace, impl: str, nodes: int, root: Path) -> Options:
    return Options(
        root=root,
        impl=impl,
        nodes=nodes,
        window_s=args.window,
        settle_s=args.settle,
        procs=args.procs,
        monitor_interval_s=args.monitor_interval,
        conf=args.torch_conf if impl == "torch" else args.ours_conf,
        min_nodes=args.min_nodes,
        progress=not args.no_progress,
        loss=not args.no_loss,
        setup_timeout_s=args.setup_timeout,
        form_timeout_s=args.form_timeout,
        reform_timeout_s=args.reform_timeout,
        log_dir=args.log_dir,
        join_spread_s=args.join_spread,
        switch_interval_s=args.switch_interval,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    impls = [name.strip() for name in args.impl.split(",") if name.strip()]
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown or not impls or not args.nodes or min(args.nodes) < 2:
        raise SystemExit(
            f"bench.scale: --impl {args.impl} --nodes {args.nodes}: choose implementations of"
            f" {', '.join(IMPLS)} and node counts of 2 or more (e.g. --nodes 16,64)"
        )
    words = argv if argv is not None else sys.argv[1:]
    root = agent_tree(REPO, args.agent_commit) if args.agent_commit else REPO
    document: dict[str, Any] = {
        "command": " ".join(["python -m bench.scale", *words]),
        "started_unix_s": time.time(),
        "machine": machine_facts(),
        "agent_source": agent_source(root),
        "records": [],
    }
    failed = 0
    for nodes in args.nodes:
        for impl in impls:
            print(f"bench.scale: {impl} x {nodes} ...", file=sys.stderr, flush=True)
            try:
                record = summarize(run(options_for(args, impl, nodes, root)))
            except HarnessError as err:
                record = {"impl": impl, "nodes": nodes, "harness_error": str(err)}
                print(f"bench.scale: {impl} x {nodes}: {err}", file=sys.stderr, flush=True)
                failed += 1
            document["records"].append(record)
            document["table_markdown"] = render_table(
                [r for r in document["records"] if "harness_error" not in r]
            )
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(document, indent=1) + "\n")
    document["machine"]["load_avg_1m_after"] = os.getloadavg()[0]
    args.output.write_text(json.dumps(document, indent=1) + "\n")
    print(document.get("table_markdown", ""))
    print(f"\nJSON: {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
