"""The supervision loop's decisions, with a fake rendezvous and fake worker processes.

No process and no network: :class:`FakeRendezvous` is a ``RendezvousHandler`` whose rounds
are in-memory ``HashStore`` s and that answers what the agent's rendezvous tells
(``rendezvous/membership.py``: the members of the round, a node dropped, the round moved on)
and its keyed liveness (the verdicts); :class:`FakeWorkers` stands for one attempt's
``WorkerProcesses``, each poll answered by the test's plan. Each test names one decision:
restart after a failure, scale up when nodes wait, re-form without a lost peer (no restart
counted), a hang, giving up.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.elastic.agent.server.api import WorkerState
from torch.distributed.elastic.multiprocessing.api import RunProcsResult
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import AgentConfig, config_from_args
from torchx_elastic.agent.console.failure.first_failure import LOST_NODE, FirstFailure
from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.agent.rendezvous.failover import HostLost
from torchx_elastic.agent.supervision import loop
from torchx_elastic.agent.supervision.loop import Supervision, Supervisor
from torchx_elastic.agent.supervision.watchdog import HangWatchdog
from torchx_elastic.agent.supervision.worker_ranks import ROLE_INFO_PREFIX
from torchx_elastic.agent.workers.bootstrap import DUMP_STACKS_SIGNAL
from torchx_elastic.contract import EVENTS_FILE, FILE_TIMER_ENV, RESTART_COUNT_ENV
from torchx_elastic.contract import events as ev
from torchx_elastic.contract.error_file import read_error_file
from torchx_elastic.contract.events import EventLog

NPROC = 2
MAX_POLLS = 50  # a plan that never ends the attempt fails the test instead of hanging it


@dataclass(frozen=True)
class Node:
    addr: str
    pid: int


class FakeRendezvous(RendezvousHandler):
    """Rounds of this node (always rank 0) and ``peers``; ``waiting`` nodes want in. It is
    its own keyed liveness too: the peers it dropped are said dead."""

    def __init__(self, role: str, peers: int = 0) -> None:
        self._this_node = Node("10.0.0.1", 100)
        self.peers = [Node(f"10.0.0.{2 + i}", 200 + i) for i in range(peers)]
        self.waiting = 0
        self.rounds: list[int] = []  # the world size of each round
        self._role = role
        self.members: dict[int, Node] = {}
        self.dead_ids: set[str] = set()
        self.dropped = False  # this node, by its peers
        self.moved = False
        self.stopped: set[str] = set()
        self.absent_rounds = 0  # the first rounds whose peers never come to assign their ranks

    def next_rendezvous(self) -> Any:
        nodes = [self._this_node, *self.peers]
        self.members = dict(enumerate(nodes))
        self.dropped = self.moved = False
        self.waiting = 0  # who waited is in this round
        store = HashStore()
        if self.absent_rounds:
            self.absent_rounds -= 1
            store.set_timeout(datetime.timedelta(seconds=0.2))  # the store's wait times out
            nodes = nodes[:1]  # no peer writes its ranks' role
        for rank in range(1, len(nodes)):  # what the peers' agents write (assign_ranks)
            store.set(f"{ROLE_INFO_PREFIX}{rank}", json.dumps([self._role, NPROC]))
        self.rounds.append(len(self.members))
        return store, 0, len(self.members)

    def drop_peers(self) -> None:
        """A watcher said the peers dead: the round moved on without them."""
        self.dead_ids |= {_id(peer) for peer in self.peers}
        self.moved = True
        self.peers = []

    def drop_this_node(self) -> None:
        """A watcher of this node said it dead (its beats reached the store late)."""
        self.dropped = self.moved = True

    # -- the keyed liveness' questions (keyed_liveness.py) --------------------------

    def keyed_liveness(self) -> FakeRendezvous:
        return self

    def dead(self, node_ids: list[str], since_round: int) -> set[str]:
        return set(node_ids) & self.dead_ids

    def suspects(self) -> bool:
        return False

    def get_backend(self) -> str:
        return "c10d"

    @property
    def use_agent_store(self) -> bool:
        return False

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return self.waiting

    def get_run_id(self) -> str:
        return "job"

    def shutdown(self) -> bool:
        return True


# what one attempt's workers do at each poll: a result ends the attempt, None: still running
Plan = Callable[["FakeWorkers"], RunProcsResult | None]


@dataclass
class FakeWorkers:
    """One attempt's workers without processes, as ``Supervisor`` uses ``WorkerProcesses``."""

    plan: Plan
    envs: dict[int, dict[str, str]]
    error_files: dict[int, str]
    polls: int = 0
    started: bool = False
    signals: list[int] = field(default_factory=list)
    closed_with: list[signal.Signals | None] = field(default_factory=list)
    heed_sigterm: bool = False

    def start(self) -> None:
        self.started = True

    def pids(self) -> dict[int, int]:
        return {local_rank: 1000 + local_rank for local_rank in self.envs}

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None:
        self.polls += 1
        assert self.polls <= MAX_POLLS, "the loop kept polling an attempt the test left running"
        return self.plan(self)

    def close(self, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
        self.closed_with.append(death_sig)

    def signal_workers(self, sig: int) -> None:
        self.signals.append(sig)

    def any_running(self) -> bool:
        """Ranks blocked in a collective, unless the test's workers heed SIGTERM."""
        return not (self.heed_sigterm and signal.SIGTERM in self.signals)


def running_for(polls: int, then: Plan) -> Plan:
    return lambda workers: then(workers) if workers.polls > polls else None


def succeed(workers: FakeWorkers) -> RunProcsResult:
    return RunProcsResult(return_values=dict.fromkeys(workers.envs))


def fail(local_rank: int) -> Plan:
    def plan(workers: FakeWorkers) -> RunProcsResult:
        error_file = workers.error_files[local_rank]
        failure = ProcessFailure(local_rank, 1000 + local_rank, 1, error_file)
        return RunProcsResult(failures={local_rank: failure})

    return plan


@dataclass
class Harness:
    """A ``Supervisor`` over the fakes; ``plans``: one per attempt, in order."""

    tmp_path: Path
    config: AgentConfig
    rendezvous: FakeRendezvous
    plans: list[Plan]
    watchdog: HangWatchdog | None = None
    attempts: list[FakeWorkers] = field(default_factory=list)
    move_rendezvous: Callable[[HostLost, dict[int, str]], str] | None = None
    on_rendezvous_lost: Callable[[], None] = lambda: None
    started_pids: list[list[int]] = field(default_factory=list)  # what the channel was told
    on_failure: loop.OnFailure | None = None  # the job's first failure, as the nodes agree

    def make_workers(self, *, envs: dict[int, dict[str, str]], **_: Any) -> FakeWorkers:
        assert self.plans, "the loop started more attempts than the test planned"
        n = len(self.attempts)
        errors = {r: str(self.tmp_path / f"error_{n}_{r}.json") for r in envs}
        for earlier in self.attempts:
            assert earlier.closed_with, "a new attempt started before the last one was stopped"
        self.attempts.append(FakeWorkers(self.plans.pop(0), envs, errors))
        return self.attempts[-1]

    def run(self) -> tuple[Supervisor, Any]:
        events = EventLog(str(self.tmp_path / EVENTS_FILE))
        supervisor = Supervisor(
            self.config,
            self.rendezvous,
            logs_specs=None,  # type: ignore[arg-type]  # the fake workers write no logs
            make_sink=lambda outputs: None,  # type: ignore[arg-type,return-value]
            events=events,
            worker_extra_env={},
            supervision=Supervision(
                watchdog=self.watchdog,
                move_rendezvous=self.move_rendezvous,
                on_rendezvous_lost=self.on_rendezvous_lost,
                workers_started=lambda pids: self.started_pids.append(sorted(pids)),
                on_failure=self.on_failure,
            ),
            make_workers=self.make_workers,
        )
        return supervisor, supervisor.run()

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = (self.tmp_path / EVENTS_FILE).read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


def _id(node: Node) -> str:
    return f"{node.addr}_{node.pid}"


def _name(node: Node) -> str:
    return f"{node.addr} (agent pid {node.pid})"


@pytest.fixture(autouse=True)
def _membership_of_the_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    """membership.py's answers, from the fake rendezvous (the agent's own tells them)."""
    from torchx_elastic.agent.rendezvous import membership

    def of(answer: Any, default: Any) -> Any:
        return lambda h, *_: answer(h) if isinstance(h, FakeRendezvous) else default

    fake = FakeRendezvous
    answers = {
        "round_members": of(lambda h: {r: _name(n) for r, n in h.members.items()}, {}),
        "round_node_ids": of(lambda h: {r: _id(n) for r, n in h.members.items()}, {}),
        "round_addresses": of(lambda h: {r: n.addr for r, n in h.members.items()}, {}),
        "this_node_address": of(lambda h: h._this_node.addr, None),
        "dropped_from_round": of(lambda h: h.dropped, False),
        "round_moved": of(lambda h: h.moved, False),
    }
    del fake
    for name, answer in answers.items():
        monkeypatch.setattr(membership, name, answer)


def config(max_restarts: int, *extra: str) -> AgentConfig:
    argv = ["--nnodes", "1:3", "--nproc-per-node", str(NPROC), "--rdzv-backend", "c10d"]
    argv += ["--rdzv-endpoint", "127.0.0.1:29500", "--local-addr", "127.0.0.1"]
    argv += ["--max-restarts", str(max_restarts), "--monitor-interval", "0", *extra]
    return config_from_args(build_parser().parse_args([*argv, "train.py"]))


@pytest.fixture(autouse=True)
def _no_file_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FILE_TIMER_ENV, raising=False)


