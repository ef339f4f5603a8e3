"""``python -m torchx_elastic.ft.lighthouse``: the Lighthouse role of an ``ft.ddp`` app.

It runs torchft's Lighthouse (``torchft.coordination.LighthouseServer``, what the
``torchft_lighthouse`` command runs, with the same settings: ``--min_replicas``,
``--join_timeout_ms``, ``--quorum_tick_ms``, ``--heartbeat_timeout_ms``) and, one port
above it, the registry of the replica groups (:mod:`torchx_elastic.ft.protocol`): every
group's launcher says when its agent starts and when it ends.

torchft's Lighthouse serves forever; this role exits 0 once every replica group has ended
(succeeded or failed, after its own restarts), so the app ends when the training ends and
its state is its groups' (a group that failed makes the app FAILED).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import re
import threading
import urllib.request
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Set, Tuple

from torchx_elastic.contract import SECRET_ENV, SECRET_FILE_ENV
from torchx_elastic.contract.error_exit import exit_with_error
from torchx_elastic.contract.job_secret import read_secret
from torchx_elastic.ft.protocol import (
    DEFAULT_LIGHTHOUSE_PORT,
    SIGNATURE_HEADER,
    registry_port,
    signature,
)

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "torchft is not installed where the Lighthouse runs: install it with"
    " pip install 'torchx-elastic[ft]' (or pip install torchft) in the job's environment or image"
)
WAITING, RUNNING, SUCCEEDED, FAILED = "waiting", "running", "succeeded", "failed"
UNSIGNED = (
    f"not signed with the job's secret: the roles of one app share it ({SECRET_ENV} or"
    f" {SECRET_FILE_ENV}, which the schedulers of torchx-elastic set)"
)


def unauthenticated_warning(port: int) -> str:
    return (
        f"the groups' registry on port {port} is NOT authenticated: any process that reaches"
        " it can report a replica group ended and so stop the Lighthouse; give every role of"
        f" the app the same secret in {SECRET_ENV} or {SECRET_FILE_ENV} (docs/security.md)"
    )


# a group that restarts from the fork server is back within about a second: the quorum of
# the others alone lasts that long, and a poll each second missed it (seen in CI: 0.75 s)
QUORUM_POLL_S = 0.2
_QUORUM_ID = re.compile(r"Previous quorum id: (\d+)")
_MEMBER = re.compile(r"<b>([^<:]+)(?::[^<]*)?</b>\s*<br/>\s*Step: (\d+)")


@dataclass(frozen=True)
class Quorum:
    """The last quorum torchft's Lighthouse issued, read from its ``/status`` page."""

    quorum_id: int
    step: int
    members: Tuple[str, ...]  # the replica ids the scripts chose, without torchft's uuid

    @classmethod
    def parse(cls, page: str) -> Optional[Quorum]:
        """None when the page has no quorum yet (or is not the page this was written for)."""
        quorum_id = _QUORUM_ID.search(page)
        members = _MEMBER.findall(page)
        if quorum_id is None or not members:
            return None
        return cls(
            int(quorum_id[1]), max(int(step) for _, step in members), tuple(m for m, _ in members)
        )

    def line(self, num_groups: int) -> str:
        return (
            f"quorum {self.quorum_id} at step {self.step}: {len(self.members)} of {num_groups}"
            f" replica groups ({', '.join(self.members)})"
        )


_QUORUM_LINE = re.compile(r"quorum (\d+) at step (\d+): \d+ of (\d+) replica groups \(([^)]*)\)")


def last_logged_quorum(lines: List[str]) -> Optional[Tuple[Quorum, int]]:
    """The last quorum the Lighthouse role logged (:meth:`Quorum.line`) and the app's number
    of groups, e.g. for ``torchx status``; None when it logged none yet."""
    for line in reversed(lines):
        found = _QUORUM_LINE.search(line)
        if found:
            members = tuple(member for member in found[4].split(", ") if member)
            return Quorum(int(found[1]), int(found[2]), members), int(found[3])
    return None


def watch_quorums(port: int, registry: GroupRegistry, stop: threading.Event) -> List[Quorum]:
    """Log every change of the quorum's members (torchft bumps the quorum id then) and keep
    the latest quorum in ``registry``, until ``stop``; returns the quorums seen."""
    seen: List[Quorum] = []
    while not stop.wait(QUORUM_POLL_S):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as page:
                quorum = Quorum.parse(page.read().decode(errors="replace"))
        except OSError:
            continue
        if quorum is None:
            continue
        registry.quorum = quorum
        if not seen or seen[-1].quorum_id != quorum.quorum_id:
            seen.append(quorum)
            log.info("%s", quorum.line(registry.num_groups))
    return seen


