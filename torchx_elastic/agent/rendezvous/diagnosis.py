"""Why a node cannot reach its rendezvous, in one line that names the cause and the fix.

Before a node that does not host the rendezvous connects to the store (torch's ``TCPStore``
client retries silently until its timeout), the endpoint is probed with a plain socket:
the name resolves, something answers, the connection is not silently dropped. While a
cause can be transient (a pod's DNS record not published yet, the rank-0 node still
starting), the node retries and says so at a growing interval (an agent line on the
console: agent/console/output/agent_line.py); at the join timeout the diagnosis is the error.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.console.output import agent_line

CONNECT_TIMEOUT_S = 3.0
RETRY_SLEEP_S = 0.5
FIRST_REPORT_S = 2.0
MAX_REPORT_INTERVAL_S = 60.0
JOIN_TIMEOUT_HINT = "raise the limit with --rdzv-conf join_timeout=SECONDS"


@dataclass(frozen=True)
class Problem:
    """What is wrong (``cause``) and what to do about it (``fix``)."""

    cause: str
    fix: str

    def line(self) -> str:
        return f"{self.cause}; {self.fix}"


class RendezvousDiagnosis(Exception):
    """The rendezvous cannot complete, for the reason its one-line message names."""

    def __init__(self, endpoint: Endpoint, problem: Problem) -> None:
        super().__init__(f"rendezvous at {endpoint} failed: {problem.line()}")
        self.problem = problem


def unresolvable(endpoint: Endpoint, err: BaseException) -> Problem:
    return Problem(
        f"host {endpoint.host!r} does not resolve from this node ({err})",
        f"check the host name in --rdzv-endpoint {endpoint} (a new pod's DNS name can take"
        " a few seconds to appear)",
    )


def refused(endpoint: Endpoint) -> Problem:
    return Problem(
        f"nothing listens at {endpoint} (connection refused)",
        "start the node that hosts the rendezvous (rank 0) or check the port in --rdzv-endpoint",
    )


def no_answer(endpoint: Endpoint) -> Problem:
    return Problem(
        f"no answer from {endpoint} within {CONNECT_TIMEOUT_S:g}s; a firewall?",
        f"open TCP port {endpoint.port} on {endpoint.host} to this node, or check the host"
        " in --rdzv-endpoint",
    )


def unreachable(endpoint: Endpoint, err: OSError) -> Problem:
    return Problem(
        f"{endpoint} cannot be reached from this node ({err.strerror or err})",
        "check the host in --rdzv-endpoint and this node's network routes",
    )


def port_taken(endpoint: Endpoint) -> Problem:
    return Problem(
        f"port {endpoint.port} on this host, which should serve the rendezvous, is taken by"
        " another program",
        f"stop it or pick a free port (--rdzv-endpoint {endpoint.host}:PORT, dist.ddp --rdzv_port)",
    )


def not_a_store(endpoint: Endpoint) -> Problem:
    return Problem(
        f"the program listening at {endpoint} is not a rendezvous store (another program"
        " took the port)",
        f"stop it or pick a free port (--rdzv-endpoint {endpoint.host}:PORT, dist.ddp --rdzv_port)",
    )


def probe(endpoint: Endpoint, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Problem | None:
    """What keeps this node from connecting to ``endpoint``; None: it connects."""
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        return unresolvable(endpoint, err)
    problem: Problem | None = None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(connect_timeout_s)
            try:
                sock.connect(addr)
                return None
            except ConnectionRefusedError:
                problem = refused(endpoint)
            except TimeoutError:
                problem = problem or no_answer(endpoint)
            except OSError as err:
                problem = problem or unreachable(endpoint, err)
    return problem


def resolved(host: str) -> set[str]:
    """The addresses ``host`` resolves to here (none: it does not resolve)."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return set()


def answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether ``host`` answers a TCP connect to ``port`` (accepted or refused) in time."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:  # timed out, unreachable, no longer resolves
        return False


