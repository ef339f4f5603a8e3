"""An elastic job of real agents on simulated hosts (``../shared/netns/hosts.sh``: network
namespaces on one bridge), and the faults of a real network: a host cut off, a host killed."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.ci import unavailable
from tests.conftest import REPO, _env
from tests.waiting import wait_until

# ../shared beside the repo (CI); TORCHX_ELASTIC_NETNS_HOSTS names another copy (a worktree)
HOSTS_SH = Path(os.environ.get("TORCHX_ELASTIC_NETNS_HOSTS", REPO.parent / "shared/netns/hosts.sh"))
LOOP = Path(__file__).with_name("allreduce_loop.py")
STEP_LINE = re.compile(r"step (\d+) world (\d+) at ([\d.]+)")
DONE_LINE = re.compile(r"done world (\d+) at ([\d.]+)")
LOCK = "/tmp/netns.lock"  # the hosts are one per machine: one test (of any checkout) at a time
WAIT_S = 150.0  # for the agents' ends after a fault: a bound on a hang, not a speed
HOSTS = ("h0", "h1", "h2")
# the frames of torch's C++ warnings (a store call to a lost host prints ~25 lines each)
CPP_FRAME = re.compile(
    r"^(\[n\d+ r\d+\] )?(frame #\d+: |Exception raised from |<omitting python frames>)"
)


def hosts(*args: str) -> str:
    out = subprocess.run(["bash", str(HOSTS_SH), *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"hosts.sh {' '.join(args)}: {out.stderr.strip()}")
    return out.stderr


def pids_in(host: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@dataclass
class Job:
    """One agent per host h0..h(n-1), ``--nnodes 2:n`` (or ``nnodes``), c10d rendezvous
    on h0."""

    workdir: Path
    n: int = 3
    nnodes: str = ""  # --nnodes, when not 2:n (``2``: a fixed size, the third host a spare)
    steps: int = 200
    step_s: float = 0.05
    until_world: int = 0  # a smaller world steps on until a restart makes it this big
    hold_file: Path | None = None  # the loop steps on until this file exists (release())
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ended_s: dict[str, float] = field(default_factory=dict)

    def log(self, host: str) -> Path:
        return self.workdir / f"{host}.log"

    def start(self, *extra: str) -> None:
        for i in range(self.n):
            self.start_host(f"h{i}", *extra)

    def start_host(self, host: str, *extra: str) -> None:
        """The agent of ``host`` (again: its log goes on, its end is forgotten)."""
        self.ended_s.pop(host, None)
        command = [
            "bash", str(HOSTS_SH), "exec", host,
            "env", f"GLOO_SOCKET_IFNAME=veth-{host}", f"UNTIL_WORLD={self.until_world}",
            f"HOLD_FILE={self.hold_file or ''}",
            sys.executable, "-m", "torchx_elastic.agent",
            f"--nnodes={self.nnodes or f'2:{self.n}'}", "--nproc-per-node=1", "--max-restarts=3",
            "--rdzv-backend=c10d", "--rdzv-endpoint=h0:29500", "--rdzv-id=job",
            *extra, str(LOOP), str(self.steps), str(self.step_s),
        ]  # fmt: skip
        with open(self.log(host), "ab") as out:
            self.agents[host] = subprocess.Popen(
                command, cwd=self.workdir, env=_env(), stdout=out, stderr=subprocess.STDOUT
            )

    def release(self) -> None:
        """Let the loop end (its ranks stop at their next step): see ``hold_file``."""
        assert self.hold_file is not None
        self.hold_file.touch()

    def text(self) -> str:
        return "".join(self.log(h).read_text(errors="replace") for h in self.agents)

    def shown(self) -> str:
        """Every host's log under its name, less the frames of torch's C++ warnings: what a
        failed assertion prints (the checks read :meth:`text`)."""
        return "".join(
            f"===== {host}\n"
            + "".join(
                line
                for line in self.log(host).read_text(errors="replace").splitlines(keepends=True)
                if line.strip() and not CPP_FRAME.match(line)
            )
            for host in self.agents
        )

    def steps_seen(self) -> list[tuple[int, int, float]]:
        """(step, world, wall time) of every step line of every host."""
        return sorted(
            ((int(s), int(w), float(t)) for s, w, t in STEP_LINE.findall(self.text())),
            key=lambda x: x[2],
        )

    def wait_for_step(self, step: int) -> None:
        def reached() -> bool:
            self.poll()
            return any(s >= step for s, _, _ in self.steps_seen())

        wait_until(reached, what=f"step {step}", every_s=0.2, detail=self.shown)

    def poll(self) -> None:
        for host, agent in self.agents.items():
            if host not in self.ended_s and agent.poll() is not None:
                self.ended_s[host] = time.time()

    def wait(self, hosts: list[str], timeout_s: float) -> dict[str, int | None]:
        """Each host's agent exit code, None for one still running after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(self.agents[h].poll() is None for h in hosts):
            self.poll()
            time.sleep(0.1)
        self.poll()
        return {h: self.agents[h].poll() for h in hosts}

    def kill_host(self, host: str) -> None:
        """Every process of ``host`` SIGKILLed at once (a crashed machine whose kernel still
        answers: its peers get TCP resets)."""
        for pid in pids_in(host):
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)

    def stop(self) -> None:
        for agent in self.agents.values():
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        for i in range(self.n):
            for pid in pids_in(f"h{i}"):
                subprocess.run(["kill", "-9", str(pid)], capture_output=True)


def available() -> str | None:
    """Why the hosts cannot be made here, or None."""
    if not HOSTS_SH.exists():
        return f"no {HOSTS_SH}: the network tests need ../shared/netns beside the repo"
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        return "the network tests need iproute2 and iptables"
    if os.geteuid() != 0:
        return "the network tests need root (network namespaces)"
    return None


@contextlib.contextmanager
def netns_job(tmp_path: Path) -> Iterator[Job]:
    """Three fresh hosts, one test at a time on this machine, and a job on them (stopped,
    and the hosts removed, at the end)."""
    reason = available()
    if reason is not None:
        unavailable(reason)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hosts("down", "3")  # what an interrupted run left
        hosts("up", "3")
        job = Job(tmp_path)
        try:
            yield job
        finally:
            job.stop()
            hosts("down", "3")


def assert_resumed(job: Job, fault_s: float) -> None:
    """World 2 trained after the fault; how soon is printed (the figure docs/agent.md
    quotes: ``pytest -s tests/netns`` shows it)."""
    firsts = [t for _, world, t in job.steps_seen() if world == 2 and t > fault_s]
    assert firsts, f"no step of world 2 after the fault:\n{job.shown()}"
    print(f"\n[netns] world 2 trains {firsts[0] - fault_s:.1f}s after the fault")


def assert_nothing_left(job: Job) -> None:
    """Every process of the job gone from every host (soon after its agent's exit)."""

    def left() -> dict[str, list[int]]:
        return {h: pids_in(h) for h in HOSTS if pids_in(h)}

    wait_until(lambda: not left(), what="no process of the job on any host", detail=left)
