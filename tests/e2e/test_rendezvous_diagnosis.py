"""A rendezvous that explains itself (issue 31), one host: every case named.

All scenarios start at once (real agents, each on its own port) and each test reads one
scenario's output: the line must name the cause, in the order the agent says it (how soon
each case is named is a speed, not checked here: a busy machine says it later).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ci import unavailable
from tests.e2e.agents import free_port, start_agent
from tests.waiting import DEADLINE_S, wait_until
from torchx_elastic.contract import SECRET_ENV, WAITING_FILE_PREFIX

pytestmark = pytest.mark.slow

SECRET = {SECRET_ENV: "diagnosis tests"}
# torch's import (18 agents at once on a loaded 2-core machine) comes first: waits count
# from the agent's log directory (made once torch is imported)
IMPORT_S = 240.0


@dataclass
class Agent:
    log: Path
    log_dir: Path
    proc: subprocess.Popen[bytes]
    ready: float | None = None

    def up(self) -> float:
        """When the agent was up (it makes its log directory once torch is imported)."""
        if self.ready is None:
            wait_until(self.log_dir.exists, what=f"{self.log_dir} made", timeout_s=IMPORT_S)
            self.ready = time.monotonic()
        return self.ready

    def wait_for(self, text: str, peer: Agent | None = None) -> None:
        """Until ``text`` is in the agent's output, once the agent (and ``peer``) is up."""
        self.up()
        if peer is not None:
            peer.up()
        wait_until(
            lambda: text in self.output(),
            what=f"{text!r} in {self.log}",
            timeout_s=DEADLINE_S,
            every_s=0.1,
            detail=self.output,
        )

    def said(self, text: str) -> None:
        """``text`` is in the output already (said with, or before, what was awaited)."""
        assert text in self.output(), f"{text!r} not in {self.log}:\n{self.output()}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def exit_code(self, timeout_s: float = 60) -> int:
        return self.proc.wait(timeout_s)


# an address of TEST-NET-3 (RFC 5737) whose packets this machine drops while the cases run:
# it resolves (it is an address) and answers nobody, as a peer's address on another network
SILENT = "203.0.113.7"
SILENT_DROPPED: list[bool] = []  # whether the cases could drop it (root and iptables)
DROP_SILENT = ["OUTPUT", "-d", SILENT, "-j", "DROP", "-m", "comment", "--comment", "tests"]


