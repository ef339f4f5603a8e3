"""One agent run: config -> rendezvous handler, console, supervisor -> exit code."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult
from torch.distributed.elastic.multiprocessing.api import LogsSpecs, SignalException, Std
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousTimeoutError,
)

from torchx_elastic.agent.config.launch import AgentConfig, UsageError, apply_process_environment
from torchx_elastic.agent.console.output.agent_line import say
from torchx_elastic.agent.console.output.sinks import SinkOptions
from torchx_elastic.agent.console.session import ConsoleSession
from torchx_elastic.agent.rendezvous import listen, liveness, membership
from torchx_elastic.agent.rendezvous.closing import leave_last
from torchx_elastic.agent.rendezvous.diagnosis import RendezvousDiagnosis
from torchx_elastic.agent.rendezvous.failover import NoSuccessor
from torchx_elastic.agent.rendezvous.handler import (
    JobAlreadyFinished,
    RendezvousFailure,
    create_handler,
    describe_error,
    hosts_store,
    late_for_the_job,
    lost_nodes,
)
from torchx_elastic.agent.rendezvous.job_secret import job_secret
from torchx_elastic.agent.rendezvous.observed import ObservedRendezvous, RoundListener
from torchx_elastic.agent.rendezvous.presence import PresencePort
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner, signed_rounds
from torchx_elastic.agent.supervision.elastic_events import check_handler, record_agent_end
from torchx_elastic.agent.supervision.health_check import HealthCheck, HealthCheckFailed
from torchx_elastic.agent.supervision.loop import Supervision, Supervisor
from torchx_elastic.agent.supervision.network_watch import NetworkWatch, watch_network
from torchx_elastic.agent.supervision.peer_presence import PeerPresence
from torchx_elastic.agent.supervision.rendezvous_move import RendezvousMove, movable_rendezvous
from torchx_elastic.agent.supervision.stop_signals import (
    absorb_stop_signals,
    raise_on_stop_signals,
    stopped_before_joining,
)
from torchx_elastic.agent.supervision.watchdog import HangWatchdog
from torchx_elastic.agent.workers.forkserver import ForkServer
from torchx_elastic.agent.workers.janitor import Janitor
from torchx_elastic.agent.workers.logs import RankLogsSpecs
from torchx_elastic.contract.error_exit import say_error
from torchx_elastic.contract.log_layout import DEFAULT_LOG_DIR_PREFIX

log = logging.getLogger(__name__)

LOGS_SPECS_GROUP = "torchrun.logs_specs"


def logs_specs(config: AgentConfig, log_dir: str) -> LogsSpecs:
    """Our per-rank log files, or the ``--logs-specs`` entry point's class (as torchrun)."""
    name = config.logs_specs_name
    if name is None:
        return RankLogsSpecs(log_dir)
    found = [ep for ep in metadata.entry_points(group=LOGS_SPECS_GROUP) if ep.name == name]
    if not found:
        raise UsageError(
            f"--logs-specs {name!r}: no entry point of that name in the group"
            f" {LOGS_SPECS_GROUP!r}; install the package that provides it"
        )
    cls = found[0].load()
    specs = cls(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE, local_ranks_filter=None)
    if not isinstance(specs, LogsSpecs):
        raise UsageError(f"--logs-specs {name!r}: {cls!r} is not a LogsSpecs class")
    return specs


def console_session(config: AgentConfig, log_dir: str) -> ConsoleSession:
    console = config.console
    options = SinkOptions(
        prefix_template=console.prefix_template,
        tee=console.streams,
        show_ranks=console.show_ranks,
        role=config.role,
        show_local_ranks=console.show_local_ranks,
        duplicate_filters={
            "stdout": console.duplicate_stdout_filters,
            "stderr": console.duplicate_stderr_filters,
        },
    )
    return ConsoleSession(
        log_dir, console.mode, console.status_interval_s, options, config.no_retry
    )