class GroupRegistry:
    """What the launchers said: per group, per node, running or ended with an exit code."""

    def __init__(self, num_groups: int) -> None:
        self.num_groups = num_groups
        self._nodes: Dict[int, Dict[str, Optional[int]]] = {g: {} for g in range(num_groups)}
        self.quorum: Optional[Quorum] = None  # the latest, from torchft's Lighthouse
        self._changed = threading.Condition()

    def record(self, group: int, node: str, event: str, rc: int = 0) -> None:
        if group not in self._nodes:
            raise ValueError(f"no replica group {group}: this app has {self.num_groups} (0..)")
        if event not in ("started", "ended"):
            raise ValueError(f"unknown event {event!r}: expected started or ended")
        with self._changed:
            self._nodes[group][node] = None if event == "started" else rc
            self._changed.notify_all()
        log.info("replica group %d, node %s: %s", group, node, self.state(group))

    def state(self, group: int) -> str:
        """waiting (no node started yet), running, succeeded or failed (every node ended)."""
        codes = list(self._nodes[group].values())
        if not codes:
            return WAITING
        if any(rc is None for rc in codes):
            return RUNNING
        return SUCCEEDED if all(rc == 0 for rc in codes) else FAILED

    def all_ended(self) -> bool:
        return all(self.state(g) in (SUCCEEDED, FAILED) for g in self._nodes)

    def wait_all_ended(self) -> None:
        with self._changed:
            self._changed.wait_for(self.all_ended)

    def as_json(self) -> Dict[str, object]:
        with self._changed:
            groups = {
                str(g): {"state": self.state(g), "nodes": dict(nodes)}
                for g, nodes in self._nodes.items()
            }
        quorum = self.quorum
        return {
            "num_groups": self.num_groups,
            "groups": groups,
            "quorum": None if quorum is None else asdict(quorum),
        }

    def summary(self) -> str:
        return ", ".join(f"group{g} {self.state(g)}" for g in self._nodes)


def _handler(registry: GroupRegistry, secret: Optional[bytes]) -> type[BaseHTTPRequestHandler]:
    refused_from: Set[str] = set()  # the peers whose refusal was logged (once each)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.rstrip("/") != "/groups":
                self._answer(404, {"error": f"unknown path {self.path}: GET /groups"})
                return
            self._answer(200, registry.as_json())

        def do_POST(self) -> None:  # noqa: N802
            _, _, group = self.path.rstrip("/").rpartition("/groups/")
            try:
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            except ValueError as err:
                self._answer(400, {"error": str(err)})
                return
            if secret is not None and not hmac.compare_digest(
                self.headers.get(SIGNATURE_HEADER, ""), signature(secret, self.path, data)
            ):
                self._refuse()
                return
            try:
                body = json.loads(data)
                registry.record(int(group), str(body["node"]), body["event"], int(body["rc"]))
            except (ValueError, KeyError, TypeError) as err:
                self._answer(400, {"error": str(err)})
                return
            self._answer(200, {"ok": True})

        def _refuse(self) -> None:
            peer = self.client_address[0]
            if peer not in refused_from:
                refused_from.add(peer)
                log.warning("refused a report from %s: %s", peer, UNSIGNED)
            self._answer(403, {"error": f"refused: {UNSIGNED}"})

        def _answer(self, code: int, body: Dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug(format, *args)

    return Handler


def serve_registry(
    registry: GroupRegistry, port: int, secret: Optional[bytes] = None
) -> ThreadingHTTPServer:
    """The registry's HTTP server, serving on a thread of its own; with ``secret``, it takes
    only the reports signed with it."""
    server = ThreadingHTTPServer(("", port), _handler(registry, secret))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ft-registry", daemon=True).start()
    return server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchx_elastic.ft.lighthouse",
        description="torchft's Lighthouse for the replica groups of one app; exits 0 once"
        " every group has ended",
    )
    parser.add_argument("--num_groups", type=int, required=True, help="replica groups of the app")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_LIGHTHOUSE_PORT,
        help=("torchft's Lighthouse port; the groups' registry serves on the next one"),
    )
    parser.add_argument(
        "--min_replicas",
        type=int,
        default=1,
        help="replica groups needed for a quorum (torchft_lighthouse's)",
    )
    parser.add_argument(
        "--join_timeout_ms",
        type=int,
        default=60000,
        help="how long to wait for stragglers before a quorum (torchft_lighthouse's)",
    )
    parser.add_argument(
        "--quorum_tick_ms",
        type=int,
        default=100,
        help="how often to check for a quorum (torchft_lighthouse's)",
    )
    parser.add_argument(
        "--heartbeat_timeout_ms",
        type=int,
        default=5000,
        help="a group that sends no heartbeat this long is dead (torchft_lighthouse's)",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[torchx-elastic ft] %(message)s")
    args = build_parser().parse_args(argv)
    try:
        secret = read_secret()
    except ValueError as err:
        exit_with_error(err)
    try:
        from torchft.coordination import LighthouseServer
    except ImportError:
        exit_with_error(INSTALL_HINT)
    lighthouse = LighthouseServer(
        bind=f"[::]:{args.port}",
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=args.quorum_tick_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    registry = GroupRegistry(args.num_groups)
    server = serve_registry(registry, registry_port(args.port), secret)
    if secret is None:
        log.warning(unauthenticated_warning(registry_port(args.port)))
    log.info(
        "Lighthouse of %d replica groups at %s (quorum of at least %d), groups' registry on"
        " port %d",
        args.num_groups,
        lighthouse.address(),
        args.min_replicas,
        registry_port(args.port),
    )
    stop = threading.Event()
    threading.Thread(target=watch_quorums, args=(args.port, registry, stop), daemon=True).start()
    registry.wait_all_ended()
    stop.set()
    log.info("every replica group has ended (%s): stopping the Lighthouse", registry.summary())
    server.shutdown()
    lighthouse.shutdown()


if __name__ == "__main__":
    main()