class Scenarios:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "ok.py").write_text("print('trained')\n")
        self.agents: list[Agent] = []
        self.blocker = socket.socket()
        try:
            dropped = subprocess.run(["iptables", "-w", "-I", *DROP_SILENT], capture_output=True)
            self.silent = dropped.returncode == 0
        except OSError:  # no iptables here
            self.silent = False

    def agent(
        self, name: str, endpoint: str, *args: str, nnodes: str = "2", secret: str = ""
    ) -> Agent:
        argv = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        argv += ["--rdzv-endpoint", endpoint, "--rdzv-id", "job", "--log-dir"]
        log_dir = self.root / f"logs-{name}"
        argv += [str(log_dir), *args, "ok.py"]
        log = self.root / f"{name}.log"
        env = {SECRET_ENV: secret} if secret else SECRET
        agent = Agent(log, log_dir, start_agent(*argv, cwd=self.root, log=log, env=env))
        self.agents.append(agent)
        return agent

    def close(self) -> None:
        for agent in self.agents:
            if agent.proc.poll() is None:
                agent.proc.kill()
            agent.proc.wait()
        self.blocker.close()
        if self.silent:
            subprocess.run(["iptables", "-w", "-D", *DROP_SILENT], check=False)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Agent]]:
    s = Scenarios(tmp_path_factory.mktemp("diagnosis"))
    ports = {
        name: free_port()
        for name in (
            *("alone", "mismatch", "shared", "taken", "addr", "reach", "secret", "static"),
            *("backend", "static_alone"),
        )
    }
    s.blocker.bind(("127.0.0.1", ports["taken"]))
    s.blocker.listen()
    timeout = ("--rdzv-conf", "join_timeout=14")
    found = {
        "alone": s.agent("alone", f"localhost:{ports['alone']}", *timeout),
        "unresolvable": s.agent("unresolvable", "no-such-host.invalid:29511", *timeout),
        "refused": s.agent(
            "refused", f"127.0.0.1:{free_port()}", "--rdzv-conf", "is_host=false,join_timeout=14"
        ),
        "mismatch_a": s.agent("mismatch_a", f"localhost:{ports['mismatch']}", *timeout),
        "taken_host": s.agent(
            "taken_host", f"127.0.0.1:{ports['taken']}", "--rdzv-conf", "is_host=true"
        ),
        "taken": s.agent("taken", f"127.0.0.1:{ports['taken']}", *timeout),
        "shared_a": s.agent("shared_a", f"localhost:{ports['shared']}", *timeout),
        "addr_a": s.agent("addr_a", f"localhost:{ports['addr']}", *timeout),
        "reach_a": s.agent("reach_a", f"localhost:{ports['reach']}", *timeout, nnodes="3"),
        "secret_a": s.agent("secret_a", f"localhost:{ports['secret']}", *timeout),
        "backend_c10d": s.agent("backend_c10d", f"localhost:{ports['backend']}", *timeout),
    }
    static = ("--rdzv-backend", "static", "--node-rank")
    for name, rank in (("static_0", "0"), ("static_1a", "1"), ("static_1b", "1")):
        found[name] = s.agent(name, f"localhost:{ports['static']}", *static, rank, nnodes="3")
    found["backend_static"] = s.agent(
        "backend_static", f"localhost:{ports['backend']}", *static, "1", *timeout
    )
    found["static_alone"] = s.agent(
        "static_alone",
        f"localhost:{ports['static_alone']}",
        *static,
        "0",
        "--rdzv-conf",
        "timeout=14",
    )
    found["static_refused"] = s.agent(
        "static_refused", f"127.0.0.1:{free_port()}", *static, "1", *timeout
    )
    # the hosts start first, as a job's first node usually does (a start order, not a wait
    # for an event: each second node could host too)
    time.sleep(1.0)
    found["mismatch_b"] = s.agent(
        "mismatch_b", f"localhost:{ports['mismatch']}", *timeout, nnodes="3"
    )
    found["shared_b"] = s.agent(
        "shared_b", f"localhost:{ports['shared']}", "--rdzv-id", "other", *timeout
    )
    found["addr_b"] = s.agent(
        "addr_b", f"localhost:{ports['addr']}", "--local-addr", "nowhere.invalid", *timeout
    )
    found["reach_b"] = s.agent(
        "reach_b", f"localhost:{ports['reach']}", "--local-addr", SILENT, *timeout, nnodes="3"
    )
    found["secret_b"] = s.agent(
        "secret_b", f"localhost:{ports['secret']}", *timeout, secret="another secret"
    )
    SILENT_DROPPED[:] = [s.silent]
    try:
        yield found
    finally:
        s.close()


def test_a_waiting_node_says_what_it_waits_for_then_why_it_gave_up(
    cases: dict[str, Agent],
) -> None:
    alone = cases["alone"]
    alone.wait_for("waiting for nodes: 1 of 2 joined; here: ")
    alone.wait_for("missing: 1 node; hosting the rendezvous at localhost:")
    assert "run id 'job'; gives up at " in alone.output()
    assert "(join timeout 14s)" in alone.output()
    # the job-wide progress line of the rendezvous host says so too
    alone.wait_for("[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node\n")
    # the same state for torchx status, in the agent's log directory, while it waits
    # (written just after the line is said)
    files = wait_until(
        lambda: list((alone.log.parent / "logs-alone").glob(f"{WAITING_FILE_PREFIX}*.json")),
        what="the waiting file of the node that waits",
    )
    assert "waiting for nodes: 1 of 2 joined" in files[0].read_text()
    alone.wait_for("error: rendezvous at localhost:")
    alone.said(": only 1 of 2 nodes joined within 14s (here: ")
    assert "start the missing node(s) with --rdzv-endpoint localhost:" in alone.output()
    assert "Traceback" not in alone.output()
    assert alone.exit_code() == 1
    assert not list((alone.log.parent / "logs-alone").glob(f"{WAITING_FILE_PREFIX}*.json"))


