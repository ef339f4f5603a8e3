"""Rendezvous: the agent's handler from the config, waiting for the rank-0 host, clear errors.

:func:`create_handler` builds the stack of rendezvous handlers the agent drives, and
agent/supervision/launcher.py puts the top two layers on it (the second only where the
rendezvous can move: supervision/rendezvous_move.py). Each
layer is a :class:`~torchx_elastic.agent.rendezvous.wrapped.WrappedRendezvous`: torch's
public ``RendezvousHandler`` interface, each call handed down explicitly, nothing else of
the layer below reachable through it. From the top (the loop's calls) down::

    ObservedRendezvous    observed.py      every round's store, rank and node count to the
        |                                  console's cross-node progress exchange
    MovableRendezvous     failover.py      elastic c10d between hosts only: each call on a
        |                                  helper thread, HostLost once the host is lost,
        |                                  the moved rendezvous' handler swapped in
    StoreHost             handler.py       on the node whose agent hosts the store only:
        |                                  says so (it leaves last, never loses the host)
    ExplainedRendezvous   waiting.py       c10d over TCP, once this node is in the roll
        |                                  call: what the first round waits for (and a
        |                                  later one that takes long), mismatched peers,
        |                                  the join timeout's diagnosis
    KeyedLivenessRendezvous                a heartbeat key per node, watched by its peers;
        |                 keyed_liveness.py a verdict calls RoundsRendezvous.drop
    RoundsRendezvous      rounds/          the agent's own rendezvous: torch's public
                                           RendezvousHandler over a torch Store, small
                                           signed keys per round (rounds/keys.py), who a
                                           round admits (rounds/outcome.py), on a store
                                           that listens on the peers' address only
                                           (listen.py)

Once the rendezvous moved (failover.py), below ``MovableRendezvous`` is the same stack's
bottom (``KeyedLivenessRendezvous`` over ``RoundsRendezvous``) on the new host's store,
under a ``StoreHost`` on the node that hosts it. ``--rdzv-conf handler=torch`` (or
``liveness=state``) puts torch's own c10d handler, untouched, where ``KeyedLivenessRendezvous``
and ``RoundsRendezvous`` are: the agent then knows nothing of who is in the rendezvous
(membership.py answers "nobody known"). With ``--rdzv-backend static`` the layers below
``ObservedRendezvous`` are ``CheckedStaticRanks`` (static_ranks.py: rank 0 says what it
waits for, every round checks the nodes' ``--node-rank``, the roll call) over torch's
static handler; with any other backend, torch's handler as its registry makes it. The
rendezvous parameters are computed once here (parameters.py) and handed down. What the
layers above ask about membership goes through membership.py, to the bottom of the stack
(``torch_handler()``); the rendezvous reads no private name of torch.
"""

from __future__ import annotations

import datetime
import logging
import socket
from typing import Any

from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousStateError,
    dynamic_rendezvous,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.config.rdzv_settings import RendezvousSettings
from torchx_elastic.agent.rendezvous import (
    diagnosis,
    listen,
    liveness,
    network_checks,
    static_ranks,
    waiting,
)
from torchx_elastic.agent.rendezvous.keyed_liveness import KeyedLiveness, KeyedLivenessRendezvous
from torchx_elastic.agent.rendezvous.parameters import may_host, rendezvous_parameters
from torchx_elastic.agent.rendezvous.rounds.handler import RoundsRendezvous
from torchx_elastic.agent.rendezvous.signed_store import SignedStore, StoreSigner
from torchx_elastic.agent.rendezvous.wrapped import WrappedRendezvous
from torchx_elastic.contract import SECRET_ENV, SECRET_FILE_ENV

log = logging.getLogger(__name__)

_CHECK = (
    "check that the rank-0 node is running, that {host} resolves and port {port} is reachable"
    " from this node (--rdzv-endpoint / dist.ddp --rdzv_port, firewalls), and that no other"
    " program uses the port; raise the limit with --rdzv-conf join_timeout=SECONDS"
)


class RendezvousFailure(Exception):
    """The rendezvous did not complete: the message names the endpoint and what to check."""

    def __init__(self, endpoint: Endpoint, what: str) -> None:
        check = _CHECK.format(host=endpoint.host, port=endpoint.port)
        super().__init__(f"rendezvous at {endpoint} failed: {what}; {check}")