@dataclass
class RunEnd:
    """How the supervision of one run ended."""

    result: RunResult | None = None
    """The workers' last result; None when the run ended otherwise (a signal, the rendezvous)."""
    failure: RendezvousFailure | JobAlreadyFinished | NoSuccessor | HealthCheckFailed | None = None
    code: int = 1
    shutdown_rendezvous: bool = True
    """False when the rendezvous stays open for the other nodes (a stop signal, a lost host)."""


def launch(
    config: AgentConfig,
    fork_server: ForkServer | None = None,
    node0_warning: str | None = None,
) -> int:
    """Run the agent in this process to the end; the exit code (torch's ``elastic_launch``
    for a function calls this too: what only torchrun sets is in :func:`run`).
    ``node0_warning``: logged once the first rendezvous round made this node node 0."""
    check_handler(config.event_log_handler)
    started_s = time.monotonic()
    log_dir = config.log_dir or tempfile.mkdtemp(prefix=DEFAULT_LOG_DIR_PREFIX)  # 0700
    os.makedirs(log_dir, mode=0o700, exist_ok=True)  # a new one is its user's only, as torchrun's
    raise_on_stop_signals()
    specs = logs_specs(config, log_dir)
    session = console_session(config, log_dir)
    signer = StoreSigner(job_secret(config.job_secret, config.max_nodes + config.spares))
    handler, move = open_rendezvous(config, session, signer, node0_warning)
    janitor = Janitor()
    watchdog = None
    if config.hang_timeout_s > 0:
        watchdog = HangWatchdog(session.activity, config.hang_timeout_s)
    presence = peer_presence(config, handler, signer)
    if presence is not None:  # node rank 0 waits for no final progress report of a lost node
        session.job_progress.nodes_gone(presence.gone)
    supervisor = Supervisor(
        config,
        handler,
        specs,
        session.make_sink,
        session.events,
        session.worker_env(),
        Supervision(
            janitor=janitor,
            watchdog=watchdog,
            fork_server=fork_server,
            on_failure=session.attempt_failed,
            signer=signer,
            move_rendezvous=move.move if move else None,
            on_rendezvous_lost=session.rendezvous_lost,
            workers_started=session.channel.expect,
            health_check=(
                HealthCheck(config.health_check, session.log_dir) if config.health_check else None
            ),
            presence=presence,
        ),
    )
    watch = network_watch(config, handler, supervisor, move)
    end = supervise(config, supervisor, session, janitor, watch)
    try:
        return finish(config, supervisor, session, end, started_s)
    finally:
        if move is not None:  # its beacon tells late nodes where the job went until now
            move.close()
        if presence is not None:
            presence.close()


def peer_presence(
    config: AgentConfig, handler: ObservedRendezvous, signer: StoreSigner
) -> PeerPresence | None:
    """This node's presence port where the job may have several nodes (None: a port at the
    address its peers use cannot be had, said in the agent's log). On loopback where the
    nodes meet there (one host), as the stores: nothing of a one-host job listens beyond."""
    host = membership.this_node_address(handler)
    if config.max_nodes <= 1 or host is None:
        return None
    if listen.is_loopback_host(config.rdzv_endpoint.host) and not listen.is_loopback_host(host):
        host = listen.LOOPBACK
    try:
        return PeerPresence(PresencePort(host), signer)
    except OSError as err:
        log.info("no presence port at %s (%s): a lost peer is known by its heartbeats", host, err)
        return None


