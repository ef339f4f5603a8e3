"""``python -m torchx_elastic.ft.group --node N [--lighthouse_port P] -- AGENT_ARGS...``

One node of a replica group of an ``ft.ddp`` app: runs the bundled agent
(``python -m torchx_elastic.agent ...``, which restarts the group's workers in place up to
``--max-restarts``) with ``TORCHFT_LIGHTHOUSE`` pointing at the Lighthouse role, and tells the
Lighthouse role's registry when the agent starts and when it ends (its exit code), so the
Lighthouse can stop once every group has ended. Exits with the agent's exit code.

The Lighthouse role is the app's first role: its host is the rank-0 host that every
scheduler of torchx-elastic gives every replica (``TORCHX_RANK0_HOST``). Standard library
only: it is on every node's start path.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from types import FrameType
from typing import Dict, List, Optional

from torchx_elastic.agent.workers.bootstrap import die_with_parent
from torchx_elastic.contract import LAUNCHER_PID_ENV, RANK0_ENV
from torchx_elastic.contract.error_exit import say_error
from torchx_elastic.contract.job_secret import read_secret
from torchx_elastic.ft.protocol import (
    DEFAULT_LIGHTHOUSE_PORT,
    GROUP_ID_ENV,
    LIGHTHOUSE_ENV,
    lighthouse_url,
    post_event,
)

# the Lighthouse role imports torch before it serves: wait that long for it at the start
STARTED_REPORT_S = 120.0
ENDED_REPORT_S = 30.0
RETRY_S = 0.5


def _report(
    host: str,
    port: int,
    group: int,
    body: Dict[str, object],
    within_s: float,
    secret: Optional[bytes],
) -> Optional[str]:
    """None once the Lighthouse role took the report, else why it did not."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            post_event(host, port, group, body, secret)
            return None
        except urllib.error.HTTPError as err:  # refused: trying again changes nothing
            return _refusal(err)
        except OSError as err:
            if time.monotonic() >= deadline:
                return f"unreachable ({getattr(err, 'reason', err)})"
            time.sleep(RETRY_S)


def _refusal(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {err.code}"


def _not_taken(host: str, report: str, group: int, node: str, why: str) -> str:
    return (
        f"torchx-elastic: the Lighthouse role at {host} did not take the {report} of replica"
        f" group {group} (node {node}): {why}"
    )


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(node: str, lighthouse_port: int, agent_args: List[str]) -> int:
    # local_cwd: stop when the torchx process dies, and let the agent watch this process
    die_with_parent(LAUNCHER_PID_ENV, signal.SIGTERM)
    host = os.environ.get(RANK0_ENV) or "localhost"
    group = int(os.environ[GROUP_ID_ENV])
    try:
        secret = read_secret()
    except ValueError as err:
        say_error(err)
        return 1
    env = dict(os.environ)
    env[LIGHTHOUSE_ENV] = lighthouse_url(host, lighthouse_port)
    if LAUNCHER_PID_ENV in env:
        env[LAUNCHER_PID_ENV] = str(os.getpid())

    def report_start() -> None:
        start = {"node": node, "event": "started", "rc": 0}
        why = _report(host, lighthouse_port, group, start, STARTED_REPORT_S, secret)
        if why is not None:
            print(_not_taken(host, "start", group, node, why), file=sys.stderr)

    started = threading.Thread(target=report_start, daemon=True)
    started.start()
    stopped: List[int] = []  # the signals this process got
    forwarded: List[int] = []  # those it sent on to the agent
    started_agent: List[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: Optional[FrameType]) -> None:
        stopped.append(signum)
        for process in started_agent:
            process.send_signal(signum)
            forwarded.append(signum)

    # before the agent starts: a signal in between must not end this process alone
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    agent = subprocess.Popen([sys.executable, *agent_args], env=env)
    started_agent.append(agent)
    if stopped and not forwarded:  # it came while the agent was starting
        agent.send_signal(stopped[0])
    code = _exit_code(agent.wait())
    if stopped:  # cancelled: the Lighthouse role is being stopped too, one try is enough
        within_s = 0.0
    else:
        started.join(STARTED_REPORT_S)
        within_s = ENDED_REPORT_S
    ended = {"node": node, "event": "ended", "rc": code}
    why = _report(host, lighthouse_port, group, ended, within_s, secret)
    if why is not None:
        print(
            f"{_not_taken(host, 'end', group, node, why)}; it keeps running until cancelled",
            file=sys.stderr,
        )
    return code


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m torchx_elastic.ft.group")
    parser.add_argument("--node", required=True, help="this node's replica id in its group")
    parser.add_argument("--lighthouse_port", type=int, default=DEFAULT_LIGHTHOUSE_PORT)
    parser.add_argument("agent_args", nargs=argparse.REMAINDER, help="-- then the agent's")
    args = parser.parse_args(argv)
    agent_args = args.agent_args[1:] if args.agent_args[:1] == ["--"] else args.agent_args
    sys.exit(run(args.node, args.lighthouse_port, agent_args))


if __name__ == "__main__":
    main()
