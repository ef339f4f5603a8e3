"""``python -m torchx_elastic.agent.doctor``: one line per check, what would fail (issue 31)."""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys

import pytest

from tests.conftest import _env
from tests.e2e.agents import free_port
from torchx_elastic.agent import doctor
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import network_checks

FLAGS = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-id", "job"]


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = doctor.main([*FLAGS, *argv, "train.py", "--lr", "0.1"])
    return code, capsys.readouterr().out


def test_an_endpoint_that_does_not_resolve(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--rdzv-endpoint", "no-such-host.invalid:29500")
    assert code == 1
    assert out.startswith(
        f"torchx-elastic doctor on {socket.gethostname()}: rendezvous c10d at"
        " no-such-host.invalid:29500, run id 'job', --nnodes 2\n"
    )
    assert "  FAIL host 'no-such-host.invalid' does not resolve from this node (" in out
    assert out.endswith("problem(s)\n")


def test_the_host_of_the_rendezvous_checks_its_port(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code, out = check(capsys, "--rdzv-endpoint", f"localhost:{port}", "--local-addr", "127.0.0.1")
    assert "  ok   localhost resolves to 127.0.0.1" in out
    assert f"  ok   this host serves the rendezvous: port {port} is free" in out
    assert "  ok   this node publishes '127.0.0.1' (--local-addr) = 127.0.0.1" in out
    assert "  ok   rendezvous traffic to localhost leaves through lo" in out
    assert out.endswith("nothing would fail\n") and code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        code, out = check(
            capsys, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=1"
        )
    assert code == 1
    assert f"  FAIL port {port} on this host, which should serve the rendezvous, is taken" in out


def test_a_node_that_connects(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed import TCPStore

    # the client of the program that is no store ends within the test (2 x this)
    monkeypatch.setattr(doctor, "STORE_ANSWER_S", 1.0)
    port = free_port()
    remote = ("--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=false")
    code, out = check(capsys, *remote)
    assert code == 1
    assert f"  FAIL nothing listens at 127.0.0.1:{port} (connection refused); start the node" in out
    store = TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=5))
    code, out = check(capsys, *remote)
    assert f"  ok   127.0.0.1:{port} answers as a rendezvous store" in out
    del store
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        code, out = check(capsys, *remote)
    assert code == 1
    assert f"  FAIL the program listening at 127.0.0.1:{port} is not a rendezvous store" in out


def test_a_published_address_that_does_not_resolve_or_is_loopback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = check(capsys, "--rdzv-endpoint", "localhost:29500", "--local-addr", "x.invalid")
    assert code == 1
    assert (
        "  FAIL this node publishes 'x.invalid' (--local-addr), which does not resolve; set"
        " --local-addr to an address the other nodes reach"
    ) in out
    config = doctor_config("192.0.2.1:29500", "--local-addr", "localhost")
    found = doctor.published_address_check(config)
    assert not found.ok
    assert found.text == (
        "this node publishes 'localhost' (--local-addr), a loopback address (127.0.0.1) that"
        " other hosts cannot reach; set --local-addr to an address the other nodes reach"
    )


def doctor_config(endpoint: str, *argv: str) -> AgentConfig:
    from torchx_elastic.agent.config.cli import build_parser
    from torchx_elastic.agent.config.launch import config_from_args

    args = build_parser().parse_args([*FLAGS, "--rdzv-endpoint", endpoint, *argv, "t.py"])
    return config_from_args(args)


IFACES = {"lo": "127.0.0.1", "eth0": "10.1.0.5", "ib0": "10.2.0.5"}


def test_the_interfaces_gloo_and_nccl_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network_checks, "interface_addresses", lambda: IFACES)
    monkeypatch.setattr(network_checks, "route_address", lambda host, port: "10.1.0.5")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth1")
    lines = [c.line() for c in network_checks.interface_checks(doctor_config("10.1.0.1:29500"))]
    assert lines == [
        "  ok   interfaces: eth0 10.1.0.5, ib0 10.2.0.5, lo 127.0.0.1",
        "  ok   rendezvous traffic to 10.1.0.1 leaves through eth0",
        "  FAIL GLOO_SOCKET_IFNAME=ib0, but the rendezvous traffic to 10.1.0.1 leaves through"
        " eth0: the workers may not reach their peers; set GLOO_SOCKET_IFNAME=eth0",
        "  FAIL NCCL_SOCKET_IFNAME=eth1: no interface eth1 on this host (it has eth0, ib0, lo)",
    ]
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    lines = [c.line() for c in network_checks.interface_checks(doctor_config("10.1.0.1:29500"))]
    assert lines[-1] == "  ok   GLOO_SOCKET_IFNAME=eth0"


