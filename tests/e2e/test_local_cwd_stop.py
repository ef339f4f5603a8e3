"""SIGTERM or Ctrl-C of ``torchx run -s local_cwd``: the workers get torchrun's grace to
finish what they do on SIGTERM (a checkpoint that takes 12 s to save, more than torchx's own
10 s before SIGKILL), the agents the time to record the stop (the ``exit`` event, the node
summaries), within the stated bound; nothing of the job is left. Ctrl-C again stops it at once."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, _env
from tests.e2e.agents import alive, descendants, wait_for_text
from tests.waiting import wait_until
from torchx_elastic.contract import EVENTS_FILE, SUMMARY_PREFIX
from torchx_elastic.schedulers.local_stop import (
    DEFAULT_GRACE_S,
    STOPPED_AT_ONCE,
    stop_bound_s,
    stopping_line,
)

pytestmark = [pytest.mark.slow, pytest.mark.torchx_dev]

SAVE_S = 12
# a save that no stop waits for: the second Ctrl-C kills the workers in the middle of it
ENDLESS_SAVE_S = 600
SAVING = """
import os, signal, sys, time
rank = os.environ["RANK"]
def save(signum, frame):
    print(f"rank {rank} saving", flush=True)
    time.sleep(SAVE_S)
    with open(f"saved_{rank}", "w") as file:
        file.write("ok")
    print(f"rank {rank} saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print(f"rank {rank} training", flush=True)
while True:
    time.sleep(0.1)
"""


def _start_training(
    workdir: Path, save_s: int = SAVE_S
) -> tuple[subprocess.Popen[bytes], set[int], Path]:
    """``torchx run`` of a 1x2 job whose workers save on SIGTERM (for ``save_s``), once both
    train: the CLI, the job's processes, the CLI's output."""
    (workdir / "saving.py").write_text(SAVING.replace("SAVE_S", str(save_s)))
    log = workdir / "torchx.log"
    argv = ["run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", "saving.py"]
    with open(log, "wb") as out:
        cli = subprocess.Popen(
            [str(BIN / "torchx"), *argv], cwd=workdir, env=_env(), stdout=out, stderr=out
        )
    wait_for_text(log, " training", count=2)
    job = descendants(cli.pid)
    assert len(job) >= 4  # the agent, its janitor, 2 workers
    return cli, job, log


def _assert_gone(job: set[int]) -> None:
    wait_until(lambda: not alive(job), what="the end of the job's processes", detail=job.copy)


def test_sigterm_lets_the_workers_save_and_the_agent_record_the_stop(tmp_path: Path) -> None:
    cli, job, log = _start_training(tmp_path)
    cli.send_signal(signal.SIGTERM)
    bound_s = stop_bound_s(DEFAULT_GRACE_S)
    assert cli.wait(timeout=bound_s + 30) == 128 + signal.SIGTERM
    _assert_gone(job)
    output = log.read_text()
    assert [(tmp_path / f"saved_{r}").read_text() for r in (0, 1)] == ["ok", "ok"], output
    assert stopping_line(DEFAULT_GRACE_S, bound_s) + "\n" in output
    assert stopping_line(30, 60) == (
        "torchx-elastic: stopping the job: its workers get SIGTERM and 30s to finish, its"
        " agents up to 60s in all; Ctrl-C again stops it at once"
    )
    # the agents' last lines are shown before torchx exits
    for rank in (0, 1):
        assert f"saving/0 [n0 r{rank}] rank {rank} saved\n" in output, output
    assert "Traceback" not in output, output
    (agents_dir,) = tmp_path.glob("torchx_logs/*/*/torchelastic/saving")
    events = [json.loads(line) for line in (agents_dir / EVENTS_FILE).read_text().splitlines()]
    exits = [event for event in events if event["event"] == "exit"]
    assert [(e["state"], e["exit_code"]) for e in exits] == [("STOPPED", 128 + signal.SIGTERM)]
    assert [p.name for p in agents_dir.glob(f"{SUMMARY_PREFIX}*")] == [f"{SUMMARY_PREFIX}0.json"]


def test_a_second_ctrl_c_stops_everything_at_once(tmp_path: Path) -> None:
    cli, job, log = _start_training(tmp_path, save_s=ENDLESS_SAVE_S)
    cli.send_signal(signal.SIGINT)
    wait_for_text(log, "stopping the job")
    wait_for_text(log, "saving", count=2)  # the workers are in their SIGTERM handlers
    cli.send_signal(signal.SIGINT)
    assert cli.wait(timeout=120) == 128 + signal.SIGINT  # not after the (endless) saves
    _assert_gone(job)
    output = log.read_text()
    assert STOPPED_AT_ONCE + "\n" in output, output
    assert STOPPED_AT_ONCE == "torchx-elastic: stopped again: the job's processes are killed now"
    assert not list(tmp_path.glob("saved_*"))
    assert "Traceback" not in output, output
