"""The loss matrix's ``torchx run`` cells (issue 60): ``torchx run -s local_cwd dist.ddp -j 2x1
--spares 1`` with torchx's default ``--max_retries 0``, on this machine; one agent SIGKILLed
with its worker mid-training: the one that hosts the store (``host``: whichever agent bound
the port first) or the other training one (``trainer``). The value, as in
``bench/loss_matrix.py``: seconds from the kill to the first step of world 2 after it, counted
once world 2 reached step ``STEPS_AFTER``; with the loss matrix's two loops (``progress``: a
script that reports progress every step, ``plain``: one that does not).

``python -m bench.loss_torchx [--repeats N] [--output bench/results/loss_torchx.json]``
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.loss_matrix import (
    BOUND_S,
    PLAIN_LOOP,
    PROGRESS_LOOP,
    REPO,
    SETUP_S,
    STANDING_BY,
    STEP_S,
    STEPS,
    STEPS_AFTER,
    STEPS_BEFORE,
    back_after,
    last_agent_line,
    last_step,
    median,
)

ROLES = ("trainer", "host")
SCRIPTS = ("progress", "plain")
# torchx's line of the replica that stands by: "ROLE/REPLICA torchx-elastic: standing by: ..."
SPARE_LINE = re.compile(r"^[\w-]+/(\d+) .*" + re.escape(STANDING_BY), re.M)


def spare_replica(text: str) -> int | None:
    """The replica that stands by, from ``torchx run``'s output (None: none yet, or several)."""
    found = {int(n) for n in SPARE_LINE.findall(text)}
    return found.pop() if len(found) == 1 else None


def run_once(role: str, script: str, workdir: Path, bound_s: float) -> tuple[float | None, str]:
    """One job: (seconds from the kill to world 2 again, or None; why not)."""
    from tests.conftest import BIN, _env
    from tests.e2e.agents import free_port
    from tests.e2e.test_host_lost_local import _kill_tree
    from tests.e2e.test_spares import _agents_of, _listener_of

    loop = PROGRESS_LOOP if script == "progress" else PLAIN_LOOP
    shutil.copy(loop, workdir / "loop.py")
    port = free_port()
    out = workdir / "out.log"
    command = [
        str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1", "--spares", "1",
        "--rdzv_port", str(port), "--script", "loop.py", "--", str(STEPS), str(STEP_S),
    ]  # fmt: skip
    with open(out, "w") as sink:
        torchx = subprocess.Popen(
            command, cwd=workdir, env=_env(), stdout=sink, stderr=subprocess.STDOUT
        )
    agents: list[int] = []
    try:
        deadline = time.monotonic() + SETUP_S
        while not (
            spare_replica(out.read_text()) is not None
            and last_step(out.read_text(), 2, 0) >= STEPS_BEFORE
        ):
            if time.monotonic() > deadline or torchx.poll() is not None:
                return None, f"setup: no world 2 at step {STEPS_BEFORE} with a spare standing by"
            time.sleep(0.2)
        text = out.read_text()
        spare = spare_replica(text)
        agents = _agents_of(torchx.pid)
        host = agents.index(_listener_of(port))
        [trainer] = [i for i in range(len(agents)) if i not in (spare, host)]
        killed = host if role == "host" else trainer
        fault_s = time.time()
        _kill_tree(agents[killed])
        while time.time() < fault_s + bound_s and torchx.poll() is None:
            text = out.read_text()
            back_s = back_after(text, 2, fault_s)
            if back_s is not None and last_step(text, 2, back_s) >= STEPS_AFTER:
                return round(back_s - fault_s, 2), ""
            time.sleep(0.2)
        ended = f"torchx exited {torchx.returncode}" if torchx.poll() is not None else "running"
        return None, f"{ended}; {last_agent_line(out.read_text())}"
    finally:
        for pid in [torchx.pid, *agents]:
            _kill_tree(pid)
        torchx.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loss_torchx", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--bound", type=float, default=BOUND_S, help="seconds after the kill")
    parser.add_argument("--output", type=Path, default=REPO / "bench/results/loss_torchx.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    logs = Path(tempfile.mkdtemp(prefix="loss_torchx-"))
    started = time.time()
    cells: list[dict[str, object]] = []
    for role in ROLES:
        for script in SCRIPTS:
            values: list[float | None] = []
            reasons: list[str] = []
            for repeat in range(args.repeats):
                workdir = logs / f"{role}-{script}-{repeat + 1}"
                workdir.mkdir(parents=True)
                value, why = run_once(role, script, workdir, args.bound)
                values.append(value)
                reasons.append(why)
                shown = f"{value:.2f}s" if value is not None else f"not back: {why}"
                print(f"{role:8} {script:9} {shown}", file=sys.stderr, flush=True)
            cells.append(
                {"killed": role, "script": script, "values": values, "reasons": reasons,
                 "median": median(values)}
            )  # fmt: skip
    command = "python -m bench.loss_torchx " + " ".join(argv if argv is not None else sys.argv[1:])
    document = {
        "command": command.strip(),
        "job": "torchx run -s local_cwd dist.ddp -j 2x1 --spares 1 (--max_retries 0)",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "step_s": STEP_S,
        "steps_after": STEPS_AFTER,
        "cells": cells,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    for cell in cells:
        print(f"| {cell['killed']} | {cell['script']} | {cell['median']} s | {cell['values']} |")
    print(f"logs in {logs}; {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
