"""The rendezvous host lost on one machine (real agents, a loopback endpoint): in a fixed-size
job with a spare standing by, the survivor and the spare host the c10d store again at the
endpoint (which the killed host freed) and the job trains at its size again, then succeeds."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, _env
from tests.e2e.agents import descendants, free_port, start_agent, wait_for_exit, wait_for_text
from tests.e2e.test_spares import PROGRESS_SCRIPT, STANDING_BY, _agents_of, _listener_of
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

# each worker names its node (SPARE_NAME) and says when it trains, then steps with its peers
SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
name = os.environ.get("SPARE_NAME")
print(f"{name} trains as rank {rank} of world {world} at {time.time():.2f}", flush=True)
for step in range(int(sys.argv[1])):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
print(f"done world {world}", flush=True)
"""
TRAINS = re.compile(r"(\w+) trains as rank [01] of world 2 at ([\d.]+)\n")


def _kill_tree(pid: int) -> None:
    for each in [pid, *descendants(pid)]:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_store_host_of_a_fixed_job_with_a_spare_is_killed(tmp_path: Path) -> None:
    """Three agents on 127.0.0.1 (--nnodes 2: the third stands by); the store's host is
    SIGKILLed with its worker mid-training: the other two exit 0, after training at world 2
    again (the spare in the lost host's place)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    port = free_port()
    flags = (
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hostlost", "train.py", "300",
    )  # fmt: skip
    names = ("a", "b", "c")
    logs = {name: tmp_path / f"{name}.log" for name in names}
    agents: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        agents[name] = start_agent(*flags, cwd=tmp_path, log=logs[name], env={"SPARE_NAME": name})

    try:
        start("a")
        wait_for_text(logs["a"], "hosting the rendezvous")
        start("b")
        start("c")  # whichever of b and c comes second stands by
        wait_until(
            lambda: (
                sum(" trains as rank " in logs[n].read_text() for n in names) == 2
                and any(STANDING_BY in logs[n].read_text() for n in names)
            ),
            what="two nodes training, one standing by",
            timeout_s=240,
            detail=lambda: "\n".join(logs[n].read_text() for n in names),
        )
        [host] = [name for name in names if agents[name].pid == _listener_of(port)]
        killed_s = time.time()
        _kill_tree(agents[host].pid)
        survivors = [name for name in names if name != host]
        for name in survivors:
            code = wait_for_exit(agents[name], logs[name], timeout_s=240)
            assert code == 0, f"{name} (host was {host}) exited {code}:\n" + _every_log(logs, name)
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                _kill_tree(agent.pid)
    text = {name: logs[name].read_text() for name in survivors}
    again = {
        name: float(when) for found in text.values() for name, when in TRAINS.findall(found)
        if float(when) > killed_s
    }  # fmt: skip
    assert set(again) == set(survivors), text  # both trained at world 2 after the kill
    print(f"world 2 again {max(again.values()) - killed_s:.1f} s after the kill")
    for name in survivors:
        said = f"{name} (host was {host}):\n" + _every_log(logs, name)
        assert "done world 2" in text[name], said
        assert "the rendezvous host is lost: " in text[name], said
        assert f"the rendezvous is hosted again at 127.0.0.1:{port} (" in text[name], said
        assert " of world 1 " not in text[name], said


def _every_log(logs: dict[str, Path], last: str = "") -> str:
    """Every agent's log, named: a failure shows what each node saw; ``last``'s at the end
    (where a truncated report of the failure keeps it)."""
    order = sorted(logs, key=lambda name: name == last)
    return "\n".join(f"--- {name}:\n{logs[name].read_text(errors='replace')}" for name in order)


@pytest.mark.parametrize("role", ["host", "trainer", "spare"])
def test_through_torchx_any_killed_agent_and_the_job_succeeds(tmp_path: Path, role: str) -> None:
    """dist.ddp -j 2x1 --spares 1 (default --max_retries 0): the agent that hosts the store,
    the other training one, or the spare is SIGKILLed with its worker mid-training; the job
    SUCCEEDS each time (the killed replica is a lost node: local_cwd's state)."""
    (tmp_path / "train.py").write_text(PROGRESS_SCRIPT)
    port = free_port()
    out = tmp_path / "out.log"
    with open(out, "w") as sink:
        torchx = subprocess.Popen(
            [str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1",
             "--spares", "1", "--rdzv_port", str(port), "--script", "train.py", "--", "200"],
            cwd=tmp_path, env=_env(), stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_text(out, STANDING_BY)
        wait_for_text(out, " trains as rank ", count=2)
        text = out.read_text()
        [spare] = {int(n) for n in re.findall(r"train/(\d) " + re.escape(STANDING_BY), text)}
        agents = _agents_of(torchx.pid)
        assert len(agents) == 3, agents
        host = agents.index(_listener_of(port))
        [trainer] = [i for i in range(3) if i not in (spare, host)]
        killed = dict(host=host, trainer=trainer, spare=spare)[role]
        _kill_tree(agents[killed])
        assert torchx.wait(timeout=300) == 0, out.read_text()[-6000:]
    finally:
        if torchx.poll() is None:
            torchx.kill()
    text = out.read_text()
    assert "Job finished: SUCCEEDED" in text, text[-6000:]
    assert "Root cause" not in text, text[-6000:]
    if role != "spare":  # the spare trains in the lost node's place, in a world of 2
        assert re.search(rf"train/{spare} \[n\d r\d\] None trains as rank [01] of world 2", text)
    if role == "host":
        assert re.search(rf"the rendezvous is hosted again at [\w.]+:{port} \(", text), text[-6000:]
