"""Spares (real agents): nodes beyond the job's size wait at the rendezvous as standbys (torch's
redundancy list), say so, take a lost node's place at the next round, and end with the job
(exit 0) when no node is lost."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from torchx.runner import get_runner
from torchx.specs import AppState

from tests.conftest import BIN, _env, run_torchx
from tests.e2e.agents import descendants, free_port, start_agent, wait_for_text
from tests.waiting import wait_until
from torchx_elastic.components.dist import ddp
from torchx_elastic.contract.log_layout import STDERR_FILE

pytestmark = pytest.mark.slow

# each worker names the node it runs on (SPARE_NAME), then steps in lockstep with its peers
SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
name = os.environ.get("SPARE_NAME")
print(f"{name} trains as rank {rank} of world {world} at {count}", flush=True)
for step in range(int(sys.argv[1])):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
print(f"done world {world}", flush=True)
"""
# the same loop reporting progress every step, as examples/progress.py
PROGRESS_SCRIPT = SCRIPT.replace(
    "    time.sleep(0.1)\n",
    "    time.sleep(0.1)\n    torchx_elastic.progress(step + 1, int(sys.argv[1]))\n",
).replace("import torch\n", "import torch\nimport torchx_elastic\n", 1)
STANDING_BY = "torchx-elastic: standing by: the job has its 2 nodes (3 here); this node takes"


def test_through_torchx_a_spare_stands_by_and_ends_with_the_job(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1", "--spares", "1",
        "--rdzv_port", str(free_port()), "--script", "train.py", "--", "40", cwd=tmp_path,
    )  # fmt: skip
    out = result.stderr
    assert result.returncode == 0, out[-4000:]
    [spare] = re.findall(r"train/(\d) " + re.escape(STANDING_BY), out)[:1]
    assert (
        f"train/{spare} torchx-elastic: the job this node came for has finished: its rendezvous"
        " (run id 'train-"
    ) in out
    assert (
        "is closed while this node stood by as a spare, so this node exits without training" in out
    )
    assert out.count(" trains as rank ") == 2  # the spare never trained
    assert f"train/{spare} [n" not in out


def test_without_progress_reports_torchx_status_counts_the_standby(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dist.ddp -j 2x1 --spares 1 running a script that never calls progress(): the rank-0
    agent still says the nodes (its line, every status interval) and local_cwd's status,
    read through torchx's runner as ``torchx status`` does, shows them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    app = ddp("300", script="train.py", j="2x1", spares=1, cpu=1, rdzv_port=free_port())
    log_dir = tmp_path / "logs"
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(log_dir)})
        try:

            def nodes_message() -> str | None:
                status = runner.status(handle)
                assert status is not None and status.state in (AppState.RUNNING, AppState.PENDING)
                return status.msg if "standby" in status.msg else None

            msg = wait_until(nodes_message, what="the standby in torchx status", timeout_s=180)
            assert re.fullmatch(
                r"nodes: 2 training, 1 standby \(as of \d+s ago, its rank-0 agent\)", msg
            ), msg

            def agents_stderr() -> str:
                return "".join(p.read_text() for p in log_dir.rglob(STDERR_FILE))

            # the line the status of docker, kubernetes and slurm reads (printed every 5 s)
            wait_until(
                lambda: "[job progress] nodes: 2 training, 1 standby\n" in agents_stderr(),
                what="the rank-0 agent's nodes line",
                detail=agents_stderr,
            )
            assert "[job progress] 0/" not in agents_stderr()  # no progress figures made up
        finally:
            runner.cancel(handle)


# each node its own address, as on separate hosts (nodes are told apart by it)
ADDRESSES = dict(host="127.0.0.1", lost="127.0.0.2", back="127.0.0.2", spare="127.0.0.3")


