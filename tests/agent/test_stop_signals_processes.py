"""The agent's stop signals before its launch: one line and 128 + signal in the agent, the
default action in a process forked from it (its fork server and the workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from torchx_elastic.agent.supervision.stop_signals import stopped_before_joining
from torchx_elastic.contract import SIGNALS_ENV

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from torchx_elastic.agent.supervision.stop_signals import exit_on_stop_signals
    exit_on_stop_signals()
    if sys.argv[1] == "forked":
        pid = os.fork()
        if pid == 0:  # as the fork server: inherits the agent's handler
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # what runs on if the signal does not end it (the scenario)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), flush=True)
        sys.exit(0)
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(5)  # what runs on if the signal does not end it (the scenario)
    """
)


def _run(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60,
        env={**os.environ, SIGNALS_ENV: "SIGTERM,SIGHUP"},
    )  # fmt: skip


def test_the_agent_exits_with_one_line() -> None:
    done = _run("agent")
    assert done.returncode == 128 + int(signal.SIGHUP), done
    assert done.stderr == "torchx-elastic: stopped by SIGHUP before joining\n"
    assert stopped_before_joining(signal.SIGTERM) == (
        "torchx-elastic: stopped by SIGTERM before joining"
    )


def test_a_forked_process_takes_the_default_action() -> None:
    done = _run("forked")
    assert done.returncode == 0, done
    assert done.stdout == f"child {-int(signal.SIGTERM)}\n"
    assert done.stderr == ""