def harness(tmp_path: Path, max_restarts: int, plans: list[Plan], peers: int = 0) -> Harness:
    # the fake peers never reach the exit barrier: a second, not its 30 s default
    c = config(max_restarts, *(["--exit-barrier-timeout", "1"] if peers else []))
    return Harness(tmp_path, c, FakeRendezvous(c.role, peers), plans)


def test_a_failed_rank_restarts_the_group_while_restarts_are_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = harness(tmp_path, 1, [running_for(2, fail(1)), running_for(1, succeed)])
    supervisor, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert [w.envs[0][RESTART_COUNT_ENV] for w in h.attempts] == ["0", "1"]
    assert h.attempts[0].closed_with[0] == signal.SIGTERM  # stopped before the next start
    assert h.rendezvous.rounds == [1, 1]  # a new round for the new attempt
    assert h.started_pids == [[1000, 1001], [1000, 1001]]  # each attempt's, once started
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"], restart["restarts_left"]) == ("failure", 1, 0)
    assert supervisor.remaining_restarts == 0
    assert [f["failures"] for f in h.events(ev.FAILURE)] == [
        {"1": {"local_rank": 1, "pid": 1001, "exitcode": 1}}
    ]
    assert capsys.readouterr().err.splitlines() == [
        "torchx-elastic: a rank failed; restarting every node: attempt 2 of 2 (0 restarts"
        " left), rendezvous round 2 next"
    ]


