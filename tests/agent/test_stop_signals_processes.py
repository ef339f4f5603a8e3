"""The agent's stop signals before its launch: one line and 128 + signal in the agent, the
default action in a process forked from it (its fork server and the workers); once it runs,
a stop that a broad ``except`` swallowed is raised again."""

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


SWALLOWED = textwrap.dedent(
    """
    import os, signal, time
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torchx_elastic.agent.supervision.stop_signals import (
        absorb_stop_signals, raise_on_stop_signals,
    )
    for launch in range(2):  # a process may launch twice (a function launch)
        raise_on_stop_signals()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Exception:  # as a broad except in the agent's main thread would (a store call)
            print("swallowed", flush=True)
        try:
            time.sleep(30)  # the agent waits on (for a rendezvous round, say)
        except SignalException as err:
            absorb_stop_signals()  # the stop is taken
            print("raised again", err.sigval.name, flush=True)
        time.sleep(3)  # and no more deliveries once it is taken
        print("done", flush=True)
    """
)


def test_a_swallowed_stop_is_raised_again_until_it_is_taken() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60,
        env={**os.environ, SIGNALS_ENV: "SIGTERM"},
    )  # fmt: skip
    assert done.returncode == 0, done
    assert done.stdout == "swallowed\nraised again SIGTERM\ndone\n" * 2, done
