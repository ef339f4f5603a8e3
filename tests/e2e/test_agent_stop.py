"""An agent stopped by a signal says so in one line, and no agent prints torch's C++ store
warnings (25 lines of C++ frames each) when a node, or the store's host, leaves."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests.e2e.agents import DUMPS_STACKS, free_port, start_agent, wait_for_exit, wait_for_text
from tests.waiting import wait_until
from torchx_elastic.agent.supervision.stop_signals import stopping

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = textwrap.dedent(
    """
    import os, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print("training", os.environ["RANK"], flush=True)
    time.sleep(120)
    """
)
CPP_NOISE = ("frame #", "Exception raised from")  # its C++ frames (torch 2.4 logs one line)


def test_the_stop_line() -> None:
    assert stopping(signal.SIGTERM, 30) == (
        "torchx-elastic: stopped by SIGTERM: the workers get SIGTERM and 30s to exit before SIGKILL"
    )
    assert stopping(signal.SIGINT, 2.5) == (
        "torchx-elastic: stopped by SIGINT: the workers get SIGINT and 2.5s to exit before SIGKILL"
    )
    assert stopping(signal.SIGHUP, None) == "torchx-elastic: stopped by SIGHUP"


def test_the_store_host_stopped_says_so_and_nobody_prints_cpp_frames(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = free_port()
    logs = [tmp_path / f"agent{n}.log" for n in range(2)]
    agents = [
        start_agent(
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=stop",
            str(script),
            cwd=tmp_path,
            log=log,
            env=DUMPS_STACKS,
        )
        for log in logs
    ]
    try:
        for log in logs:
            wait_for_text(log, "training")
        host = next(n for n, log in enumerate(logs) if "[n0 r0] training 0" in log.read_text())
        agents[host].send_signal(signal.SIGTERM)
        assert wait_for_exit(agents[host], logs[host]) == 128 + signal.SIGTERM
        # the other node fails (its store is gone) or, by timing, takes the rendezvous over
        # and waits for a second node (the host said it left, or stopped answering): then it
        # is stopped too
        other = agents[1 - host]
        said = ("left the job (its agent was stopped)", "stopped answering")
        wait_until(
            lambda: other.poll() is not None or any(s in logs[1 - host].read_text() for s in said),
            what="the other node's end, or its line that the host left or stopped answering",
            timeout_s=90,
            detail=logs[1 - host].read_text,
        )
        if other.poll() is None:
            other.send_signal(signal.SIGTERM)
            assert wait_for_exit(other, logs[1 - host]) == 128 + signal.SIGTERM
            assert logs[1 - host].read_text().count("torchx-elastic: stopped by SIGTERM") == 1
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
    stopped = logs[host].read_text()
    assert stopped.count("torchx-elastic: stopped by SIGTERM") == 1, stopped
    assert stopping(signal.SIGTERM, 30) in stopped
    for log in logs:
        text = log.read_text()
        assert not [noise for noise in CPP_NOISE if noise in text], text