def test_a_failure_with_no_restart_left_gives_up_with_the_failure(tmp_path: Path) -> None:
    h = harness(tmp_path, 1, [fail(0), fail(1)])
    _, result = h.run()
    assert result.state == WorkerState.FAILED
    assert list(result.failures) == [1]  # the last attempt's failure, by global rank
    assert len(h.attempts) == 2  # max_restarts 1: two attempts, no third
    assert len(h.events(ev.RESTART)) == 1
    assert len(h.events(ev.FAILURE)) == 2


def test_nodes_waiting_to_join_re_form_the_group_without_counting_a_restart(
    tmp_path: Path,
) -> None:
    def a_node_arrives(workers: FakeWorkers) -> None:
        if workers.polls == 2:
            h.rendezvous.waiting = 1
            h.rendezvous.peers.append(Node("10.0.0.9", 900))

    h = harness(tmp_path, 0, [lambda w: a_node_arrives(w), fail(0)])
    supervisor, result = h.run()
    assert h.rendezvous.rounds == [1, 2]  # the next round has the new node
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"]) == ("membership change", 0)
    assert [w.envs[0][RESTART_COUNT_ENV] for w in h.attempts] == ["0", "0"]
    assert supervisor.remaining_restarts == 0  # max_restarts 0 and still a second attempt
    assert h.attempts[1].envs[0]["WORLD_SIZE"] == str(2 * NPROC)
    assert result.state == WorkerState.FAILED