def open_rendezvous(
    config: AgentConfig, session: ConsoleSession, signer: StoreSigner, node0_warning: str | None
) -> tuple[ObservedRendezvous, RendezvousMove | None]:
    """The rendezvous handler, observed (every round's store reaches the console), and its
    move to a survivor if the job allows one; a :class:`RendezvousFailure` when none can
    be made (the console closed)."""
    try:
        # every round's store reaches the cross-node progress exchange
        on_round: RoundListener = signed_rounds(session.start_round, signer)
        if node0_warning is not None:
            on_round = warn_on_node0(node0_warning, on_round)
        created = create_handler(config, signer, session.waiting_for_nodes)
        move = movable_rendezvous(config, signer, created)
        observed = ObservedRendezvous(move.movable if move else created, on_round)
        # the job's progress says how many nodes stand by as spares (node rank 0's view); a
        # weak reference: the session must not keep the rendezvous (its store) alive in a cycle
        handler_ref = weakref.ref(observed)
        session.job_progress.count_standbys(lambda: standbys_of(handler_ref()))
        return observed, move
    except RendezvousError as err:
        session.close()
        if late_for_the_job(err, config):  # its host went away as this node reached it
            raise JobAlreadyFinished(config.rdzv_endpoint, config.run_id, err) from None
        raise RendezvousFailure(config.rdzv_endpoint, describe_error(err)) from None
    except BaseException:
        session.close()
        raise


def standbys_of(handler: ObservedRendezvous | None) -> int:
    """Nodes standing by in ``handler``'s rendezvous (0 once it is gone)."""
    return 0 if handler is None else membership.standbys(handler)[0]


def network_watch(
    config: AgentConfig,
    handler: ObservedRendezvous,
    supervisor: Supervisor,
    move: RendezvousMove | None,
) -> NetworkWatch | None:
    """The started watch of a multi-host job: it gives up, or moves the rendezvous."""
    if move is None:
        return watch_network(config, handler, supervisor.abandon_workers)
    move.attach(lambda: supervisor.last_round_addresses)
    move.watch = watch_network(config, handler, supervisor.abandon_workers, move.on_host_lost)
    return move.watch


def supervise(
    config: AgentConfig,
    supervisor: Supervisor,
    session: ConsoleSession,
    janitor: Janitor,
    watch: NetworkWatch | None,
) -> RunEnd:
    """Run the supervision loop to its end, then stop what served it (the console closed)."""
    end = RunEnd()
    handler = supervisor.handler
    try:
        end.result = supervisor.run()
        end.code = 1 if end.result.is_failed() else 0
    except SignalException as err:
        # as torch's launcher: a node stopped by a signal leaves the rendezvous open, so the
        # other nodes can go on with a replacement (shutdown() would close it for all)
        end.shutdown_rendezvous = False
        end.code = 128 + int(err.sigval)
    except (NoSuccessor, HealthCheckFailed) as err:  # the job is lost, or this node stays out
        end.shutdown_rendezvous = False
        end.failure = err
    except RendezvousDiagnosis as err:
        # a node that never joined (other settings, another job at its endpoint, ...) leaves
        # the others' rendezvous as it found it: closing it would end a job already running.
        # Its join timing out closes it, as torchrun's does.
        timed_out = isinstance(err.__cause__, RendezvousTimeoutError)
        end.shutdown_rendezvous = timed_out or supervisor.last_round is not None
        raise
    except RendezvousError as err:
        if supervisor.last_round is None and late_for_the_job(err, config):
            # arrived after the job's end: nothing to do, and nothing of the job to close
            end.shutdown_rendezvous = False
            end.failure = JobAlreadyFinished(config.rdzv_endpoint, handler.get_run_id(), err)
        elif not (
            # the last node whose ranks failed closes the rendezvous: the job's first failure
            isinstance(err, RendezvousClosedError)
            and session.failed_elsewhere(supervisor.attempt) is not None
        ):
            end.failure = rendezvous_failure(err, supervisor, config)
    finally:
        absorb_stop_signals()  # a signal now (the job ended or is stopping) ends nothing early
        if watch is not None:
            watch.close()
        janitor.close()
        if end.shutdown_rendezvous:
            handler.shutdown()
        else:  # left open for the others: its heartbeats end here, not at the process's exit
            liveness.stop_heartbeats(handler)
        session.close()
    return end


