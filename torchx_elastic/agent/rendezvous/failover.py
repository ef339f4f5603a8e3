"""The rendezvous host lost: the survivors move the rendezvous to one of them and go on.

torch's c10d rendezvous lives in one ``TCPStore``, hosted by the agent of the endpoint's
host. When that host vanishes (the network watch hears nothing from it for twice the
dead-node time while peers answer) or its agent dies (its store's connection fails under a
running node: a host that ends the job on purpose leaves last), the other nodes of the last
round elect a successor: the lowest-ranked member of that round that is not the lost host.
The successor hosts a fresh store on its own address and the endpoint's port; the others
connect to it, the candidates in rank order (a candidate that does not host within
:data:`CANDIDATE_WAIT_S` is passed over). Each node then swaps a new c10d handler on that
store (same run id, same node range, signed with the job's secret) into its
:class:`MovableRendezvous`, and the supervision loop re-forms the round there, without the
lost host (a membership change: no restart counted), as long as the survivors make the
job's minimum of nodes with the nodes standing by (a spare follows the survivors: it
knows the last round's members from the rendezvous it waited in, and connects to the
candidates in the same order).

On one host (a loopback endpoint: every node has the same address, so none is told from
the lost host by it) the survivors host the rendezvous again at the endpoint itself, which
the lost host's end freed: each survivor of the last round tries to listen there, the one
that does hosts it, the others connect to it; a node that stood by (a spare, not in the
last round) reconnects to the endpoint and finds the rendezvous there. The survivors and
the nodes standing by (as last seen) must make the job's
minimum: a fixed-size job moves only where a spare takes the lost host's place.

A call on the old rendezvous that is waiting on the lost host (torch's store calls wait
up to ``read_timeout``) is abandoned the moment the loss is known: every call of the
handler runs on a helper thread, and the caller waits for it or for the loss.

When the lost host comes back (Kubernetes recreates pod 0 with its name), it hosts a
rendezvous at the original endpoint: the new host's :class:`Beacon` writes where the job
went into that store, and every node there (it, or one that started later knowing only
the original endpoint) joins the job at the new host as a new node.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousInfo,
)

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import listen, liveness, membership
from torchx_elastic.agent.rendezvous.diagnosis import resolved
from torchx_elastic.agent.rendezvous.handler import StoreHost, handler_on_store, hosts_store
from torchx_elastic.agent.rendezvous.parameters import rendezvous_parameters
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous
from torchx_elastic.contract import MOVED_TO_KEY_PREFIX

log = logging.getLogger(__name__)

T = TypeVar("T")
CANDIDATE_WAIT_S = 30.0  # how long a candidate may take to notice the loss and host
RELISTEN_S = 1.0  # on one host: each try to connect to the store hosted again, in turn
WAIT_POLL_S = 0.2
MOVED_CHECK_S = 1.0  # how often a node at the original endpoint reads whether the job moved
BEACON_INTERVAL_S = 2.0  # how often the new host looks for a store at the original endpoint
BEACON_TOLD_S = 10.0  # and how often, once it told one there
BEACON_CONNECT_S = 5.0


class HostLost(Exception):
    """The rendezvous host of a running job is lost; the message says how it was noticed."""


class RendezvousMoved(HostLost):
    """The job's survivors moved its rendezvous while this node's host of it was lost
    (or before this node came): this node joins it at ``endpoint``."""

    def __init__(self, endpoint: Endpoint, original: Endpoint) -> None:
        super().__init__(
            f"the job's rendezvous moved from {original} to {endpoint} while its host was lost"
        )
        self.endpoint = endpoint


class NoSuccessor(Exception):
    """The rendezvous cannot move: the message says why."""


def moved_to_key(run_id: str) -> str:
    return f"{MOVED_TO_KEY_PREFIX}{run_id}"


class MovableRendezvous(WrappedRendezvous):
    """The rendezvous handler that the supervision loop keeps while the rendezvous moves.

    ``lose(why)`` (the network watch's verdict) makes a call waiting on the lost host, and
    every later one, raise :class:`HostLost`; so does a store connection that fails during
    a call (a host that ends the job on purpose leaves last: closing.py, so its store goes
    away only when its agent died). ``move_to`` swaps in the handler of the new host.
    """

    def __init__(
        self, handler: RendezvousHandler, endpoint: Endpoint, signer: StoreSigner | None = None
    ) -> None:
        super().__init__(handler)
        self.endpoint = endpoint
        self._original = endpoint
        self._signer = signer or StoreSigner(None)
        self._lost = threading.Event()
        self._why = ""
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="rendezvous")
        self._moved: Endpoint | None = None  # where the job went, as read at the original
        self._moved_watch: threading.Thread | None = None
        # the handlers this node left: the store one of them hosts at the original endpoint
        # tells nodes that come later where the job went
        self._left: list[RendezvousHandler] = []
        self._closed = threading.Event()

    @property
    def armed(self) -> bool:
        """Whether the host can be lost from here (not on the node that hosts the store)."""
        return not hosts_store(self.handler)

    def lose(self, why: str) -> None:
        if self.armed:
            self._why = why
            self._lost.set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def move_to(self, handler: RendezvousHandler, endpoint: Endpoint) -> None:
        self._calls.shutdown(wait=False)  # a call stuck on the lost host ends on its own
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="rendezvous")
        if isinstance(self.handler, WrappedRendezvous):  # a first round still waiting there
            self.handler.abandon()
        self._left.append(self.handler)
        self.handler = handler
        self.endpoint = endpoint
        self._lost.clear()

    def close(self) -> None:
        """End this node's threads of it (its call pool, its moved-watch): the agent's end."""
        self._closed.set()
        self._calls.shutdown(wait=False, cancel_futures=True)

    def _call(self, call: Callable[[], T]) -> T:
        self._raise_if_gone()
        future: Future[T] = self._calls.submit(call)
        while True:
            try:
                return future.result(timeout=WAIT_POLL_S)
            except TimeoutError:
                self._raise_if_gone()
            except RendezvousConnectionError:
                if self.armed:
                    raise HostLost(
                        f"the connection to the rendezvous store at {self.endpoint} failed"
                    ) from None
                raise

    def _raise_if_gone(self) -> None:
        """:class:`HostLost` once the host is lost, :class:`RendezvousMoved` once the job
        is known to have moved."""
        if self._lost.is_set():
            raise HostLost(self._why)
        moved, self._moved = self._moved, None
        if moved is not None:
            raise RendezvousMoved(moved, self._original)

    def _watch_for_a_move(self) -> None:
        """While this node's rendezvous is at the original endpoint: read every
        :data:`MOVED_CHECK_S` whether the survivors moved the job, as they write it into
        the store there (a node that came back, or came late, may have formed a round of
        its own meanwhile); on a thread of its own: a store call may wait on a lost host."""
        while self.endpoint == self._original and not self._closed.wait(MOVED_CHECK_S):
            store = membership.handler_store(self.handler)
            key = moved_to_key(self.get_run_id())
            try:
                if store is None or not store.check([key]):
                    continue
                value = SignedStore(store, self._signer).read(key, "the moved rendezvous")
                if value is None:  # not signed with this job's secret: refused, said once
                    return
                host, _, port = value.decode().rpartition(" ")
                moved = Endpoint(host, int(port))
            except Exception:  # noqa: BLE001 - the store is going: the call says so itself
                continue
            if moved != self.endpoint:
                self._moved = moved

    def next_rendezvous(self) -> RendezvousInfo:
        if self._moved_watch is None:
            self._moved_watch = threading.Thread(
                target=self._watch_for_a_move, name="rendezvous-moved", daemon=True
            )
            self._moved_watch.start()
        return self._call(self.handler.next_rendezvous)

    def num_nodes_waiting(self) -> int:
        return self._call(self.handler.num_nodes_waiting)

    def is_closed(self) -> bool:
        """Also the loop's check that the store still answers once its workers failed with
        a peer: on a lost host the failure is the host's loss (:class:`HostLost`)."""
        return self._call(self.handler.is_closed)

    def shutdown(self) -> bool:
        return False if self.lost else self.handler.shutdown()


def is_endpoint_host(addr: str, endpoint: Endpoint, endpoint_ips: set[str]) -> bool:
    """Whether a member's address names the endpoint's host (by its first label, or by an
    address the endpoint resolved to while it was up)."""
    if addr.split(".")[0] == endpoint.host.split(".")[0]:
        return True
    return bool(endpoint_ips & resolved(addr))


def successors(members: dict[int, str], endpoint: Endpoint, endpoint_ips: set[str]) -> list[str]:
    """The addresses that may host the moved rendezvous, in the order they are tried."""
    order = [members[rank] for rank in sorted(members)]
    return [addr for addr in order if not is_endpoint_host(addr, endpoint, endpoint_ips)]


class Failover:
    """Moves a :class:`MovableRendezvous` to a successor (see the module's docstring)."""

    def __init__(
        self,
        config: AgentConfig,
        signer: StoreSigner,
        movable: MovableRendezvous,
        on_moved: Callable[[Endpoint, bool], None] = lambda endpoint, hosting: None,
    ) -> None:
        self._config = config
        self._signer = signer
        self._movable = movable
        self._on_moved = on_moved
        self._endpoint_ips = resolved(movable.endpoint.host)
        self._one_host = listen.is_loopback_host(movable.endpoint.host)
        self._params = rendezvous_parameters(config)  # those of every rendezvous it moves to
        self._read_timeout = datetime.timedelta(seconds=config.rdzv.read_timeout_s)
        self._beacons: list[Beacon] = []

    def successors(self, members: dict[int, str]) -> list[str]:
        return successors(members, self._movable.endpoint, self._endpoint_ips)

    def _on_lost_host(self, addr: str) -> bool:
        return is_endpoint_host(addr, self._movable.endpoint, self._endpoint_ips)

    def refusal(self, members: dict[int, str]) -> str | None:
        """Why the rendezvous cannot move with these last-round members (None: it can); a
        node that stood by counts the last round it saw complete."""
        members = members or membership.round_addresses_seen_waiting(self._movable)
        if self._one_host:
            left = max(0, len(members) - 1)  # the lost host was one of them
            standing_by = membership.standbys_seen(self._movable)[0]
            if left + standing_by < self._config.min_nodes:
                return (
                    f"the {left} other node(s) of its last round and the {standing_by}"
                    f" standing by are fewer than the job's minimum of {self._config.min_nodes}"
                )
            return None
        left = len(self.successors(members))
        standing_by = membership.standbys_seen(self._movable)[0]
        if left + standing_by < self._config.min_nodes:
            return (
                f"the {left} other node(s) of its last round and the {standing_by} standing"
                f" by are fewer than the job's minimum of {self._config.min_nodes}"
            )
        return None

    def close(self) -> None:
        """Stop telling the original endpoint where the job went (the agent's end)."""
        for beacon in self._beacons:
            beacon.close()

    def join(self, endpoint: Endpoint) -> None:
        """Join the job where its survivors moved the rendezvous (as a new node)."""
        try:
            store = connect(endpoint, self._read_timeout)
        except (OSError, RuntimeError, TimeoutError) as err:
            raise NoSuccessor(f"this node cannot reach it at {endpoint}: {err}") from None
        handler = handler_on_store(store, self._params, self._config.rdzv, self._signer, endpoint)
        self._movable.move_to(handler, endpoint)
        self._on_moved(endpoint, False)

    def move(self, members: dict[int, str], this_addr: str) -> tuple[Endpoint, bool]:
        """Host or join the successor's rendezvous; (its endpoint, whether this node hosts)."""
        if self._one_host:
            return self._move_on_this_host(members)
        # a node that stood by: the job's last round as it last saw it
        members = members or membership.round_addresses_seen_waiting(self._movable)
        why = self.refusal(members) if members else "this node saw no round of the job"
        if why is not None:
            raise NoSuccessor(why)
        port = self._movable.endpoint.port
        timeout = self._read_timeout
        for addr in self.successors(members):
            endpoint = Endpoint(addr, port)
            hosting = addr == this_addr
            try:
                store = (
                    listen.hosted_store(addr, port, timeout.total_seconds(), True)
                    if hosting
                    else connect(endpoint, timeout)
                )
            except (OSError, RuntimeError, TimeoutError) as err:
                log.warning("the rendezvous cannot move to %s: %s", endpoint, err)
                if hosting:
                    raise NoSuccessor(f"this node cannot host it at {endpoint}: {err}") from None
                continue
            handler = handler_on_store(
                store, self._params, self._config.rdzv, self._signer, endpoint
            )
            liveness.shorten_reform_last_call(handler, self._config.rdzv)
            membership.continue_from(handler, self._movable, self._on_lost_host)
            self._movable.move_to(StoreHost(handler) if hosting else handler, endpoint)
            self._on_moved(endpoint, hosting)
            if hosting:
                run_id = self._params.run_id
                beacon = Beacon(self._config.rdzv_endpoint, endpoint, self._signer, run_id)
                beacon.start()
                self._beacons.append(beacon)
            return endpoint, hosting
        raise NoSuccessor("no other node of its last round hosts it")

    def _move_on_this_host(self, members: dict[int, str]) -> tuple[Endpoint, bool]:
        """One host: a survivor of the last round hosts the rendezvous again at the
        endpoint (the first to listen there); the others, and a node that stood by, connect."""
        endpoint = self._movable.endpoint
        # a node that stood by: the job's last round as it last saw it
        known = members or membership.round_addresses_seen_waiting(self._movable)
        why = self.refusal(known) if known else "this node saw no round of the job"
        if why is not None:
            raise NoSuccessor(why)
        store, hosting = self._host_or_connect(endpoint, may_host=bool(members))
        handler = handler_on_store(store, self._params, self._config.rdzv, self._signer, endpoint)
        liveness.shorten_reform_last_call(handler, self._config.rdzv)
        membership.continue_from(handler, self._movable, None)
        self._movable.move_to(StoreHost(handler) if hosting else handler, endpoint)
        self._on_moved(endpoint, hosting)
        return endpoint, hosting

    def _host_or_connect(self, endpoint: Endpoint, may_host: bool) -> tuple[Any, bool]:
        """On one host: (a store listening at ``endpoint``, True) where this node hosts it
        again, else (a client of the survivor that listens there first, False). The port
        can stay taken for a moment after the lost host died: its process' teardown, or a
        connection given it as its own local port (a client retrying a free port in the
        ephemeral range can even connect to itself, until its attempt times out). So each
        attempt is short: a node of the last round tries to listen, then to connect for
        :data:`RELISTEN_S`, in turn; a node that stood by connects for as long each time;
        both until :data:`CANDIDATE_WAIT_S`."""
        deadline_s = time.monotonic() + CANDIDATE_WAIT_S
        timeout_s = self._read_timeout.total_seconds()
        while True:
            if may_host:
                try:
                    return listen.hosted_store(endpoint.host, endpoint.port, timeout_s, True), True
                except OSError as err:  # another survivor listens there first, or not yet free
                    log.debug("cannot listen at %s yet: %s", endpoint, err)
            wait_s = min(max(deadline_s - time.monotonic(), 0.1), RELISTEN_S)
            try:
                return connect(endpoint, self._read_timeout, wait_s), False
            except (OSError, RuntimeError, TimeoutError) as err:
                if time.monotonic() >= deadline_s:
                    raise NoSuccessor(f"no node hosts it again at {endpoint}: {err}") from None


def connect(
    endpoint: Endpoint, timeout: datetime.timedelta, wait_s: float = CANDIDATE_WAIT_S
) -> Any:
    """A client of the store at ``endpoint``, once one answers there (within ``wait_s``)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            store = TCPStore(
                endpoint.host,
                endpoint.port,
                is_master=False,
                multi_tenant=True,
                timeout=datetime.timedelta(seconds=wait_s),
            )
            store.num_keys()  # a store answers this
            store.set_timeout(timeout)
            outcome["store"] = store
        except BaseException as err:  # noqa: BLE001 (handed to the caller's thread)
            outcome["error"] = err

    thread = threading.Thread(target=run, name="rendezvous-successor", daemon=True)
    thread.start()
    thread.join(wait_s + 5)
    if "store" in outcome:
        return outcome["store"]
    raise TimeoutError(str(outcome.get("error", f"no store at {endpoint}")).splitlines()[0])


class Beacon(threading.Thread):
    """On the new host: whenever something hosts a store at the job's original endpoint
    again (the lost host came back: Kubernetes recreates pod 0 with its name), write where
    the rendezvous went into it, so that the node there (and any node that starts later,
    knowing only the original endpoint) joins the job at the new host."""

    def __init__(
        self, original: Endpoint, moved: Endpoint, signer: StoreSigner, run_id: str
    ) -> None:
        super().__init__(name="rendezvous-beacon", daemon=True)
        self._original = original
        self._value = f"{moved.host} {moved.port}"
        self._signer = signer
        self._key = moved_to_key(run_id)
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()

    def run(self) -> None:
        timeout = datetime.timedelta(seconds=BEACON_CONNECT_S)
        interval_s = BEACON_INTERVAL_S
        while not self._closed.wait(interval_s):
            interval_s = BEACON_INTERVAL_S
            try:
                with socket.create_connection(
                    (self._original.host, self._original.port), timeout=BEACON_CONNECT_S
                ):
                    pass  # something listens there again
                store = connect(self._original, timeout, wait_s=BEACON_CONNECT_S)
                SignedStore(store, self._signer).set(self._key, self._value)
                interval_s = BEACON_TOLD_S  # (a node that starts later reads it there too)
            except Exception as err:  # noqa: BLE001 - nothing there (yet): try again later
                log.debug("no rendezvous at %s to tell: %s", self._original, err)