class JobAlreadyFinished(Exception):
    """This node arrived after its job's rendezvous was closed, or after the host of an
    elastic job's rendezvous went away (the job ended while this node was joining): there is
    nothing to do."""

    def __init__(self, endpoint: Endpoint, run_id: str, err: BaseException) -> None:
        if compat.stood_by(err):
            what = (
                f"its rendezvous (run id {run_id!r} at {endpoint}) is closed while this node"
                " stood by as a spare"
            )
        elif compat.job_ended(err):
            what = f"its rendezvous (run id {run_id!r} at {endpoint}) is closed"
        else:
            what = (
                f"the host of its rendezvous (run id {run_id!r} at {endpoint}) went away"
                " before this node joined a round (an elastic job ends so; a lost host"
                " leaves the job to the nodes that joined)"
            )
        super().__init__(
            f"the job this node came for has finished: {what}, so this node exits without training"
        )


def late_for_the_job(err: BaseException, config: AgentConfig) -> bool:
    """Whether a rendezvous error met by a node that never joined a round (after it reached
    the rendezvous host once) means that its job is over: the rendezvous was closed, or, in
    an elastic job, its host went away (the host of a job that succeeded with fewer than its
    maximum of nodes exits; a pod that found room only then must not fail the job)."""
    if compat.job_ended(err):
        return True
    return config.min_nodes < config.max_nodes and isinstance(err, RendezvousConnectionError)


def create_handler(
    config: AgentConfig, signer: StoreSigner, on_waiting: waiting.WaitingListener | None = None
) -> RendezvousHandler:
    """The rendezvous handler, once the rank-0 host resolves; store errors made readable.
    ``on_waiting``: the job-wide progress line while the first round waits (its host's).

    ``c10d`` over TCP (the default): the agent's own rendezvous (rounds/handler.py) on a
    store that listens only where the peers reach it, every value a node acts on signed by
    ``signer`` (signed_store.py); torch's own handler with ``--rdzv-conf handler=torch``.
    """
    params = rendezvous_parameters(config)  # once for this rendezvous: handed down
    timeout_s = config.rdzv.join_timeout_s
    endpoint = config.rdzv_endpoint
    tcp = params.backend == "c10d" and config.rdzv.store_type == "tcp"
    hosting = may_host(params, endpoint.host)
    network_checks.say_interface_problems(config)
    # said out loud while it fails; at the join timeout the diagnosis is the error
    # a static node other than rank 0 is a client of rank 0's store, as c10d's peers are
    static_peer = params.backend == "static" and (config.rdzv.static_rank or 0) != 0
    connect = (tcp and not hosting) or static_peer
    diagnosis.wait_until_reachable(endpoint, timeout_s, connect=connect)
    try:
        if not tcp:
            created = get_rendezvous_handler(params)
            if params.backend == "static":
                return static_ranks.CheckedStaticRanks(created, config, signer)
            return created
        store, hosted = rendezvous_store(params, config.rdzv, endpoint)
    except RendezvousConnectionError:
        raise  # the host went away as this node reached it (late_for_the_job)
    except (RendezvousError, RuntimeError, TimeoutError, ValueError, OSError) as err:
        if hosting and diagnosis.is_port_taken(err):
            raise diagnosis.RendezvousDiagnosis(endpoint, diagnosis.port_taken(endpoint)) from None
        raise RendezvousFailure(endpoint, describe_error(err)) from None
    handler = handler_on_store(store, params, config.rdzv, signer, endpoint)
    explained = waiting.explained(handler, store, config, signer, hosted, timeout_s, on_waiting)
    return StoreHost(explained) if hosted else explained


class StoreHost(WrappedRendezvous):
    """The handler of the node whose agent hosts the rendezvous store (its peers need the
    store until they are done with it: :func:`closing.leave_last`)."""

    @property
    def hosts_store(self) -> bool:
        return True


def hosts_store(handler: RendezvousHandler) -> bool:
    """Whether this node's agent hosts the store of ``handler`` (a :class:`StoreHost`,
    however wrapped since)."""
    return isinstance(handler, WrappedRendezvous) and handler.hosts_store


