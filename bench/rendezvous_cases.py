"""The misconfigured-rendezvous cases of docs/troubleshooting.md, torchrun beside the agent.

    python -m bench.rendezvous_cases [--seconds 25] [--case TEXT]

Each case runs ``torchrun`` and ``python -m torchx_elastic.agent`` with the same flags
(``--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d``, one host, a port of its own) for at
most ``--seconds``; the table gives, per launcher, when it first said something and the
last line it said (torch's C++ stack frames and the agent's authentication warning left
out), or that it was still silent.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torchx_elastic.contract import SECRET_ENV

BASE = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "j"]
NOISE = ("frame #", "Exception raised from", "<omitting python frames>", "NOT authenticated")
STATIC_3 = ["--rdzv-backend=static", "--nnodes=3"]  # after BASE's: the last flag counts
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "agent": [sys.executable, "-m", "torchx_elastic.agent"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Seen:
    first_s: float | None = None
    last: str = ""
    code: int | None = None


def watch(argv: list[str], cwd: Path, seconds: float) -> Seen:
    seen = Seen()
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None

    def read() -> None:
        for raw in proc.stdout:  # type: ignore[union-attr]
            line = raw.decode(errors="replace").strip()
            if not line or any(noise in line for noise in NOISE) or line.startswith("*"):
                continue
            if "OMP_NUM_THREADS" in line or line == "[torchx-elastic WARNING]":
                continue
            if seen.first_s is None:
                seen.first_s = time.monotonic() - started
            seen.last = line

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        seen.code = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(2)
    return seen


@dataclass
class Case:
    name: str
    # flags per launcher and node; the second node (if any) starts 1 s after the first
    nodes: Callable[[int], list[list[str]]]
    setup: Callable[[int], socket.socket | None] = lambda port: None


def occupy(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


CASES = [
    Case("the other node never starts", lambda p: [[f"--rdzv-endpoint=localhost:{p}"]]),
    Case(
        "the endpoint's host does not resolve",
        lambda p: [["--rdzv-endpoint=no-such-host.invalid:29511"]],
    ),
    Case(
        "nothing listens at the endpoint",
        lambda p: [[f"--rdzv-endpoint=127.0.0.1:{p}", "--rdzv-conf=is_host=false"]],
    ),
    Case(
        "node A --nnodes 2, node B --nnodes 3",
        lambda p: [
            [f"--rdzv-endpoint=localhost:{p}"],
            [f"--rdzv-endpoint=localhost:{p}", "--nnodes=3"],
        ],
    ),
    Case(
        "two jobs share an endpoint (run ids j and other)",
        lambda p: [
            [f"--rdzv-endpoint=localhost:{p}"],
            [f"--rdzv-endpoint=localhost:{p}", "--rdzv-id=other"],
        ],
    ),
    Case(
        "another program holds the port on the rendezvous host",
        lambda p: [[f"--rdzv-endpoint=127.0.0.1:{p}"]],
        setup=occupy,
    ),
    Case(
        "node A --rdzv-backend c10d, node B static --node-rank 1",
        lambda p: [
            [f"--rdzv-endpoint=localhost:{p}"],
            [f"--rdzv-endpoint=localhost:{p}", "--rdzv-backend=static", "--node-rank=1"],
        ],
    ),
    Case(
        "static, --node-rank 0, --rdzv-conf timeout=15, the other node never starts",
        lambda p: [
            [
                f"--rdzv-endpoint=localhost:{p}",
                "--rdzv-backend=static",
                "--node-rank=0",
                "--rdzv-conf=timeout=15",
            ]
        ],
    ),
    Case(
        "static, --nnodes 3, nodes given --node-rank 0, 1, 1",
        lambda p: [
            [f"--rdzv-endpoint=localhost:{p}", *STATIC_3, f"--node-rank={rank}"]
            for rank in (0, 1, 1)
        ],
    ),
]


def run_case(case: Case, launcher: list[str], cwd: Path, seconds: float) -> list[Seen]:
    port = free_port()
    held = case.setup(port)
    results: list[Seen] = []
    threads = []
    try:
        for i, flags in enumerate(case.nodes(port)):
            argv = [*launcher, *BASE, *flags, "ok.py"]
            seen = Seen()
            results.append(seen)

            def go(argv: list[str] = argv, seen: Seen = seen) -> None:
                found = watch(argv, cwd, seconds)
                seen.first_s, seen.last, seen.code = found.first_s, found.last, found.code

            threads.append(threading.Thread(target=go))
            threads[-1].start()
            if i == 0:
                time.sleep(1)
        for thread in threads:
            thread.join()
    finally:
        if held is not None:
            held.close()
    return results


def cell(seen: Seen, seconds: float) -> str:
    if seen.first_s is None:
        return f"silent for {seconds:g} s"
    last = seen.last if len(seen.last) <= 220 else seen.last[:217] + "..."
    end = f"exit {seen.code}" if seen.code is not None else f"still running at {seconds:g} s"
    return f"first line at {seen.first_s:.1f} s; {end}; last: `{last.replace('|', '/')}`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--case", default="", help="only the cases whose name has this text")
    args = parser.parse_args()
    os.environ[SECRET_ENV] = "table"  # the same for every agent node
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "ok.py").write_text("print('trained')\n")
        print("| case | node | torchrun | agent |\n|---|---|---|---|")
        for case in (c for c in CASES if args.case in c.name):
            found = {
                name: run_case(case, argv, cwd, args.seconds) for name, argv in LAUNCHERS.items()
            }
            for node in range(len(found["agent"])):
                name = "ABC"[node] if len(found["agent"]) > 1 else "-"
                torchrun = cell(found["torchrun"][node], args.seconds)
                agent = cell(found["agent"][node], args.seconds)
                print(f"| {case.name} | {name} | {torchrun} | {agent} |", flush=True)


if __name__ == "__main__":
    main()
