"""The group launcher and the Lighthouse role's registry for real: launcher processes (and
``group.run``, which starts the agent's process) against the registry served over HTTP in
this process, torchft's Lighthouse, the Lighthouse role's own process (ft.ddp's AppDef and
the registry's states: tests/ft/test_ft_units.py)."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import _env
from tests.ft.ports import free_port_pair
from tests.waiting import wait_until
from torchx_elastic.contract import (
    LAUNCHER_PID_ENV,
    RANK0_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
)
from torchx_elastic.ft.lighthouse import GroupRegistry, serve_registry
from torchx_elastic.ft.protocol import get_groups, post_event


@pytest.fixture
def gone_lighthouse_port() -> Iterator[int]:
    """A Lighthouse port whose registry port (the next one) refuses every connection: a
    socket bound there (port 0: a free one, held) that does not listen."""
    with socket.socket() as registry:
        registry.bind(("127.0.0.1", 0))
        yield int(registry.getsockname()[1]) - 1


def test_lighthouse_without_torchft_fails_with_the_install_hint(tmp_path: Path) -> None:
    fake = tmp_path / "torchft"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no torchft here')\n")
    result = subprocess.run(
        [sys.executable, "-m", "torchx_elastic.ft.lighthouse", "--num_groups", "1"],
        env=_env({"PYTHONPATH": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "torchx-elastic: error: torchft is not installed where the Lighthouse runs: install it"
        " with pip install 'torchx-elastic[ft]' (or pip install torchft) in the job's"
        " environment or image"
    )


@pytest.fixture
def registry_port() -> Iterator[tuple[GroupRegistry, int]]:
    registry = GroupRegistry(1)
    server = serve_registry(registry, 0)  # a free port, bound at once: no other test's
    yield registry, server.server_address[1] - 1  # the Lighthouse port it goes with
    server.shutdown()


def test_registry_over_http(registry_port: tuple[GroupRegistry, int]) -> None:
    registry, port = registry_port
    post_event("127.0.0.1", port, 0, {"node": "0", "event": "started", "rc": 0})
    assert get_groups("127.0.0.1", port) == {
        "num_groups": 1,
        "groups": {"0": {"state": "running", "nodes": {"0": None}}},
        "quorum": None,
    }
    waiter = threading.Thread(target=registry.wait_all_ended)
    waiter.start()
    post_event("127.0.0.1", port, 0, {"node": "0", "event": "ended", "rc": 0})
    waiter.join(timeout=60)
    assert not waiter.is_alive()


def test_group_launcher_sets_the_lighthouse_and_reports_the_agents_exit_code(
    registry_port: tuple[GroupRegistry, int],
) -> None:
    registry, port = registry_port
    agent = "import os, sys; print(os.environ['TORCHFT_LIGHTHOUSE']); sys.exit(3)"
    result = subprocess.run(
        [sys.executable, "-m", "torchx_elastic.ft.group", "--node", "0"]
        + ["--lighthouse_port", str(port), "--", "-c", agent],
        env=_env({"REPLICA_GROUP_ID": "0", RANK0_ENV: "127.0.0.1"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout.strip() == f"http://127.0.0.1:{port}"
    assert registry.as_json()["groups"] == {"0": {"state": "failed", "nodes": {"0": 3}}}


def test_group_launcher_says_when_the_lighthouse_role_is_gone(
    gone_lighthouse_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchx_elastic.ft import group

    monkeypatch.setattr(group, "STARTED_REPORT_S", 0.1)
    monkeypatch.setattr(group, "ENDED_REPORT_S", 0.1)
    monkeypatch.setenv("REPLICA_GROUP_ID", "1")
    monkeypatch.setenv(RANK0_ENV, "127.0.0.1")
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert group.run("0", gone_lighthouse_port, ["-c", "pass"]) == 0
    refused = "unreachable ([Errno 111] Connection refused)"
    assert capsys.readouterr().err.strip().splitlines() == [
        "torchx-elastic: the Lighthouse role at 127.0.0.1 did not take the start of replica"
        f" group 1 (node 0): {refused}",
        "torchx-elastic: the Lighthouse role at 127.0.0.1 did not take the end of replica"
        f" group 1 (node 0): {refused}; it keeps running until cancelled",
    ]


@pytest.fixture
def signed_registry() -> Iterator[tuple[GroupRegistry, int]]:
    registry = GroupRegistry(1)
    server = serve_registry(registry, 0, SECRET)
    yield registry, server.server_address[1] - 1
    server.shutdown()


SECRET = b"s" * 32


STARTED: dict[str, object] = {"node": "0", "event": "started", "rc": 0}


REFUSED = (
    "refused: not signed with the job's secret: the roles of one app share it"
    f" ({SECRET_ENV} or {SECRET_FILE_ENV}, which the schedulers of torchx-elastic set)"
)


def test_a_registry_with_the_jobs_secret_takes_only_reports_signed_with_it(
    signed_registry: tuple[GroupRegistry, int], caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who reaches the port could otherwise report every group ended, which stops
    the Lighthouse and with it the training of every group."""
    registry, port = signed_registry
    for secret in (None, b"another job's secret"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            post_event("127.0.0.1", port, 0, STARTED, secret)
        assert refused.value.code == 403
        assert json.loads(refused.value.read()) == {"error": REFUSED}
    assert registry.state(0) == "waiting"
    assert [r.getMessage() for r in caplog.records] == [  # once per peer
        f"refused a report from 127.0.0.1: {REFUSED.removeprefix('refused: ')}"
    ]
    post_event("127.0.0.1", port, 0, STARTED, SECRET)
    assert registry.state(0) == "running"


def test_a_group_launcher_without_the_jobs_secret_says_it_was_refused(
    signed_registry: tuple[GroupRegistry, int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torchx_elastic.ft import group

    registry, port = signed_registry
    monkeypatch.setenv("REPLICA_GROUP_ID", "0")
    monkeypatch.setenv(RANK0_ENV, "127.0.0.1")
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    monkeypatch.setenv(SECRET_ENV, "not the job's")
    assert group.run("0", port, ["-c", "pass"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert sorted(lines) == [
        "torchx-elastic: the Lighthouse role at 127.0.0.1 did not take the end of replica"
        f" group 0 (node 0): {REFUSED}; it keeps running until cancelled",
        "torchx-elastic: the Lighthouse role at 127.0.0.1 did not take the start of replica"
        f" group 0 (node 0): {REFUSED}",
    ]
    monkeypatch.setenv(SECRET_ENV, SECRET.decode())
    assert group.run("0", port, ["-c", "pass"]) == 0
    assert registry.state(0) == "succeeded"


def test_a_lighthouse_role_without_a_secret_says_so_and_takes_unsigned_reports() -> None:
    """An app run by a scheduler that hands out no secret (torchx's own) still ends."""
    port = free_port_pair()
    env = _env()
    for name in (SECRET_ENV, SECRET_FILE_ENV):
        env.pop(name, None)
    lighthouse = subprocess.Popen(
        [sys.executable, "-m", "torchx_elastic.ft.lighthouse", "--num_groups", "1"]
        + ["--port", str(port), "--join_timeout_ms", "100"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def took_the_end() -> bool:  # once it serves (it imports torch first)
            assert lighthouse.poll() is None, "the Lighthouse role ended before it served"
            try:
                post_event("127.0.0.1", port, 0, {"node": "0", "event": "ended", "rc": 0})
            except OSError:
                return False
            return True

        wait_until(took_the_end, what="the Lighthouse role's registry", every_s=0.2)
        _, err = lighthouse.communicate(timeout=60)
    finally:
        lighthouse.kill()
    assert lighthouse.returncode == 0, err
    assert (
        f"[torchx-elastic ft] the groups' registry on port {port + 1} is NOT authenticated: any"
        " process that reaches it can report a replica group ended and so stop the"
        " Lighthouse; give every role of the app the same secret in"
        f" {SECRET_ENV} or {SECRET_FILE_ENV} (docs/security.md)"
    ) in err.splitlines()


def test_the_quorum_is_read_from_torchft_lighthouse_status_page(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torchft.coordination import LighthouseClient, LighthouseServer

    from torchx_elastic.ft.lighthouse import Quorum, watch_quorums

    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
    port = int(server.address().rsplit(":", 1)[1])  # port 0: a free one, bound at once
    try:
        client = LighthouseClient(f"http://127.0.0.1:{port}", connect_timeout=timedelta(seconds=5))
        client.quorum(
            replica_id="ft_ddp_0:0b5e",
            timeout=timedelta(seconds=10),
            address="http://a:1",
            store_address="a:2",
            step=7,
            world_size=2,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as page:
            quorum = Quorum.parse(page.read().decode())
        # the Lighthouse role's watcher keeps it for GET /groups and logs it
        registry, stop = GroupRegistry(2), threading.Event()
        with caplog.at_level(logging.INFO, logger="torchx_elastic.ft.lighthouse"):
            watcher = threading.Thread(target=watch_quorums, args=(port, registry, stop))
            watcher.start()
            wait_until(lambda: registry.quorum is not None, what="the watcher's quorum")
            stop.set()
            watcher.join(timeout=60)
    finally:
        server.shutdown()
    assert quorum == Quorum(quorum_id=1, step=7, members=("ft_ddp_0",))
    assert quorum.line(2) == "quorum 1 at step 7: 1 of 2 replica groups (ft_ddp_0)"
    assert Quorum.parse("<html>no quorum yet</html>") is None
    assert registry.as_json()["quorum"] == {"quorum_id": 1, "step": 7, "members": ("ft_ddp_0",)}
    assert "quorum 1 at step 7: 1 of 2 replica groups (ft_ddp_0)" in caplog.messages


def test_group_launcher_forwards_sigterm_to_the_agent_and_stops_at_once() -> None:
    """Cancelled, it tries once to report its end (the Lighthouse role is being stopped
    too), not for ENDED_REPORT_S."""
    agent = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    with UnansweredRegistry() as registry:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "torchx_elastic.ft.group", "--node", "0"]
            + ["--lighthouse_port", str(registry.lighthouse_port), "--", "-c", agent],
            env=_env({"REPLICA_GROUP_ID": "0", RANK0_ENV: "127.0.0.1"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert launcher.stdout is not None and launcher.stdout.readline() == "up\n"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 7
    assert registry.events.count("ended") == 1, registry.events


class UnansweredRegistry:
    """A registry port that takes each report and drops the connection unanswered (the
    reporter's OSError, as for a Lighthouse role on its way out): the events it was sent."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))  # port 0: a free one, held
        self._socket.listen()
        self.lighthouse_port = int(self._socket.getsockname()[1]) - 1
        self.events: list[str] = []
        self._thread = threading.Thread(target=self._take, daemon=True)

    def __enter__(self) -> UnansweredRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(timeout=60)

    def _take(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                request, found = b"", None
                while found is None and (chunk := connection.recv(65536)):
                    request += chunk
                    found = EVENT.search(request)
                self.events.append(found[1].decode() if found else "?")


EVENT = re.compile(rb'"event": ?"(\w+)"')  # of a report's JSON body
