"""Nobody outside the job gets in (docs/security.md): real jobs, real attackers.

On simulated hosts (``../shared/netns/hosts.sh``, root) a job runs on h0 (and h1) and a
plain ``torch.distributed.TCPStore`` client on another host, and a local process, read and
replace the rendezvous state with a pickle that would leave a line in a file when unpickled
(tests/e2e/rdzv_attacker.py). Nothing they write runs, the agents log the refusal, the job
succeeds. Without netns (not root) those tests skip, except in CI (tests/ci.py).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ci import unavailable
from tests.conftest import BIN, _env
from tests.e2e.agents import free_port, start_agent
from tests.waiting import DEADLINE_S, wait_until
from torchx_elastic.contract import PROGRESS_KEY_PREFIX, SECRET_ENV

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HOSTS_SH = REPO.parent / "shared" / "netns" / "hosts.sh"
NETNS_LOCK = "/tmp/netns.lock"
ATTACKER = str(Path(__file__).with_name("rdzv_attacker.py"))
REFUSED_STATE = "refused the rendezvous state of run '{run_id}' from the rendezvous store"
# trains until the test writes END_FILE (the attackers' torch import may take longer than any
# fixed run on a loaded machine), 50 steps after it; 6000 steps (10 min) at the most
UNTIL_ENDED = {"STEPS": "6000", "QUIET_STEPS": "6000"}
SECRET = {SECRET_ENV: "the nodes of this job"}

STEPS = """
import os, time
import torch
import torch.distributed as dist
from torchx_elastic import progress
dist.init_process_group("gloo")
last, quiet = int(os.environ.get("STEPS", "80")), int(os.environ.get("QUIET_STEPS", "50"))
end_file, ended = os.environ.get("END_FILE"), torch.zeros(1)
step = 0
while step < last:
    if end_file:  # every rank learns of the file at the same step
        ended[0] = float(os.path.exists(end_file))
        dist.all_reduce(ended, op=dist.ReduceOp.MAX)
        if ended.item():
            end_file, quiet, last = None, step, step + 50
    else:
        dist.barrier()
    # the other nodes publish no report of their own while the attackers write theirs
    if os.environ["RANK"] == "0" or step >= quiet:
        progress(step + 1)
    time.sleep(0.1)
    step += 1
print(f"done world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def hosts() -> Iterator[None]:
    """h0, h1, h2 for this module, taken down after it (under the machine's netns lock)."""
    if os.geteuid() != 0 or not HOSTS_SH.is_file():
        unavailable(f"no netns hosts (root and {HOSTS_SH} needed)")
    with open(NETNS_LOCK, "w") as lock:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["bash", str(HOSTS_SH), "down"], capture_output=True)
        subprocess.run(["bash", str(HOSTS_SH), "up", "3"], check=True, capture_output=True)
        try:
            yield
        finally:
            subprocess.run(["bash", str(HOSTS_SH), "down"], capture_output=True)


def on(host: str, *argv: str) -> list[str]:
    return ["bash", str(HOSTS_SH), "exec", host, *argv]