def finish(
    config: AgentConfig,
    supervisor: Supervisor,
    session: ConsoleSession,
    end: RunEnd,
    started_s: float,
) -> int:
    """After the supervision: the end recorded, the summary and report, the store's host
    leaving last; the exit code, or the failure raised."""
    handler = supervisor.handler
    stopped = f"the agent stopped (exit code {end.code})"
    error = None if end.result is not None else str(end.failure or stopped)
    record_agent_end(
        config, supervisor.last_round, supervisor.attempt, time.monotonic() - started_s, error
    )
    if isinstance(end.failure, JobAlreadyFinished):
        raise end.failure
    session.finish(end.result, end.code, attempt=supervisor.attempt)
    if end.shutdown_rendezvous:  # the job ended (not by a signal): its store's host leaves last
        leave_last(supervisor.last_round, hosts_store(handler))
    if end.failure is not None:
        raise end.failure
    if end.code == 0:
        keep_closed_rendezvous_up(config, supervisor, hosts_store(handler))
    return end.code


def warn_on_node0(warning: str, on_round: RoundListener) -> RoundListener:
    """``on_round`` that first logs ``warning`` if the first round made this node node 0."""
    pending = [warning]

    def listener(store: Any, rank: int, num_nodes: int) -> None:
        if pending and rank == 0:
            log.warning(pending[0])
        pending.clear()
        on_round(store, rank, num_nodes)

    return listener


STANDBY_LINGER_S = 3.0  # a node standing by reads the rendezvous' state every second


def keep_closed_rendezvous_up(config: AgentConfig, supervisor: Supervisor, hosting: bool) -> None:
    """The host of the closed rendezvous stays up a little where a node may still come or
    wait: after an elastic job that never had its maximum of nodes, a node still on its way
    (a pod that found no room until now) learns that the job has finished instead of waiting
    for a host that is gone (``finished_grace_s``); nodes standing by (spares) learn it
    within :data:`STANDBY_LINGER_S`. A job that had its maximum and lost a node waits for
    nobody: that node is gone (its replacement, if any, finds no host and exits, as a late
    node of an elastic job does)."""
    last_round = supervisor.last_round
    if last_round is None or not hosting:
        return
    linger_s = 0.0
    if supervisor.largest_world < config.max_nodes:
        linger_s = config.rdzv.finished_grace_s
    elif membership.standbys(supervisor.handler)[0]:
        linger_s = STANDBY_LINGER_S
    if linger_s <= 0:
        return
    try:
        time.sleep(linger_s)
    except SignalException:
        pass  # stopped while waiting: the job has succeeded all the same


def rendezvous_failure(
    err: RendezvousError, supervisor: Supervisor, config: AgentConfig
) -> RendezvousFailure:
    what = describe_error(err)
    lost = lost_nodes(supervisor.last_round_members, supervisor.handler)
    if lost:
        what += f" while waiting for {config.nnodes} node(s); lost since the last round: "
        what += ", ".join(lost)
    return RendezvousFailure(config.rdzv_endpoint, what)


def run(config: AgentConfig, fork_server: ForkServer | None = None) -> None:
    """Run the agent and exit with the job's exit code."""
    try:
        node0_warning = apply_process_environment(config)
        code = launch(config, fork_server, node0_warning)
    except (
        UsageError,
        RendezvousFailure,
        RendezvousDiagnosis,
        NoSuccessor,
        HealthCheckFailed,
    ) as err:
        say_error(err)
        code = 1
    except JobAlreadyFinished as err:
        say(f"torchx-elastic: {err}")
        code = 0
    except SignalException as err:  # stopped before its rendezvous started (a Job that
        # succeeded removes its pods still waiting for the rank-0 host's name)
        absorb_stop_signals()
        say(stopped_before_joining(err.sigval))
        code = 128 + int(err.sigval)
    finally:
        if fork_server is not None:
            fork_server.close()
    # the job is over: skip the interpreter's teardown of torch (most of a second)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
