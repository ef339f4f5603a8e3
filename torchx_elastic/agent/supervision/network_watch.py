"""Give up when this node is cut off, or when the rendezvous host vanished.

A host whose link died (a dead switch port, a preempted VM's network, a partition) hears
nothing and gets no TCP reset: its collectives and its rendezvous calls just wait, so its
agent would keep its workers (and their GPUs) forever. A thread probes, every second, the
rendezvous endpoint and the hosts of the last round's peers with a TCP connect (a refused
connection proves the host answers as well as an accepted one). The endpoint is probed only
while the agent's own rendezvous calls did not reach its store within
``STORE_ANSWERED_WITHIN_S`` (they sync the state about once a second): the store's server
accepts connections on one thread, so a connect a second from every node would load it with
the job's size. Once, for ``lost_after_s``,

- none answered: the node is cut off;
- the rendezvous host did not, though a peer did: the rendezvous is lost for every node;
  the survivors move it to one of them (rendezvous/failover.py) where the job's minimum of
  nodes is left, and follow it there;

otherwise the node stops its workers and exits non-zero with one line saying what it lost,
so that a scheduler (or a person) replaces it or restarts the job. An endpoint on this
machine proves nothing about the network, so it does not count: the rendezvous host gives
up when every peer of its last round is silent. Nothing counts before the first round
(nodes start in any order, and the rendezvous' own ``join_timeout`` covers the wait). A
peer whose name the name service says no longer exists (a deleted pod) is gone, but the
answer came over the network: the node is not cut off, and the rendezvous host waits for
a replacement in the next round, as long as the join timeout allows.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import listen, liveness, membership
from torchx_elastic.agent.rendezvous.diagnosis import answers
from torchx_elastic.agent.rendezvous.parameters import hosts_rendezvous
from torchx_elastic.contract.error_exit import say_error

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0
# how long a node that joins the job is heard from before its silence counts
NEW_PEER_GRACE_S = 60.0
PROBE_TIMEOUT_S = 2.0
# cut off after twice the time that makes a silent peer dead (20 s by default)
LOST_AFTER_HEARTBEATS = 2
ABANDON_GRACE_S = 2.0  # for the workers of a node that gives up, between SIGTERM and SIGKILL
# the rendezvous store answered this node's own calls this recently: no probe of its port
STORE_ANSWERED_WITHIN_S = 2 * PROBE_INTERVAL_S
PEERS_PER_PROBE = 3  # a few peers a second, in turn: a round of many nodes probes in time
NO_MOVE = "the agent does not move the rendezvous to another node (docs/agent.md)"


# the resolver's answer that a name does not exist (not a timeout: EAI_AGAIN)
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def name_is_gone(host: str) -> bool:
    """Whether the name service answered that ``host`` does not exist: a deleted pod's
    name leaves its headless Service. That answer came over the network, so the node that
    got it is not cut off: its peer is gone (its replacement, if any, is on the way)."""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as err:
        return err.errno in _NO_SUCH_NAME
    except (OSError, UnicodeError):
        return False
    return False


class NetworkWatch:
    """Calls ``give_up(message)`` once this node reached no one for ``lost_after_s``."""

    def __init__(
        self,
        endpoint: Endpoint,
        endpoint_is_local: bool,
        peers: Callable[[], list[str]],
        lost_after_s: float,
        give_up: Callable[[str], None],
        peer_heartbeat_age_s: Callable[[], float | None] = lambda: None,
        on_host_lost: Callable[[str], str | None] = lambda what: NO_MOVE,
        store_answer_age_s: Callable[[], float | None] = lambda: None,
    ) -> None:
        """``on_host_lost(what)``: None once the rendezvous moves (the watch then waits for
        :meth:`follow`), else why it cannot (the node gives up). ``store_answer_age_s``:
        seconds since this node's rendezvous calls last reached the store (None: unknown)."""
        self._store_answer_age_s = store_answer_age_s
        self._endpoint = endpoint
        self._on_host_lost = on_host_lost
        self._moving = False
        self._peer_heartbeat_age_s = peer_heartbeat_age_s
        self._endpoint_is_local = endpoint_is_local
        self._peers = peers
        self.lost_after_s = lost_after_s
        self._give_up = give_up
        self._turn = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="NetworkWatch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def follow(self, endpoint: Endpoint, endpoint_is_local: bool) -> None:
        """Watch the moved rendezvous at ``endpoint`` from now on."""
        self._endpoint, self._endpoint_is_local = endpoint, endpoint_is_local
        self._moving = False

    def _run(self) -> None:
        heard_endpoint_s = heard_peer_s = time.monotonic()
        known_peers: list[str] = []
        while not self._stop.wait(PROBE_INTERVAL_S):
            now_s = time.monotonic()
            peers = self._peer_hosts()
            if set(peers) - set(known_peers):
                # a node that just joined wrote itself into the rendezvous through the store;
                # its heartbeats start once the round it joined completes, which waits for
                # this node to stop its workers (a busy node takes a while): heard from
                heard_endpoint_s = heard_peer_s = now_s + NEW_PEER_GRACE_S
            if peers:  # the last round's peers stay known while the next one forms
                known_peers = peers
            if not known_peers or self._moving:  # no round yet, or moving: nothing to lose
                heard_endpoint_s = heard_peer_s = now_s
                continue
            if self._endpoint_is_local or self._endpoint_answers(now_s):
                heard_endpoint_s = now_s
            if self._a_peer_answers(known_peers):
                heard_peer_s = now_s
            # a peer's heartbeat that came through the store: both sides reached it (a
            # cluster whose network policy drops probes of a peer's port still shows this)
            beat_age_s = self._peer_heartbeat_age_s()
            if beat_age_s is not None:
                heard_peer_s = max(heard_peer_s, now_s - beat_age_s)
                heard_endpoint_s = max(heard_endpoint_s, now_s - beat_age_s)
            endpoint_silent_s, peers_silent_s = now_s - heard_endpoint_s, now_s - heard_peer_s
            message = self.message(known_peers, endpoint_silent_s, peers_silent_s)
            if message is None or self._stop.is_set():
                continue
            if self._cut_off(endpoint_silent_s, peers_silent_s):
                self._give_up(message)
                return
            self._moving = True
            why_not = self._on_host_lost(self.host_silence())
            if why_not is not None:
                self._give_up(self.host_lost_message(why_not))
                return

    def _endpoint_answers(self, now_s: float) -> bool:
        """Whether the rendezvous store answered this node's own calls lately, or else its
        host a probe now."""
        try:
            store_age_s = self._store_answer_age_s()
        except Exception:  # noqa: BLE001 - a torch release's state we cannot read: probe
            log.debug("store's last answer unknown", exc_info=True)
            store_age_s = None
        if store_age_s is not None and store_age_s <= STORE_ANSWERED_WITHIN_S:
            return True
        return answers(self._endpoint.host, self._endpoint.port, PROBE_TIMEOUT_S)

    def _cut_off(self, endpoint_silent_s: float, peers_silent_s: float) -> bool:
        return peers_silent_s >= self.lost_after_s and (
            self._endpoint_is_local or endpoint_silent_s >= self.lost_after_s
        )

    def host_silence(self) -> str:
        return (
            f"{self._endpoint} did not answer for {self.lost_after_s:g}s, though other peers"
            " of this node did"
        )

    def host_lost_message(self, why_not: str) -> str:
        """The last line of a node that cannot follow its lost rendezvous host."""
        return (
            f"the rendezvous host is lost: {self.host_silence()}; {why_not}, so its workers"
            " were stopped and it exits so that the job can be restarted"
        )

    def message(
        self, peers: list[str], endpoint_silent_s: float, peers_silent_s: float
    ) -> str | None:
        """What this node lost, once it is lost; None while it is not (for the rendezvous
        host, the line of a node that does not move the rendezvous)."""
        lost = f"its peers ({', '.join(peers)})"
        limit = f"{self.lost_after_s:g}s"
        if self._cut_off(endpoint_silent_s, peers_silent_s):
            what = (
                f"none of {lost}"
                if self._endpoint_is_local
                else (f"neither the rendezvous at {self._endpoint} nor {lost}")
            )
            return (
                f"this node is cut off: {what} answered for {limit}; its workers were"
                " stopped and it exits so that it can be replaced"
            )
        if not self._endpoint_is_local and endpoint_silent_s >= self.lost_after_s:
            return self.host_lost_message(NO_MOVE)
        return None

    def _peer_hosts(self) -> list[str]:
        try:
            return self._peers()
        except Exception:  # noqa: BLE001 - a torch release's state we cannot read: no watch
            log.debug("peers unknown", exc_info=True)
            return []

    def _a_peer_answers(self, peers: list[str]) -> bool:
        port = self._endpoint.port
        start = self._turn % len(peers)
        self._turn += PEERS_PER_PROBE
        turn = (peers[start:] + peers[:start])[:PEERS_PER_PROBE]
        return any(answers(peer, port, PROBE_TIMEOUT_S) or name_is_gone(peer) for peer in turn)


def watch_network(
    config: AgentConfig,
    handler: RendezvousHandler,
    abandon_workers: Callable[[float], None],
    on_host_lost: Callable[[str], str | None] = lambda what: NO_MOVE,
) -> NetworkWatch | None:
    """The started watch of a multi-host job (None on one host): once cut off, the node
    stops its workers, says so on stderr and exits 1 (from the watch's thread: the main one
    may wait on the network for minutes). ``on_host_lost``: see :class:`NetworkWatch`."""
    if config.max_nodes <= 1 or listen.is_loopback_host(config.rdzv_endpoint.host):
        return None

    def give_up(message: str) -> None:
        abandon_workers(ABANDON_GRACE_S)
        say_error(message)
        logging.shutdown()
        os._exit(1)

    watch = NetworkWatch(
        config.rdzv_endpoint,
        hosts_rendezvous(config),
        lambda: membership.peer_hosts(handler),
        LOST_AFTER_HEARTBEATS * config.rdzv.dead_after_s,
        give_up,
        lambda: liveness.freshest_peer_beat_age_s(handler),
        on_host_lost,
        lambda: membership.store_answer_age_s(handler),
    )
    watch.start()
    return watch