def lose_a_node_beside_a_spare(
    tmp_path: Path, come_back: bool, script: str = SCRIPT
) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, str]]:
    """host and lost train, spare stands by; lost's agent and worker are SIGKILLed; every
    agent still running exits 0. The agents, and each one's log. With ``come_back``, an agent
    on lost's address (back) stands by too before the kill: back at the round that re-forms,
    however long a loaded machine takes to start an agent."""
    (tmp_path / "train.py").write_text(script)
    flags = (
        "--nnodes", "2", "--max-restarts", "0", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "spares", "train.py", "300",
    )  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in ADDRESSES}

    def start(name: str) -> subprocess.Popen[bytes]:
        return start_agent(
            "--local-addr", ADDRESSES[name], *flags, cwd=tmp_path, log=logs[name],
            env={"SPARE_NAME": name},
        )  # fmt: skip

    agents = {"host": start("host")}  # the store's host: on one machine it cannot move
    try:
        wait_for_text(logs["host"], "hosting the rendezvous")
        agents["lost"] = start("lost")
        wait_for_text(logs["lost"], "lost trains as rank")
        agents["spare"] = start("spare")
        wait_for_text(logs["spare"], STANDING_BY)
        if come_back:
            agents["back"] = start("back")
            wait_for_text(logs["back"], "torchx-elastic: standing by: the job has its 2 nodes")
        lost = agents["lost"]
        for pid in [lost.pid, *descendants(lost.pid)]:
            os.kill(pid, signal.SIGKILL)
        for name in agents.keys() - {"lost"}:
            assert agents[name].wait(timeout=240) == 0, logs[name].read_text()
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.kill()
    return agents, {name: logs[name].read_text() for name in agents}


def test_a_spare_takes_the_place_of_a_lost_node(tmp_path: Path) -> None:
    agents, text = lose_a_node_beside_a_spare(tmp_path, come_back=False)
    spare, host = text["spare"], text["host"]
    # in the lost node's place, in a world of 2 (never alone), no restart spent
    assert re.search(r"spare trains as rank [01] of world 2 at 0\n", spare), spare
    assert "done world 2" in host + spare
    assert " of world 1 " not in spare
    # said once, by the node that stayed, with the lost agent's pid and the spare's
    replaced = re.findall(
        rf"torchx-elastic: round 2: 127.0.0.3 \(agent pid {agents['spare'].pid}\) takes the"
        rf" place of 127.0.0.2 \(agent pid {agents['lost'].pid}\), lost; the job is back at 2"
        r" nodes\n",
        host,
    )
    assert len(replaced) == 1, host
    assert "), lost; the job is back" not in spare  # said once, not by the spare
    # its agent's port refused a connection: named at once, not after its heartbeats' 10 s;
    # its peers' ranks failed only with it: with --max-restarts 0 the job goes on
    assert re.search(
        rf"torchx-elastic: node 1 \(127.0.0.2, agent pid {agents['lost'].pid}\) was lost: its"
        r" agent is gone \(nothing listens on its port 127.0.0.2:\d+ any more\); re-forming"
        r" without it: rendezvous round 2 next \(a lost node is not the script's failure: no"
        r" restart spent, 0 restarts left\)\n",
        host,
    ), host
    assert "restarting every node" not in host + spare


def test_a_lost_node_that_comes_back_takes_its_place_before_the_spare(tmp_path: Path) -> None:
    """The returning-node rule (rendezvous/returning_first.py): each node publishes its own
    address (--local-addr), so the node back at the lost one's address is told from the spare."""
    agents, text = lose_a_node_beside_a_spare(tmp_path, come_back=True)
    lost = agents["lost"]
    back_pid = agents["back"].pid
    assert re.search(r"back trains as rank [01] of world 2 at 0\n", text["back"]), text["back"]
    assert " trains as rank " not in text["spare"], text["spare"]  # it stood by throughout
    # the spare holds back, saying why, where it reaches torch's join while back waits for
    # the place; where back took it first, the spare had nothing to hold (the line itself:
    # tests/agent/test_spare_policy_units.py)
    held = re.findall(
        r"torchx-elastic: standing by: (.+) of the last round is back and takes its place before"
        r" this node, which was not in it \(it waits up to 5s\)\n",
        text["spare"],
    )
    assert held in ([], [f"127.0.0.2 (agent pid {back_pid})"]), text["spare"]
    assert "stood by as a spare, so this node exits without training" in text["spare"]
    assert (
        f"torchx-elastic: round 2: 127.0.0.2 (agent pid {back_pid}), back, takes the place of"
        f" 127.0.0.2 (agent pid {lost.pid}), lost, before any spare; the job is back at 2 nodes"
    ) in text["host"]