def test_ranks_that_fail_with_a_lost_peer_re_form_without_it_and_no_restart_is_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def peer_lost(workers: FakeWorkers) -> RunProcsResult | None:
        if workers.polls < 2:
            return None
        h.rendezvous.drop_peers()  # torch's handler dropped it; our ranks' collectives broke
        return fail(0)(workers)

    h = harness(tmp_path, 0, [peer_lost, running_for(1, succeed)], peers=1)
    supervisor, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert h.rendezvous.rounds == [2, 1]
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"]) == ("peer lost", 0)
    assert restart["lost"] == ["node 1: 10.0.0.2 (agent pid 200)"]
    assert h.events(ev.FAILURE) == []  # the peer's loss, not a failure of this node's ranks
    assert supervisor.remaining_restarts == 0
    assert capsys.readouterr().err.startswith(
        "torchx-elastic: node 1: 10.0.0.2 (agent pid 200) stopped answering (no rendezvous"
        " heartbeat for "
    )


def test_ranks_that_fail_because_a_node_vanished_re_form_spending_no_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job's first failure is a node whose agent is gone (the presence port): its peers'
    ranks failed only with it, so the job re-forms (a spare takes its place) with the default
    --max-restarts 0, and the workers' restart count stays."""
    lost = FirstFailure(
        2,
        1,
        LOST_NODE,
        "node 1 (10.0.0.2, agent pid 200) was lost: its agent is gone (nothing listens on its"
        " port 10.0.0.2:41877 any more)",
    )
    h = harness(tmp_path, 0, [running_for(2, fail(0)), running_for(1, succeed)], peers=1)

    def on_failure(*_: Any) -> FirstFailure:
        h.rendezvous.drop_peers()  # the node that found it dropped it from the rendezvous
        return lost

    h.on_failure = on_failure
    supervisor, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert h.rendezvous.rounds == [2, 1]
    assert [w.envs[0][RESTART_COUNT_ENV] for w in h.attempts] == ["0", "0"]
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"]) == ("peer lost", 0)
    assert restart["lost"] == [lost.message]
    assert supervisor.remaining_restarts == 0
    assert capsys.readouterr().err.splitlines() == [
        "torchx-elastic: node 1 (10.0.0.2, agent pid 200) was lost: its agent is gone (nothing"
        " listens on its port 10.0.0.2:41877 any more); re-forming without it: rendezvous round"
        " 2 next (a lost node is not the script's failure: no restart spent, 0 restarts left)"
    ]