def test_a_static_host_says_what_it_waits_for_then_why_it_gave_up(
    cases: dict[str, Agent],
) -> None:
    """Node rank 0 of a static rendezvous whose other node never starts (torch's store
    blocks it silently until the timeout, then raises DistStoreError with a traceback)."""
    agent = cases["static_alone"]
    agent.wait_for(
        "torchx-elastic: waiting for nodes: this node (--node-rank 0) hosts the static"
        " rendezvous at localhost:",
    )
    agent.said(" and waits for the other 1 node (--node-rank 1) to connect; gives up at ")
    assert "(--rdzv-conf timeout=14)" in agent.output()
    agent.wait_for("torchx-elastic: error: rendezvous at localhost:")
    assert (
        " failed: only 1 of 2 nodes connected to this node's static rendezvous within 14s;"
        " start the missing node(s) with --rdzv-backend static --rdzv-endpoint localhost:"
    ) in agent.output()
    assert "Traceback" not in agent.output()
    assert agent.exit_code() == 1


def test_an_endpoint_that_does_not_resolve_is_named_retried_then_the_error(
    cases: dict[str, Agent],
) -> None:
    agent = cases["unresolvable"]
    agent.wait_for(
        "torchx-elastic: rendezvous at no-such-host.invalid:29511: host 'no-such-host.invalid'"
        " does not resolve from this node (",
    )
    agent.said("; retrying until ")
    agent.wait_for(
        "torchx-elastic: error: rendezvous at no-such-host.invalid:29511 failed: host"
        " 'no-such-host.invalid' does not resolve from this node",
    )
    assert "check the host name in --rdzv-endpoint no-such-host.invalid:29511" in agent.output()
    assert agent.exit_code() == 1


@pytest.mark.parametrize("name", ["refused", "static_refused"])
def test_nothing_listening_is_named_refused(cases: dict[str, Agent], name: str) -> None:
    """c10d, and a static node of --node-rank 1 whose rank 0 never started."""
    agent = cases[name]
    agent.wait_for("(connection refused); start the node that hosts the rendezvous")
    agent.said("; retrying until ")
    agent.wait_for("torchx-elastic: error: rendezvous at 127.0.0.1:")
    assert agent.output().count("nothing listens at 127.0.0.1:") >= 2
    assert agent.exit_code() == 1


def test_nodes_with_other_nnodes_are_named_with_both_values_and_hosts(
    cases: dict[str, Agent],
) -> None:
    host = socket.gethostname()
    for name, mine, theirs in (("mismatch_a", 2, 3), ("mismatch_b", 3, 2)):
        agent = cases[name]
        peer = cases["mismatch_b" if name == "mismatch_a" else "mismatch_a"]
        agent.wait_for("failed: nodes disagree on --nnodes: ", peer)
        text = agent.output()
        assert f"--nnodes: {mine} on {host} (pid {agent.proc.pid}), {theirs} on {host}" in text
        assert "start every node of run id 'job' with the same --nnodes" in text
        assert agent.exit_code() == 1


def test_nodes_on_other_rendezvous_backends_are_named_by_both(cases: dict[str, Agent]) -> None:
    """A c10d node hosts the endpoint; a static node of --node-rank 1 reaches its store."""
    host = socket.gethostname()
    c10d, static = cases["backend_c10d"], cases["backend_static"]
    for agent, mine, peer, theirs in (
        (c10d, "c10d", static, "static"),
        (static, "static", c10d, "c10d"),
    ):
        agent.wait_for("failed: nodes disagree on --rdzv-backend: ", peer)
        assert (
            f"--rdzv-backend: {mine} on {host} (pid {agent.proc.pid}), {theirs} on {host}"
            f" (pid {peer.proc.pid}); start every node of run id 'job' with the same"
            " --rdzv-backend"
        ) in agent.output()
        assert agent.exit_code() == 1