def test_a_lost_node_is_named_at_once_while_the_script_reports_progress(tmp_path: Path) -> None:
    """A script that calls progress() every step: node rank 0 waited for the lost node's last
    progress report (30 s) before it looked at its failed ranks, and the loss was then told
    by the heartbeats; the presence port names it at once, as for a script that does not."""
    agents, text = lose_a_node_beside_a_spare(tmp_path, come_back=False, script=PROGRESS_SCRIPT)
    host, spare = text["host"], text["spare"]
    assert re.search(
        rf"torchx-elastic: node 1 \(127.0.0.2, agent pid {agents['lost'].pid}\) was lost: its"
        r" agent is gone \(nothing listens on its port 127.0.0.2:\d+ any more\); re-forming"
        r" without it",
        host,
    ), host
    assert "stopped answering (no rendezvous heartbeat" not in host
    assert re.search(r"spare trains as rank [01] of world 2 at \d\n", spare), spare
    assert "[job progress]" in host  # the script's progress did reach node rank 0


def _agents_of(parent: int) -> list[int]:
    """The agents ``torchx run`` started, in replica order (local_cwd starts them in turn)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"torchx_elastic.agent" in command[:3]:
            found.append(int(entry))
    return sorted(found)


def _listener_of(port: int) -> int:
    ss = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True)
    return int(re.findall(r"pid=(\d+)", ss.stdout)[0])


def test_through_torchx_a_killed_agent_spends_no_restart_and_the_job_succeeds(
    tmp_path: Path,
) -> None:
    """dist.ddp -j 2x1 --spares 1 with the default --max_retries 0, a script that reports
    progress: a training agent that does not host the store is SIGKILLed with its worker;
    the spare takes its place and the job SUCCEEDS (the killed replica is a lost node, not the
    job's failure: local_cwd's state)."""
    (tmp_path / "train.py").write_text(PROGRESS_SCRIPT)
    port = free_port()
    out = tmp_path / "out.log"
    with open(out, "w") as sink:
        torchx = subprocess.Popen(
            [str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1",
             "--spares", "1", "--rdzv_port", str(port), "--script", "train.py", "--", "300"],
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
        [lost] = [i for i in range(3) if i not in (spare, host)]
        for pid in [agents[lost], *descendants(agents[lost])]:
            os.kill(pid, signal.SIGKILL)
        assert torchx.wait(timeout=240) == 0, out.read_text()[-6000:]
    finally:
        if torchx.poll() is None:
            torchx.kill()
    text = out.read_text()
    assert "Job finished: SUCCEEDED" in text, text[-6000:]
    assert re.search(
        rf"torchx-elastic: node [01] \(localhost, agent pid {agents[lost]}\) was lost: its agent"
        r" is gone \(nothing listens on its port [\d.]+:\d+ any more\); re-forming without it:"
        r" rendezvous round 2 next \(a lost node is not the script's failure: no restart spent,"
        r" 0 restarts left\)\n",
        text,
    ), text[-6000:]
    # the spare trains in the lost node's place, in a world of 2, at restart count 0
    assert re.search(rf"train/{spare} \[n\d r\d\] None trains as rank [01] of world 2 at 0\n", text)
    assert "Root cause" not in text