def test_a_node_its_peers_dropped_joins_again_without_counting_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its heartbeats reached the others late (a stalled agent): they went on without it while
    its ranks ran on alone; it stops them and joins the next round."""

    def dropped(workers: FakeWorkers) -> None:
        if workers.polls == 2:
            h.rendezvous.drop_this_node()

    h = harness(tmp_path, 0, [dropped, running_for(1, succeed)], peers=1)
    supervisor, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert h.rendezvous.rounds == [2, 2]
    assert h.attempts[0].closed_with[0] == signal.SIGTERM
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"], restart["next_round"]) == ("dropped", 0, 2)
    assert h.events(ev.FAILURE) == []
    assert supervisor.remaining_restarts == 0
    assert capsys.readouterr().err.splitlines() == [
        "torchx-elastic: the other nodes dropped this node from the rendezvous (they saw no"
        " heartbeat from it for 10s: its agent was stalled or starved of CPU) and went on"
        " without it: stopping its workers and joining again"
    ]


@pytest.mark.parametrize("heed_sigterm", [False, True])
def test_a_lost_rendezvous_host_moves_the_rendezvous_and_re_forms_without_a_restart(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    heed_sigterm: bool,
) -> None:
    # workers that exit on SIGTERM are not waited for the whole grace (a minute here)
    monkeypatch.setattr(loop, "ABANDON_GRACE_S", 60.0 if heed_sigterm else 0.0)
    said: list[str] = []

    def host_lost(workers: FakeWorkers) -> None:
        workers.heed_sigterm = heed_sigterm
        if workers.polls == 2:
            h.rendezvous.num_nodes_waiting = lost  # type: ignore[method-assign]

    def lost() -> int:
        del h.rendezvous.num_nodes_waiting  # the moved rendezvous answers again
        raise HostLost("h0:29500 did not answer for 20s")

    def move(news: HostLost, last_round: dict[int, str]) -> str:
        said.append(f"move {news} from {last_round}")
        return "torchx-elastic: moved"

    h = harness(tmp_path, 0, [host_lost, running_for(1, succeed)], peers=1)
    h.move_rendezvous = move
    h.on_rendezvous_lost = lambda: said.append("round's store forgotten")
    supervisor, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert said == [
        "round's store forgotten",
        "move h0:29500 did not answer for 20s from {0: '10.0.0.1', 1: '10.0.0.2'}",
    ]
    # SIGTERM, then SIGKILL for ranks blocked in a collective with the lost host that did
    # not heed the first; then the attempt is closed before the next one starts
    killed = [] if heed_sigterm else [signal.SIGKILL]
    assert h.attempts[0].signals == [signal.SIGTERM, *killed]
    assert h.rendezvous.rounds == [2, 2]
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"]) == ("rendezvous host lost", 0)
    assert restart["lost"] == "h0:29500 did not answer for 20s"
    assert supervisor.remaining_restarts == 0  # max_restarts 0 and still a second attempt
    assert capsys.readouterr().err.splitlines() == ["torchx-elastic: moved"]


def test_a_round_whose_member_never_assigns_its_ranks_is_left_for_the_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A member of the round never comes to the rank assignment (it went on to a later round,
    or is gone) and the store's wait times out: this node says so in one line and joins the
    next round, a membership change (no restart spent); before, torch's store error ended
    the agent with a traceback (a netns run: DistStoreError, wait timeout)."""
    h = harness(tmp_path, 0, [running_for(1, succeed)], peers=1)
    h.rendezvous.absent_rounds = 1
    supervisor, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert h.rendezvous.rounds == [2, 2]
    (restart,) = h.events(ev.RESTART)
    assert (restart["reason"], restart["attempt"]) == ("membership change", 0)
    assert supervisor.remaining_restarts == 0
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "torchx-elastic: the rendezvous round did not start (its nodes' ranks could not be"
        " assigned: "
    ), line
    assert line.endswith("); this node joins the next round"), line


def test_a_static_rendezvous_whose_member_never_assigns_its_ranks_ends_the_run(
    tmp_path: Path,
) -> None:
    """A static rendezvous has one round: no next one to join (torch's error, as torchrun)."""
    h = harness(tmp_path, 0, [running_for(1, succeed)], peers=1)
    h.config = dataclasses.replace(h.config, rdzv_backend="static")
    h.rendezvous.absent_rounds = 1
    with pytest.raises(RuntimeError):
        h.run()
    assert h.rendezvous.rounds == [2]