def attack(*where: tuple[str, str], port: int, run_id: str, marker: Path) -> list[str]:
    """The attacker run at once from each (host, target address); their outputs."""
    runs = [
        subprocess.Popen(
            on(host, sys.executable, ATTACKER, target, str(port), run_id, str(marker)),
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host, target in where
    ]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        outputs.append(out)
    return outputs


def wait_for(path: Path, pattern: str) -> str:
    """What first matches ``pattern`` in ``path``, once it does."""

    def found() -> str | None:
        match = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        return match.group(0) if match else None

    return wait_until(found, what=f"{pattern!r} in {path}", every_s=0.2, detail=path.read_text)


def listeners(host: str) -> list[str]:
    """Local addresses of the listening TCP sockets on ``host`` (``ss -ltn``)."""
    out = subprocess.run(on(host, "ss", "-ltnpH"), capture_output=True, text=True, check=True)
    return [line.split()[3] for line in out.stdout.splitlines() if line.strip()]


def _is_loopback(address: str) -> bool:
    return address.startswith(("127.", "[::1]", "[::ffff:127."))


def test_local_cwd_2x2_listens_on_loopback_only_and_refuses_a_local_attacker(
    hosts: None, tmp_path: Path
) -> None:
    (tmp_path / "steps.py").write_text(STEPS)
    port = free_port()
    out, end = tmp_path / "torchx.out", tmp_path / "end"
    with open(out, "wb") as log:
        run = subprocess.Popen(
            on("h0", str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "2x2")
            + ["--rdzv_port", str(port), "--script", "steps.py"],
            cwd=tmp_path,
            env=_env({**UNTIL_ENDED, "END_FILE": str(end)}),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        app_id = wait_for(out, r"local_cwd://torchx/([\w-]+)").rsplit("/", 1)[1]
        wait_for(out, r"\[job progress\] \d+")
        # a single-host job: every store of the job (rendezvous, workers') on loopback only
        found = listeners("h0")
        assert f"127.0.0.1:{port}" in found
        assert all(_is_loopback(address) for address in found), found
        marker = tmp_path / "ran"
        other, local = attack(
            ("h1", "10.77.0.10"), ("h0", "127.0.0.1"), port=port, run_id=app_id, marker=marker
        )
        end.touch()
        assert other.strip() == "unreachable"  # nothing of the job listens for other hosts
        assert "read " in local and "replaced" in local
        assert run.wait(timeout=180) == 0, out.read_text()
    finally:
        run.kill()
    assert not marker.exists(), marker.read_text()
    logs = "\n".join(p.read_text() for p in tmp_path.glob("torchx_logs/**/*.log"))
    logs += out.read_text()
    assert REFUSED_STATE.format(run_id=app_id) in logs
    assert "SUCCEEDED" in out.read_text()
    # the job's log directory is its user's only, as torchrun's
    (session_dir,) = (tmp_path / "torchx_logs").iterdir()
    assert session_dir.stat().st_mode & 0o777 == 0o700
    assert (session_dir / app_id).stat().st_mode & 0o777 == 0o700


def _host_agent(
    host: str, port: int, tmp_path: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """One node of a two-host job started by hand, as torchrun's users do; it trains until
    ``tmp_path / "end"`` exists."""
    log = tmp_path / f"{host}.log"
    argv = [sys.executable, "-m", "torchx_elastic.agent", "--nnodes", "2"]
    argv += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    argv += [f"h0:{port}", "--rdzv-id", "job", "--log-dir", str(tmp_path / f"logs-{host}")]
    argv += ["--rdzv-conf", "join_timeout=60", "steps.py"]
    gloo = {"GLOO_SOCKET_IFNAME": f"veth-{host}"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            on(host, *argv),
            cwd=tmp_path,
            env=_env({**env, **gloo, **UNTIL_ENDED, "END_FILE": str(tmp_path / "end")}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_two_host_job_refuses_a_client_on_another_host_and_a_local_one(
    hosts: None, tmp_path: Path
) -> None:
    (tmp_path / "steps.py").write_text(STEPS)
    port = free_port()
    agents = [_host_agent(h, port, tmp_path, SECRET) for h in ("h0", "h1")]
    try:
        wait_for(tmp_path / "h0.log", r"\[job progress\] \d+")
        # the rendezvous store listens on h0's address, where the peers reach it, only
        assert f"10.77.0.10:{port}" in listeners("h0")
        assert f"0.0.0.0:{port}" not in listeners("h0") and f"*:{port}" not in listeners("h0")
        marker = tmp_path / "ran"
        # a client on another host, a process on the job's host
        for text in attack(
            ("h2", "10.77.0.10"), ("h0", "10.77.0.10"), port=port, run_id="job", marker=marker
        ):
            assert "read " in text and "replaced" in text
        (tmp_path / "end").touch()
        codes = [agent.wait(timeout=180) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    logs = [(tmp_path / f"{h}.log").read_text() for h in ("h0", "h1")]
    assert codes == [0, 0], logs
    assert not marker.exists(), marker.read_text()
    refused = [log.count(REFUSED_STATE.format(run_id="job")) for log in logs]
    for log, count in zip(logs, refused, strict=True):
        assert "done world 2" in log
        assert count <= 2, log  # one line for each refused value, not one per read
    # every node reads the next round's opening while it is there: each refuses the forgery
    assert all(refused), logs
    assert f"skipped node 1's progress report from the store: '{PROGRESS_KEY_PREFIX}1'" in logs[0]
    assert (tmp_path / "logs-h0").stat().st_mode & 0o777 == 0o700


def test_unauthenticated_job_says_so_once_and_skips_a_malformed_progress_report(
    tmp_path: Path,
) -> None:
    """Nodes without a secret (and nodes of two package versions): a malformed report from
    the store is skipped with a warning; the job succeeds."""
    (tmp_path / "steps.py").write_text(STEPS)
    port = free_port()
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    agents = [
        start_agent(
            *["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"],
            *["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job"],
            *["--rdzv-conf", f"is_host={str(i == 0).lower()}", "steps.py"],
            cwd=tmp_path,
            log=log,
            env={**UNTIL_ENDED, "END_FILE": str(tmp_path / "end")},
        )
        for i, log in enumerate(logs)
    ]
    try:
        wait_for(logs[0], r"\[job progress\] \d+")
        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        store = TCPStore("127.0.0.1", port, is_master=False)
        report = b'{"node":1,"seq":999,"final":false,"ranks":[[1,"x",10,1.0,0.0,0]]}'
        skipped = "skipped node 1's progress report from the store: not a node progress report"
        # written until node 0 read one (node 1's agent publishes its own now and then)
        deadline = time.monotonic() + DEADLINE_S  # a bound on a hang
        while skipped not in logs[0].read_text() and time.monotonic() < deadline:
            try:
                for round_ in range(4):
                    key = f"torch.rendezvous.job.{round_}/{PROGRESS_KEY_PREFIX}1"
                    store.set(key, report)
            except RuntimeError:  # the job ended: its store is gone
                break
            time.sleep(0.02)  # writes a moment apart (not a wait for an event)
        del store  # its connection closed, as an attacker's would
        (tmp_path / "end").touch()
        codes = [agent.wait(timeout=180) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], texts
    for text in texts:
        assert text.count("this multi-node rendezvous is NOT authenticated") == 1
    assert (
        "skipped node 1's progress report from the store: not a node progress report:"
        " 'x' is not a whole number" in texts[0]
    )


HANGING = """
import os, time
from torchx_elastic import heartbeat
for i in range(60):
    heartbeat()
    if os.environ["RANK"] == "1" and i == 3:
        while True:
            time.sleep(0.5)
    time.sleep(0.1)
"""


def test_a_spoofed_heartbeat_does_not_hide_a_hung_rank(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(HANGING)
    log = tmp_path / "agent.log"
    agent = start_agent(
        *["--nproc-per-node", "2", "--hang-timeout-s", "3", "hang.py"], cwd=tmp_path, log=log
    )
    try:
        # the channel's abstract socket, as any local user finds it in /proc/net/unix
        def channel() -> str | None:
            table = Path("/proc/net/unix").read_text()
            found = re.search(rf"@(torchx-elastic-{agent.pid}-[0-9a-f]+)", table)
            return f"\0{found.group(1)}" if found else None

        address = wait_until(channel, what="the agent's worker channel", every_s=0.1)
        deadline = time.monotonic() + DEADLINE_S  # a bound on a hang
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as spoofer:
            while agent.poll() is None and time.monotonic() < deadline:
                try:
                    spoofer.sendto(b"h 1 0", address)  # "rank 1 is alive"
                except OSError:
                    break
                time.sleep(0.2)  # a spoofed heartbeat every moment (not a wait for an event)
        assert agent.wait(timeout=60) == 1
    finally:
        agent.kill()
    text = log.read_text()
    assert "hang: rank 1 sent no progress or heartbeat for 3s (--hang-timeout-s)" in text
    assert (
        f"refused messages on the worker channel from pid {os.getpid()} (uid {os.getuid()}):"
        " not a worker of this agent" in text
    )
