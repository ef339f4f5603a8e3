"""A rendezvous port that a firewall drops, between two simulated hosts (issue 31).

On ``../shared/netns/hosts.sh`` hosts (root; the fixture takes the machine's netns lock), h0
drops every packet to the rendezvous port (an iptables DROP rule inside its namespace) and
a node on h1 points at it: it says "no answer from h0:PORT ...; a firewall?", retries, and
that is its error at the join timeout. The doctor on h1 says so too, and that
``GLOO_SOCKET_IFNAME=lo`` (given to both) is not the interface the traffic to h0 leaves
through.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _env
from tests.e2e.agents import wait_for_text
from tests.e2e.test_rendezvous_security import hosts, on

__all__ = ["hosts"]  # the module's fixture: h0..h2 under the netns lock

pytestmark = pytest.mark.slow
PORT = 29531


def test_a_dropped_port_is_named_a_firewall(hosts: None, tmp_path: Path) -> None:
    rule = ["INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP"]
    subprocess.run(on("h0", "iptables", "-A", *rule), check=True)
    (tmp_path / "ok.py").write_text("print('trained')\n")
    log = tmp_path / "h1.log"
    argv = [sys.executable, "-m", "torchx_elastic.agent", "--nnodes", "2", "--nproc-per-node"]
    argv += ["1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"h0:{PORT}", "--rdzv-id", "job"]
    argv += ["--rdzv-conf", "join_timeout=15", "ok.py"]
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                on("h1", *argv),
                cwd=tmp_path,
                env=_env({"GLOO_SOCKET_IFNAME": "lo"}),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for_text(
            log,
            f"torchx-elastic: rendezvous at h0:{PORT}: no answer from h0:{PORT} within 3s; a"
            f" firewall?; open TCP port {PORT} on h0 to this node",
        )
        said = log.read_text()
        assert "; retrying until " in said, said
        # the workers' interface, named before the rendezvous
        assert (
            "torchx-elastic: warning: GLOO_SOCKET_IFNAME=lo, but the rendezvous traffic to h0"
            " leaves through veth-h1: the workers may not reach their peers; set"
            " GLOO_SOCKET_IFNAME=veth-h1"
        ) in said, said
        wait_for_text(log, f"torchx-elastic: error: rendezvous at h0:{PORT} failed: no answer from")
        assert proc.wait(60) == 1
        assert "Traceback" not in log.read_text()
        # the doctor on h1 says the same, and names the interface the traffic to h0 uses
        doctor = [sys.executable, "-m", "torchx_elastic.agent.doctor", *argv[3:]]
        done = subprocess.run(
            on("h1", *doctor),
            env=_env({"GLOO_SOCKET_IFNAME": "lo"}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        print(done.stdout)
        assert done.returncode == 1
        assert f"  FAIL no answer from h0:{PORT} within 3s; a firewall?" in done.stdout
        assert "  ok   rendezvous traffic to h0 leaves through veth-h1" in done.stdout
        assert (
            "  FAIL GLOO_SOCKET_IFNAME=lo, but the rendezvous traffic to h0 leaves through"
            " veth-h1: the workers may not reach their peers; set GLOO_SOCKET_IFNAME=veth-h1"
        ) in done.stdout
        assert (
            "  ok   this node publishes 'h1' (socket.getfqdn(), torch's default) = 10.77.0.11"
            in (done.stdout)
        )
    finally:
        subprocess.run(on("h0", "iptables", "-D", *rule))


def test_gloos_own_choice_of_a_loopback_address_is_named(hosts: None, tmp_path: Path) -> None:
    """No GLOO_SOCKET_IFNAME: gloo binds the workers to the first address of the host's name.
    On h1 that is its own address; a host whose name resolves to loopback (Debian's
    127.0.1.1 line, here the name ``localhost``) is named by the doctor and the agent."""
    env = {k: v for k, v in _env().items() if not k.endswith("_SOCKET_IFNAME")}
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    flags += ["--rdzv-endpoint", f"h0:{PORT}", "--rdzv-id", "job", "--rdzv-conf", "join_timeout=8"]
    doctor = [sys.executable, "-m", "torchx_elastic.agent.doctor", *flags]
    as_localhost = ["sh", "-c", 'hostname localhost && exec "$@"', "as-localhost"]

    own = subprocess.run(on("h1", *doctor), env=env, capture_output=True, text=True, timeout=120)
    assert (
        "  ok   GLOO_SOCKET_IFNAME is unset: gloo binds the workers to 'h1' = 10.77.0.11 on veth-h1"
        in own.stdout
    ), own.stdout
    loopback = subprocess.run(
        on("h1", *as_localhost, *doctor), env=env, capture_output=True, text=True, timeout=120
    )
    named = (
        "GLOO_SOCKET_IFNAME is unset and this host's name 'localhost' resolves to 127.0.0.1:"
        " gloo binds the workers to 127.0.0.1, a loopback address the other hosts cannot"
        " reach; set GLOO_SOCKET_IFNAME=veth-h1"
    )
    assert f"  FAIL {named}" in loopback.stdout, loopback.stdout
    (tmp_path / "ok.py").write_text("print('trained')\n")
    agent = subprocess.run(
        on("h1", *as_localhost, sys.executable, "-m", "torchx_elastic.agent", *flags, "ok.py"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"torchx-elastic: warning: {named}\n" in agent.stderr, agent.stderr
    assert agent.returncode == 1  # nothing at h0: the join timeout