def test_a_port_taken_on_the_rendezvous_host_is_named(cases: dict[str, Agent]) -> None:
    hosting = cases["taken_host"]
    hosting.wait_for(
        " on this host, which should serve the rendezvous, is taken by another program; stop"
        " it or pick a free port (--rdzv-endpoint 127.0.0.1:PORT, dist.ddp --rdzv_port)",
    )
    assert hosting.exit_code() == 1
    # without is_host the agent takes the program on its port for another agent's store
    other = cases["taken"]
    other.wait_for("has not answered as a rendezvous store for 8s (its host is starting")
    other.wait_for("is not a rendezvous store (another program took the port)")
    assert other.exit_code() == 1


def test_two_jobs_on_one_endpoint_are_told(cases: dict[str, Agent]) -> None:
    for name, other in (("shared_a", "'other'"), ("shared_b", "'job'")):
        cases[name].wait_for(
            "warning: another job uses the rendezvous endpoint localhost:",
            cases["shared_b"],
        )
        cases[name].said(f"(run id {other} on ")
        assert "give each job its own --rdzv-endpoint port" in cases[name].output()


def test_a_published_address_peers_cannot_resolve_is_named(cases: dict[str, Agent]) -> None:
    agent = cases["addr_a"]
    agent.wait_for(
        f"(pid {cases['addr_b'].proc.pid}) publishes its address as 'nowhere.invalid', which"
        " does not resolve on ",
        cases["addr_b"],
    )
    assert "start that node with --local-addr set to an address its peers reach" in (agent.output())


def test_a_published_address_peers_cannot_reach_is_named(cases: dict[str, Agent]) -> None:
    if not all(SILENT_DROPPED):
        unavailable(f"iptables cannot drop {SILENT} here (root and iptables: .ci/run installs it)")
    agent = cases["reach_a"]
    agent.wait_for(
        f"(pid {cases['reach_b'].proc.pid}) publishes its address as '{SILENT}', which"
        f" {socket.gethostname()} (pid {agent.proc.pid}) cannot reach (no reply to a"
        " connection on port ",
        cases["reach_b"],
    )
    assert (
        "within 2s: an address of another network, or a firewall); start that node with"
        " --local-addr set to an address its peers reach (torch publishes socket.getfqdn()"
        " by default)"
    ) in agent.output()
    assert agent.output().count(f"publishes its address as '{SILENT}'") == 1  # said once


def test_a_node_given_another_secret_is_named(cases: dict[str, Agent]) -> None:
    cases["secret_a"].wait_for(
        f"warning: {socket.gethostname()} (pid {cases['secret_b'].proc.pid}) came to run id 'job'"
        " with another secret (or none): its rendezvous state is refused; give every node the"
        " same TORCHX_ELASTIC_RDZV_SECRET (docs/security.md)",
        cases["secret_b"],
    )


def test_a_node_rank_given_twice_is_named_by_every_node(cases: dict[str, Agent]) -> None:
    """Static rendezvous, --nnodes 3, node ranks 0, 1, 1: torchrun's nodes wait silently."""
    host = socket.gethostname()
    nodes = [cases["static_0"], cases["static_1a"], cases["static_1b"]]
    last = max(nodes, key=Agent.up)  # detectable once all three are up
    fix = "; give each node its own --node-rank, 0 to --nnodes - 1"
    nodes[0].wait_for(f"failed: --node-rank 1 was given to {host} (pid ", last)
    assert f"; no node has --node-rank 2 of 3{fix}" in nodes[0].output()
    ones = nodes[1:]
    wait_until(
        lambda: any("is taken by" in a.output() for a in ones),
        what="one of the two nodes of --node-rank 1 told that it is taken",
        detail=lambda: "\n".join(a.output() for a in ones),
    )
    late = [a for a in ones if "is taken by" in a.output()]
    (first,) = [a for a in ones if a is not late[0]]
    late[0].wait_for(
        f"failed: --node-rank 1 is taken by {host} (pid {first.proc.pid}), which joined first{fix}",
        last,
    )
    first.wait_for(f"failed: --node-rank 1 was given to {host} (pid ", last)
    for agent in nodes:
        assert agent.exit_code() == 1, agent.output()
        assert "Traceback" not in agent.output()
