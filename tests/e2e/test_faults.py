"""The agent under faults: crashes, hangs, signals, lost and new peers (real processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_agent
from tests.e2e.agents import (
    DUMPS_STACKS,
    alive,
    descendants,
    free_port,
    start_agent,
    wait_for_exit,
    wait_for_text,
)
from tests.waiting import wait_until
from torchx_elastic.contract import SECRET_ENV, SUMMARY_PREFIX, WAITING_FOR_NODES

pytestmark = [pytest.mark.slow, pytest.mark.torch_lines]

CRASHY_TRAINING = """
import json, os, random, sys
import torch, torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ckpt = os.path.join(os.environ["CKPT_DIR"], "ckpt.json")
state = json.load(open(ckpt)) if os.path.exists(ckpt) else {"step": 0, "total": 0.0}
plan = random.Random(int(os.environ["SEED"]) * 1000 + attempt)
crash_rank, crash_step = plan.randrange(world), state["step"] + plan.randrange(5)
for step in range(state["step"], 200):
    value = torch.tensor([float(step)])
    dist.all_reduce(value)  # every rank adds step: world * step
    state = {"step": step + 1, "total": state["total"] + value.item()}
    if rank == 0:
        with open(ckpt + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
    if attempt < int(os.environ["CRASHES"]) and rank == crash_rank and step == crash_step:
        os._exit(13)
if rank == 0:
    print("RESULT", json.dumps(state), "attempt", attempt)
dist.destroy_process_group()
"""


def test_twenty_random_crashes_twenty_restarts_right_result(tmp_path: Path) -> None:
    """A few seconds; an agent that hangs shows its threads' stacks before pytest's own
    timeout (300 s) would end the test without them."""
    (tmp_path / "train.py").write_text(CRASHY_TRAINING)
    log = tmp_path / "agent.log"
    agent = start_agent(
        "--nproc-per-node", "2", "--max-restarts", "20", "train.py",
        cwd=tmp_path, log=log,
        env={"CKPT_DIR": str(tmp_path), "SEED": "7", "CRASHES": "20", **DUMPS_STACKS},
    )  # fmt: skip
    assert wait_for_exit(agent, log, timeout_s=240) == 0, log.read_text()[-6000:]
    expected_total = sum(2 * step for step in range(200))
    assert f'RESULT {{"step": 200, "total": {float(expected_total)}}} attempt 20' in log.read_text()


def test_failing_rank_without_restarts_left_fails_the_job(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(CRASHY_TRAINING)
    result = run_agent(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "train.py",
        cwd=tmp_path,
        env={"CKPT_DIR": str(tmp_path), "SEED": "1", "CRASHES": "5"},
    )
    assert result.returncode == 1
    assert "exit code 13" in result.stderr


HANGING = """
import os, sys, time
from torchx_elastic import heartbeat
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for i in range(20):
    heartbeat()
    if os.environ["RANK"] == "1" and attempt < int(os.environ["HANGS"]) and i == 3:
        while True:
            time.sleep(0.5)  # a hung collective, as the watchdog sees it
    time.sleep(0.1)
print("finished attempt", attempt)
"""


def test_hang_is_detected_stacks_dumped_and_group_restarted(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANGING)
    result = run_agent(
        "--nproc-per-node",
        "2",
        "--hang-timeout-s",
        "2",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        "hang.py",
        cwd=tmp_path,
        env={"HANGS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("finished attempt 1") == 2
    stderr_log = (tmp_path / "logs/attempt_0/rank_1/stderr.log").read_text()
    assert "most recent call first" in stderr_log
    assert f'File "{tmp_path / "hang.py"}", line 9 in <module>' in stderr_log  # as python shows it
    # the timeline's records: the hang, then the failure it became, then the restart
    from torchx_elastic.timeline.log_dir import timeline_of_dir

    timeline = timeline_of_dir(str(tmp_path / "logs"))
    (restart,) = timeline.job_marks
    assert restart.label.startswith("restart 1 after hang: rank 1 sent no progress")
    hangs = [m.label for m in timeline.nodes[0].marks if m.kind == "hang"]
    assert hangs == ["rank 1 hung"]


def test_hang_without_restarts_fails_with_a_report_that_says_hang(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANGING)
    result = run_agent(
        "--nproc-per-node",
        "2",
        "--hang-timeout-s",
        "2",
        "hang.py",
        cwd=tmp_path,
        env={"HANGS": "1"},
    )
    assert result.returncode == 1
    assert "hang: rank 1 sent no progress or heartbeat for 2s (--hang-timeout-s)" in result.stderr


SPAWNER = """
import os, signal, subprocess, sys, time
def on_term(*_):
    open(os.path.join(os.environ["OUT_DIR"], "term." + os.environ["RANK"]), "w").close()
    time.sleep(float(os.environ.get("SLOW_TERM_S", "0")))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
subprocess.Popen(["sleep", "300"])
print("ready", flush=True)
time.sleep(300)
"""


def test_sigkill_of_the_agent_leaves_no_process_of_the_job(tmp_path: Path) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    log = tmp_path / "agent.log"
    agent = start_agent(
        "--nproc-per-node", "2", "spawner.py", cwd=tmp_path, log=log, env={"OUT_DIR": str(tmp_path)}
    )
    wait_for_text(log, "ready", count=2)
    job = descendants(agent.pid)
    assert len(job) >= 5  # janitor, 2 workers, their 2 children
    agent.kill()
    agent.wait()
    _wait_gone(job)


def _wait_gone(job: set[int]) -> None:
    wait_until(lambda: not alive(job), what="the end of every process of the job", detail=job.copy)


def test_sigterm_gives_workers_sigterm_and_exits_128_plus_signal(tmp_path: Path) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    log = tmp_path / "agent.log"
    agent = start_agent(
        "--nproc-per-node",
        "2",
        "--term-timeout-s",
        "5",
        "spawner.py",
        cwd=tmp_path,
        log=log,
        env={"OUT_DIR": str(tmp_path)},
    )
    wait_for_text(log, "ready", count=2)
    job = descendants(agent.pid)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.glob("term.*")) == ["term.0", "term.1"]
    _wait_gone(job)


def _signal_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_step_wide_sigterm_twice_ends_the_agent_cleanly(tmp_path: Path) -> None:
    """As Slurm stops a step (cancel, requeue, a peer's failure): SIGTERM to every process
    of the node, the janitor and the fork server included, then again during the shutdown."""
    (tmp_path / "spawner.py").write_text(SPAWNER)
    log = tmp_path / "agent.log"
    agent = start_agent(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        "spawner.py",
        cwd=tmp_path,
        log=log,
        env={"OUT_DIR": str(tmp_path), "SLOW_TERM_S": "1"},
    )
    wait_for_text(log, "ready", count=2)
    job = descendants(agent.pid) | {agent.pid}
    _signal_all(job, signal.SIGTERM)
    # again during the shutdown: the workers are in their SIGTERM handlers (1 s long)
    wait_until(lambda: len(list(tmp_path.glob("term.*"))) == 2, what="both workers' SIGTERM")
    _signal_all(alive(job), signal.SIGTERM)
    assert agent.wait(timeout=60) == 128 + signal.SIGTERM
    output = log.read_text()
    assert "Traceback" not in output, output
    summaries = list((tmp_path / "logs").glob(f"**/{SUMMARY_PREFIX}*.json"))
    assert summaries, output
    _wait_gone(job)


def test_sigterm_while_waiting_for_the_rendezvous_writes_the_summary(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    agent = start_agent(
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--log-dir",
        str(tmp_path / "logs"),
        "spawner.py",
        cwd=tmp_path,
        log=log,
    )
    wait_for_text(log, WAITING_FOR_NODES)  # for a second node that never comes
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 128 + signal.SIGTERM
    output = log.read_text()
    assert "Traceback" not in output, output
    assert list((tmp_path / "logs").glob(f"**/{SUMMARY_PREFIX}*.json")), output


STEPS = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"attempt {attempt} world {dist.get_world_size()}", flush=True)
world = dist.get_world_size()
for _ in range(int(os.environ.get(f"STEPS_WORLD_{world}", os.environ["STEPS"]))):
    dist.barrier()
    time.sleep(0.1)
print(f"done attempt {attempt} world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
"""


SECRET = {SECRET_ENV: "the nodes of this job"}  # as a scheduler gives


def _two_node_args(
    port: int, nnodes: str, host: bool, conf: str = "", log_dir: Path | None = None
) -> list[str]:
    """Node args; the rendezvous store lives in the ``host`` agent, as on node 0 of a job."""
    conf = f"last_call_timeout=1,join_timeout=20,is_host={str(host).lower()}{conf}"
    logs = [] if log_dir is None else ["--log-dir", str(log_dir)]
    return [
        *logs,
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "job",
        "--rdzv-conf",
        conf,
        "--max-restarts",
        "3",
        "steps.py",
    ]


def _two_running_nodes(
    tmp_path: Path, nnodes: str, steps: int, conf: str = ""
) -> tuple[int, list[subprocess.Popen[bytes]], list[Path]]:
    """Two agents (the first hosts the store) whose workers are training in world 2."""
    (tmp_path / "steps.py").write_text(STEPS)
    port = free_port()
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    agents = [
        start_agent(
            *_two_node_args(port, nnodes, host=i == 0, conf=conf),
            cwd=tmp_path,
            log=log,
            env={"STEPS": str(steps), **SECRET},
        )
        for i, log in enumerate(logs)
    ]
    for log in logs:
        wait_for_text(log, "world 2")
    return port, agents, logs


def test_lost_node_elastic_job_carries_on_with_a_smaller_world(tmp_path: Path) -> None:
    _, agents, logs = _two_running_nodes(tmp_path, "1:2", steps=150)
    agents[1].kill()
    survivor = agents[0]
    assert survivor.wait(timeout=120) == 0, logs[0].read_text()
    text = logs[0].read_text()
    assert "world 1" in text and "done attempt" in text


def test_a_frozen_node_is_dropped_by_the_peer_that_watches_its_heartbeat(tmp_path: Path) -> None:
    """A node whose agent and workers stop (no TCP reset, and its presence port still
    accepts) is dropped after 10 s without a heartbeat by the peer that watches its
    heartbeat key; the survivor says so and trains on in a world of 1."""
    _, agents, logs = _two_running_nodes(tmp_path, "1:2", steps=400)
    frozen = [agents[1].pid, *descendants(agents[1].pid)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert agents[0].wait(timeout=180) == 0, logs[0].read_text()
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
        agents[1].wait(timeout=30)
    text = logs[0].read_text()
    assert re.search(
        r"torchx-elastic: node 1: \S+ \(agent pid \d+\) stopped answering \(no"
        r" rendezvous heartbeat for 10s\): stopping the workers and re-forming without it",
        text,
    ), text
    assert "done attempt 0 world 1" in text


def test_torchs_own_rendezvous_runs_the_job_untouched(tmp_path: Path) -> None:
    """``--rdzv-conf handler=torch``: torch's c10d rendezvous as torchrun's, not the
    agent's own; the two nodes train and end together."""
    _, agents, logs = _two_running_nodes(tmp_path, "2", steps=20, conf=",handler=torch")
    for agent, log in zip(agents, logs, strict=True):
        assert agent.wait(timeout=120) == 0, log.read_text()
        assert "done attempt 0 world 2" in log.read_text()


def test_new_node_joins_a_running_elastic_job(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(STEPS)
    port = free_port()
    # the first node trains until the second joins (a membership change ends its world-1
    # workers; 3000 steps bound the wait), so the join cannot land after the job is over
    env = {"STEPS": "30", "STEPS_WORLD_1": "3000", **SECRET}
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    first = start_agent(*_two_node_args(port, "1:2", host=True), cwd=tmp_path, log=logs[0], env=env)
    wait_for_text(logs[0], "attempt 0 world 1")
    second = start_agent(
        *_two_node_args(port, "1:2", host=False), cwd=tmp_path, log=logs[1], env=env
    )
    assert first.wait(timeout=240) == 0, logs[0].read_text()
    assert second.wait(timeout=120) == 0, logs[1].read_text()
    for log in logs:
        assert "done attempt 0 world 2" in log.read_text()
    assert "done attempt 0 world 1" not in logs[0].read_text()


def test_lost_node_without_enough_nodes_fails_naming_the_endpoint(tmp_path: Path) -> None:
    port, agents, logs = _two_running_nodes(tmp_path, "2", steps=300)
    agents[1].kill()
    assert agents[0].wait(timeout=120) != 0
    text = logs[0].read_text()
    assert (
        f"rendezvous at 127.0.0.1:{port} failed: round 2 of the rendezvous did not complete in"
        " 20s (1 of 2 nodes came) while waiting for 2 node(s); lost since the last round: "
    ) in text
    lost = text.split("lost since the last round: ", 1)[1].split(";")[0]
    assert re.fullmatch(rf"node [01]: \S+ \(agent pid {agents[1].pid}\)", lost), lost
    # the round that waits for it said so before the join timeout
    waiting = re.search(r"torchx-elastic: waiting for nodes \(round \d+\): 1 of 2 here .*", text)
    assert waiting is not None, text
    assert (
        f"; not back since the last round: {lost}; at 127.0.0.1:{port}, gives up at "
        in waiting.group(0)
    ), waiting.group(0)


def test_unreachable_endpoint_fails_within_the_timeout_naming_it(tmp_path: Path) -> None:
    port = free_port()
    result = run_agent(
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{port}",
        "--rdzv-conf",
        "is_host=false,read_timeout=2,join_timeout=2",
        "x.py",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert (
        f"torchx-elastic: error: rendezvous at localhost:{port} failed: nothing listens at"
        f" localhost:{port} (connection refused); start the node that hosts the rendezvous"
    ) in result.stderr


def test_unresolvable_endpoint_names_the_host(tmp_path: Path) -> None:
    result = run_agent(
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "no-such-node.invalid:29500",
        "--rdzv-conf",
        "join_timeout=1",
        "x.py",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert (
        "torchx-elastic: error: rendezvous at no-such-node.invalid:29500 failed: host"
        " 'no-such-node.invalid' does not resolve from this node" in result.stderr
    )


def test_node_stopped_by_sigterm_leaves_the_rendezvous_open_for_a_replacement(
    tmp_path: Path,
) -> None:
    """As torch's launcher: an agent stopped by a signal does not shut the rendezvous down
    (that would close it for every node, so a lost pod would end the whole job)."""
    port, agents, logs = _two_running_nodes(tmp_path, "2", steps=200)
    agents[1].send_signal(signal.SIGTERM)
    assert agents[1].wait(timeout=60) == 128 + int(signal.SIGTERM), logs[1].read_text()
    replacement_log = tmp_path / "c.log"
    replacement = start_agent(
        *_two_node_args(port, "2", host=False),
        cwd=tmp_path,
        log=replacement_log,
        env={"STEPS": "200", **SECRET},  # as many barriers as the survivor's workers
    )
    assert replacement.wait(timeout=120) == 0, replacement_log.read_text()
    assert agents[0].wait(timeout=120) == 0, logs[0].read_text()
    survivor = logs[0].read_text()
    assert survivor.count("attempt 0 world 2") >= 2  # before and after: no restart spent
    assert "attempt 1 world" not in survivor
    assert "world 2" in replacement_log.read_text()
    # the stopped agent said it left: the survivor names it at once (rendezvous/presence.py)
    assert re.search(
        rf"torchx-elastic: node 1 \(\S+, agent pid {agents[1].pid}\) was lost: its agent was"
        r" stopped; re-forming without it: rendezvous round 2 next \(a lost node is not the"
        r" script's failure: no restart spent, \d+ restarts? left\)",
        survivor,
    ), survivor


def test_a_node_that_arrives_after_the_job_finished_exits_at_once_saying_so(
    tmp_path: Path,
) -> None:
    """An elastic job ends with fewer than its maximum of nodes: its host keeps the closed
    rendezvous up for finished_grace_s, and a node arriving then exits 0 without training."""
    (tmp_path / "steps.py").write_text(STEPS)
    port = free_port()
    logs = [tmp_path / "a.log", tmp_path / "late.log"]
    host_logs = tmp_path / "host_logs"
    # a grace that a late agent's start (torch's import, on a busy machine) fits in
    first = start_agent(
        *_two_node_args(port, "1:2", host=True, conf=",finished_grace_s=60", log_dir=host_logs),
        cwd=tmp_path,
        log=logs[0],
        env={"STEPS": "3", **SECRET},
    )
    # the host's agent saw its workers' end and closed the rendezvous: its summary follows
    wait_until(
        lambda: list(host_logs.glob(f"**/{SUMMARY_PREFIX}*.json")),
        what="the host's summary (after its rendezvous closed)",
        detail=logs[0].read_text,
    )
    late = start_agent(
        *_two_node_args(port, "1:2", host=False),
        cwd=tmp_path,
        log=logs[1],
        env={"STEPS": "3", **SECRET},
    )
    assert late.wait(timeout=120) == 0, logs[1].read_text()
    text = logs[1].read_text()
    assert (
        f"torchx-elastic: the job this node came for has finished: its rendezvous (run id"
        f" 'job' at 127.0.0.1:{port}) is closed, so this node exits without training\n"
    ) in text
    assert "attempt" not in text  # no worker of the late node ran
    assert first.poll() is None  # the host still holds the rendezvous up: the late node is done
    assert first.wait(timeout=120) == 0, logs[0].read_text()


UNTIL_TOLD = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"attempt {attempt} world {dist.get_world_size()}", flush=True)
while not os.path.exists("stop"):
    time.sleep(0.1)
print(f"done attempt {attempt} world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
"""


def test_a_late_node_with_other_settings_fails_alone_and_the_running_job_goes_on(
    tmp_path: Path,
) -> None:
    """A node started with another --nnodes comes to a running elastic job: it fails naming
    both values, and the job it found trains on to its end (the failing node closed the
    rendezvous: the job ended at its next round)."""
    (tmp_path / "steps.py").write_text(UNTIL_TOLD)
    port = free_port()
    logs = [tmp_path / "host.log", tmp_path / "other.log"]
    host = start_agent(
        *_two_node_args(port, "1:2", host=True), cwd=tmp_path, log=logs[0], env=SECRET
    )
    wait_for_text(logs[0], "attempt 0 world 1")
    other = start_agent(
        *_two_node_args(port, "1:3", host=False), cwd=tmp_path, log=logs[1], env=SECRET
    )
    assert other.wait(timeout=120) == 1, logs[1].read_text()
    assert "failed: nodes disagree on --nnodes: 1:3 on " in logs[1].read_text()
    assert host.poll() is None, logs[0].read_text()
    (tmp_path / "stop").touch()
    assert host.wait(timeout=120) == 0, logs[0].read_text()
    assert re.search(r"done attempt \d+ world 1", logs[0].read_text()), logs[0].read_text()


def _agent_of_an_unresolvable_host(tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    """An elastic node whose rank-0 host never resolves (it waits up to 600 s)."""
    return start_agent(
        "--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "no-such-node.invalid:29500", "--rdzv-id", "job", "x.py",
        cwd=tmp_path,
        log=log,
    )  # fmt: skip


def test_a_node_stopped_while_it_waits_for_the_host_name_exits_in_one_line(
    tmp_path: Path,
) -> None:
    """A Job that succeeded removes its pods still waiting for the rank-0 host's name: the
    agent exits 128 + SIGTERM with one line, no traceback."""
    log = tmp_path / "waiting.log"
    agent = _agent_of_an_unresolvable_host(tmp_path, log)
    # in the wait for the host name (join_timeout: 600 s), which it says after 2 s
    wait_for_text(log, "rendezvous at no-such-node.invalid:29500: host 'no-such-node.invalid'")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 128 + int(signal.SIGTERM), log.read_text()
    text = log.read_text()
    assert "torchx-elastic: stopped by SIGTERM before joining\n" in text, text
    assert "Traceback" not in text, text


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its ``SigCgt`` mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    return False


def test_a_node_stopped_while_it_starts_exits_in_one_line(tmp_path: Path) -> None:
    """A pod removed while its agent imports torch or forks its fork server (seconds on a
    loaded node) exits 128 + SIGTERM with the same line, and leaves no process behind."""
    log = tmp_path / "starting.log"
    agent = _agent_of_an_unresolvable_host(tmp_path, log)
    wait_until(  # the agent's first line ran: before torch
        lambda: _catches(agent.pid, signal.SIGTERM),
        what="the agent's SIGTERM handler",
        every_s=0.005,
        detail=log.read_text,
    )
    tree = descendants(agent.pid)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 128 + int(signal.SIGTERM), log.read_text()
    text = log.read_text()
    assert text.endswith("torchx-elastic: stopped by SIGTERM before joining\n"), text
    wait_until(lambda: not alive(tree), what="the end of the stopped agent's processes")