def is_port_taken(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno == errno.EADDRINUSE


def say(text: str) -> None:
    """``torchx-elastic: <text>``: an agent line on the console (agent/console/output/)."""
    agent_line.say(f"torchx-elastic: {text}")


NAMES_LISTED = 16  # a line names at most this many nodes (a job may have thousands)


def listed(names: list[str], limit: int = NAMES_LISTED) -> str:
    """``a, b, c``; past ``limit`` names, the first ones and ``and 984 more``."""
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"


class GrowingInterval:
    """True at ``first_s`` after start, then at doubling intervals (at most ``max_s``)."""

    def __init__(
        self,
        first_s: float = FIRST_REPORT_S,
        max_s: float = MAX_REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._interval = first_s
        self._max = max_s
        self._next = clock() + first_s

    def due(self) -> bool:
        now = self._clock()
        if now < self._next:
            return False
        self._interval = min(self._max, self._interval * 2)
        self._next = now + self._interval
        return True


def gives_up_at(timeout_s: float) -> str:
    """The wall-clock time ``timeout_s`` from now, as the messages name it."""
    return time.strftime("%H:%M:%S", time.localtime(time.time() + timeout_s))


def wait_until_reachable(
    endpoint: Endpoint,
    timeout_s: float,
    connect: bool = True,
    report: Callable[[str], None] = say,
) -> None:
    """Wait for ``endpoint`` to resolve (and, with ``connect``, to accept a connection),
    saying what is wrong and that it retries; at ``timeout_s`` the diagnosis is raised."""
    deadline = time.monotonic() + timeout_s
    until = gives_up_at(timeout_s)
    reports = GrowingInterval()
    while True:
        if connect:
            problem = probe(endpoint)
        else:
            try:
                socket.getaddrinfo(endpoint.host, endpoint.port)
                problem = None
            except (socket.gaierror, UnicodeError) as err:
                problem = unresolvable(endpoint, err)
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise RendezvousDiagnosis(endpoint, problem)
        if reports.due():
            report(
                f"rendezvous at {endpoint}: {problem.line()}; retrying until {until}"
                f" (join timeout {timeout_s:g}s; {JOIN_TIMEOUT_HINT})"
            )
        time.sleep(RETRY_SLEEP_S)


# a store host that is starting or starved of CPU (a throttled pod) answers late; a program
# that is no store never does: said after STORE_SILENCE_SAID_S (or half the wait, if less),
# the diagnosis at the end
STORE_ANSWER_S = 30.0
STORE_SILENCE_SAID_S = 8.0


def _raise_if_gone(endpoint: Endpoint, err: BaseException | None) -> None:
    """``RendezvousConnectionError`` if nothing takes a connection at ``endpoint`` now."""
    gone = probe(endpoint)
    if gone is not None:
        raise RendezvousConnectionError(
            f"the rendezvous host went away while this node connected: {gone.cause}"
        ) from err


def store_client(
    connect: Callable[[], Any],
    endpoint: Endpoint,
    answer_s: float = STORE_ANSWER_S,
    report: Callable[[str], None] = say,
    said_s: float = STORE_SILENCE_SAID_S,
) -> Any:
    """``connect()`` (a ``TCPStore`` client) in a thread: a program that accepts the
    connection but is no store leaves torch's client waiting forever for its handshake.

    The store's host may also go away during the handshake (the end of an elastic job: pod
    0 exits, its address vanishes without a reset): if the endpoint no longer takes a
    connection, that is torch's ``RendezvousConnectionError``, for the caller to tell a late
    node (``handler.late_for_the_job``) from a failure."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            store = connect()
            # a request only a store answers (torch before 2.5 sends none as it connects)
            store.num_keys()
            outcome["store"] = store
        except BaseException as err:  # noqa: BLE001 (handed to the caller's thread)
            outcome["error"] = err

    thread = threading.Thread(target=run, name="store-connect", daemon=True)
    thread.start()
    # the handshake alone until the silence is said, then probes each second: a store host
    # that exits (its port reset or refused, its name or address gone) shows at once
    deadline = time.monotonic() + answer_s
    silent_s = min(said_s, answer_s / 2)
    thread.join(silent_s)
    if thread.is_alive():
        report(
            f"rendezvous at {endpoint}: the program there took the connection but has not"
            f" answered as a rendezvous store for {silent_s:g}s (its host is starting or"
            f" short of CPU, or another program took the port); waiting until"
            f" {gives_up_at(deadline - time.monotonic())}"
        )
    while thread.is_alive():  # no store answered yet
        _raise_if_gone(endpoint, None)
        if time.monotonic() >= deadline:  # left to end with the process
            raise RendezvousDiagnosis(endpoint, not_a_store(endpoint))
        thread.join(min(1.0, max(0.0, deadline - time.monotonic())))
    if "error" in outcome:
        _raise_if_gone(endpoint, outcome["error"])
        raise outcome["error"]
    return outcome["store"]