def handler_on_store(
    store: Any,
    params: RendezvousParameters,
    settings: RendezvousSettings,
    signer: StoreSigner,
    endpoint: Endpoint,
) -> RendezvousHandler:
    """The agent's own rendezvous (rounds/handler.py) on a store this node reached, with
    the keyed liveness beside it; torch's dynamic rendezvous, untouched, where
    ``--rdzv-conf handler=torch`` asks for torch's exact protocol. A store that goes away
    now (its host exited as this node came: the end of an elastic job) raises torch's
    ``RendezvousConnectionError``, for the caller to tell a late node from a failure
    (:func:`late_for_the_job`); other errors are a :class:`RendezvousFailure`."""
    if settings.torch_handler:
        try:
            backend = C10dRendezvousBackend(store, params.run_id)
            return dynamic_rendezvous.create_handler(store, backend, params)
        except RendezvousConnectionError:
            raise
        except (RendezvousError, RuntimeError, TimeoutError, ValueError, OSError) as err:
            raise RendezvousFailure(endpoint, describe_error(err)) from None
    handler = RoundsRendezvous(
        store,
        SignedStore(store, signer),
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        params.local_addr or socket.getfqdn(),
        last_call_s=settings.first_last_call_s,
        join_timeout_s=settings.join_timeout_s,
        use_agent_store=compat.shares_agent_store(),
    )
    handler.is_closed()  # a store gone already raises here (a late node's job ended)
    beats = KeyedLiveness(
        handler,
        SignedStore(own_connection(store), signer),
        params.run_id,
        settings.keep_alive_interval_s,
        settings.dead_after_s,
    )
    return KeyedLivenessRendezvous(handler, beats)


def own_connection(store: Any) -> Any:
    """Another client of ``store``'s server, for the keyed liveness, where ``store`` is a
    ``TCPStore`` client: a call that waits holds its client for every thread that uses it
    (torch's ``next_rendezvous`` waits for rank 0's address after a round, up to the
    store's timeout; rank 0 of a round of 1,000 nodes may take more than the dead-node
    time to finish its join), and a node whose heartbeats wait that long looks dead to its
    watchers. ``store`` itself where it is another kind, or where no second connection
    could be made (said in the debug log)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    if not isinstance(store, TCPStore):
        return store
    try:
        timeout = store.timeout  # type: ignore[attr-defined]
        return TCPStore(store.host, store.port, is_master=False, timeout=timeout)
    except (RuntimeError, OSError, ValueError) as err:
        log.debug("the liveness shares the rendezvous' connection: %s", err)
        return store


def rendezvous_store(
    params: RendezvousParameters, settings: RendezvousSettings, endpoint: Endpoint
) -> tuple[Any, bool]:
    """The c10d rendezvous store as torch's c10d backend makes it (``is_host``,
    ``read_timeout``), hosted on the peers' address only (listen.py); and whether this
    process hosts it (not when another agent of this host took the port first)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    read_timeout = settings.read_timeout_s
    # given, or this node's host name is the endpoint's (a pod before its DNS record is
    # published): rendezvous_parameters
    given = params.get_as_bool("is_host")
    # as torch's c10d backend decides: an endpoint that names this machine (not merely an
    # address this host could bind: nodes sharing a network, as two Slurm nodes on one
    # machine, would race for the port)
    if given if given is not None else compat.is_this_machine(endpoint.host):
        try:
            return listen.hosted_store(endpoint.host, endpoint.port, read_timeout, True), True
        except OSError:
            if given is not None:
                raise
            # another agent of this host hosts it (several nodes on one host)
    client = diagnosis.store_client(
        lambda: TCPStore(
            endpoint.host,
            endpoint.port,
            is_master=False,
            multi_tenant=True,
            timeout=datetime.timedelta(seconds=read_timeout),
        ),
        endpoint,
    )
    return client, False


UNREADABLE_STATE_HINT = (
    " (the other nodes sign it with the job's secret: give this node the same one in"
    f" {SECRET_ENV} or {SECRET_FILE_ENV}, docs/security.md)"
)


def describe_error(err: BaseException) -> str:
    """The first line of an error and of its cause, without torch's internals."""
    lines: list[str] = []
    unreadable = False
    while err is not None and len(lines) < 2:
        unreadable = unreadable or isinstance(err, RendezvousStateError)
        text = (str(err).strip() or type(err).__name__).splitlines()[0]
        lines.append(text.removesuffix(" See inner exception for details.").rstrip(". "))
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return ": ".join(lines) + (UNREADABLE_STATE_HINT if unreadable else "")


def lost_nodes(before: dict[int, str], handler: RendezvousHandler) -> list[str]:
    """Members of an earlier round that are not in the rendezvous any more."""
    return liveness.node_names(liveness.absent_members(before, handler))