def test_the_module_runs_as_a_command() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchx_elastic.agent.doctor",
            *FLAGS,
            "--rdzv-endpoint",
            "a.invalid",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "  FAIL host 'a.invalid' does not resolve from this node" in done.stdout


def test_gloos_own_choice_where_gloo_socket_ifname_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gloo binds the workers to the first address of the host's name: Debian's 127.0.1.1,
    or an address of another interface than the rendezvous traffic's."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(network_checks, "interface_addresses", lambda: IFACES)
    monkeypatch.setattr(network_checks, "route_address", lambda host, port: "10.1.0.5")
    monkeypatch.setattr(network_checks.socket, "gethostname", lambda: "trainer3")
    resolving: dict[str, list[str]] = {}
    monkeypatch.setattr(network_checks, "hostname_addresses", lambda name: resolving[name])

    def gloo_line(endpoint: str = "10.1.0.1:29500") -> str:
        return network_checks.interface_checks(doctor_config(endpoint))[-1].line()

    resolving["trainer3"] = ["127.0.1.1", "10.1.0.5"]
    assert gloo_line() == (
        "  FAIL GLOO_SOCKET_IFNAME is unset and this host's name 'trainer3' resolves to"
        " 127.0.1.1, 10.1.0.5: gloo binds the workers to 127.0.1.1, a loopback address the"
        " other hosts cannot reach; set GLOO_SOCKET_IFNAME=eth0"
    )
    resolving["trainer3"] = []
    assert gloo_line().startswith(
        "  FAIL GLOO_SOCKET_IFNAME is unset and this host's name 'trainer3' does not resolve:"
        " gloo binds the workers to 127.0.0.1, a loopback address"
    )
    resolving["trainer3"] = ["10.2.0.5"]
    assert gloo_line() == (
        "  FAIL GLOO_SOCKET_IFNAME is unset: gloo binds the workers to 'trainer3' = 10.2.0.5"
        " on ib0, but the rendezvous traffic to 10.1.0.1 leaves through eth0: the workers may"
        " not reach their peers; set GLOO_SOCKET_IFNAME=eth0"
    )
    resolving["trainer3"] = ["10.1.0.5"]
    assert gloo_line() == (
        "  ok   GLOO_SOCKET_IFNAME is unset: gloo binds the workers to 'trainer3' = 10.1.0.5"
        " on eth0"
    )
    # a job on this host alone: gloo's loopback choice is right
    resolving["trainer3"] = ["127.0.1.1"]
    assert "GLOO" not in gloo_line("localhost:29500")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")  # the user's choice is checked instead
    assert gloo_line() == "  ok   GLOO_SOCKET_IFNAME=eth0"


def test_the_agent_warns_of_what_the_interface_checks_fail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before its rendezvous the agent says, as a warning line, each interface check that
    fails (the same checks as the doctor's), and nothing of those that pass."""
    monkeypatch.setattr(network_checks, "interface_addresses", lambda: IFACES)
    monkeypatch.setattr(network_checks, "route_address", lambda host, port: "10.1.0.5")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth1")
    network_checks.say_interface_problems(doctor_config("10.1.0.1:29500"))
    assert capsys.readouterr().err.splitlines() == [
        "torchx-elastic: warning: NCCL_SOCKET_IFNAME=eth1: no interface eth1 on this host (it"
        " has eth0, ib0, lo)"
    ]