def test_a_round_whose_store_goes_with_its_host_follows_the_rendezvous(tmp_path: Path) -> None:
    """The store goes with its host as the round's nodes assign their ranks (a Kubernetes
    run: pod 0, the store's host, deleted as a spare came into the round; the spare ended
    with torch's DistNetworkError): the rendezvous moves, as when the host is lost later."""
    said: list[str] = []

    def closed_once() -> bool:
        del h.rendezvous.is_closed  # the moved rendezvous answers
        raise HostLost("the connection to the rendezvous store at h0:29500 failed")

    def move(news: HostLost, last_round: dict[int, str]) -> str:
        said.append(f"move: {news}")
        return "torchx-elastic: moved"

    h = harness(tmp_path, 0, [running_for(1, succeed)], peers=1)
    h.rendezvous.absent_rounds = 1
    h.rendezvous.is_closed = closed_once  # type: ignore[method-assign]
    h.move_rendezvous = move
    _, result = h.run()
    assert result.state == WorkerState.SUCCEEDED
    assert said == ["move: the connection to the rendezvous store at h0:29500 failed"]
    assert h.rendezvous.rounds == [2, 2]
    assert [e["reason"] for e in h.events(ev.RESTART)] == ["rendezvous host lost"]


def test_a_lost_rendezvous_host_without_a_move_ends_the_run(tmp_path: Path) -> None:
    def host_lost(workers: FakeWorkers) -> None:
        if workers.polls == 2:
            h.rendezvous.num_nodes_waiting = lost  # type: ignore[method-assign]

    def lost() -> int:
        raise HostLost("h0:29500 did not answer for 20s")

    h = harness(tmp_path, 0, [host_lost], peers=1)
    with pytest.raises(RendezvousError, match="h0:29500 did not answer for 20s"):
        h.run()


def test_a_rank_silent_past_the_hang_timeout_dumps_stacks_and_fails_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "STACK_DUMP_WAIT_S", 0.0)
    now = [0.0]
    activity = RankActivity(clock=lambda: now[0])
    watchdog = HangWatchdog(activity, 60.0, clock=lambda: now[0])

    def silent_for_a_minute(workers: FakeWorkers) -> None:
        if workers.polls == 2:
            now[0] += 61.0
            activity.heartbeat(0, 0)  # rank 0 speaks, rank 1 never did

    h = harness(tmp_path, 0, [lambda w: silent_for_a_minute(w)])
    h.watchdog = watchdog
    _, result = h.run()
    assert result.state == WorkerState.FAILED
    assert h.attempts[0].signals == [DUMP_STACKS_SIGNAL]
    assert list(result.failures) == [1]
    failure = result.failures[1]
    assert (failure.pid, failure.exitcode) == (1001, -int(signal.SIGKILL))
    message = (
        "hang: rank 1 sent no progress or heartbeat for 60s (--hang-timeout-s); every rank's"
        " Python stack was dumped to its stderr log"
    )
    content = read_error_file(failure.error_file)  # the rank's error file says why
    assert content is not None and content.message == message
    (hang,) = h.events(ev.HANG)
    assert (hang["ranks"], hang["message"]) == ([1], message)


def test_node_0_assigns_every_nodes_ranks_in_two_store_calls_whatever_the_job_size() -> None:
    """Blocks of consecutive ranks in node order (nodes may run different numbers of
    workers), read and written by node 0 with one multi_get and one multi_set."""
    from torchx_elastic.agent.supervision import worker_ranks

    calls: list[str] = []

    class Counted(HashStore):  # type: ignore[misc]
        def __getattribute__(self, name: str) -> Any:
            if name in ("set", "get", "multi_get", "multi_set"):
                calls.append(name)
            return super().__getattribute__(name)

    store = Counted()
    nodes = [("trainer", 2), ("trainer", 1), ("reader", 3), ("trainer", 2)]
    for rank, (role, nproc) in enumerate(nodes[1:], start=1):  # the peers wrote theirs
        store.set(f"{ROLE_INFO_PREFIX}{rank}", json.dumps([role, nproc]))
    calls.clear()
    assert worker_ranks.assign_worker_ranks(store, 0, 4, "trainer", 2) == (0, 8, 0, 5)
    assert calls == ["set", "multi_get", "multi_set", "get"]
    assert [worker_ranks.assign_worker_ranks(store, r, 4, *nodes[r]) for r in (1, 2, 3)] == [
        (2, 8, 2, 5),
        (3, 8, 0, 3),
        (6, 8, 3, 5),
    ]
