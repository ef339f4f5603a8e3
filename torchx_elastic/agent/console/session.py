"""Everything the user sees of one agent run, wired together for the launcher.

One :class:`ConsoleSession` per agent run owns the worker -> agent channel (progress,
heartbeats), the console (live bar or plain lines), the event log, and at the end writes the
JSON summary and prints the "Root cause" report. Each attempt's workers get a fresh
:class:`~torchx_elastic.agent.console.output.sinks.RankSink` from :meth:`make_sink`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from torch.distributed.elastic.agent.server.api import RunResult

from torchx_elastic.agent.console.failure import oom, report
from torchx_elastic.agent.console.failure.first_failure import (
    FirstFailure,
    agree,
    innermost_frame,
    leave_together,
)
from torchx_elastic.agent.console.output.display import (
    DEFAULT_STATUS_INTERVAL_S,
    make_console,
)
from torchx_elastic.agent.console.output.sinks import (
    DEFAULT_SINK_OPTIONS,
    OutputSink,
    RankOutput,
    RankSink,
    SinkOptions,
    Stream,
)
from torchx_elastic.agent.console.progress.channel import ActivityChannel, RankActivity
from torchx_elastic.agent.console.progress.exchange import JobProgressExchange
from torchx_elastic.contract import ERROR_FILE_ENV, FILTERED_FILE, RANK_ERROR_FILE, job_failure_line
from torchx_elastic.contract import events as ev
from torchx_elastic.contract.agent_args import DEFAULT_CONSOLE, ConsoleMode
from torchx_elastic.contract.events import EventLog
from torchx_elastic.contract.not_retried import NO_RETRY_ENV, RETRY_ALL, NoRetryRule

log = logging.getLogger(__name__)

# the last failed attempt: its result (None: the job failed on another node while this
# node's ranks ran), this node's verdict, the job's first failure, the attempt
FailedAttempt = tuple[RunResult | None, report.Verdict, FirstFailure | None, int]


class ConsoleSession:
    def __init__(
        self,
        log_dir: str,
        mode: ConsoleMode = DEFAULT_CONSOLE,
        status_interval_s: float = DEFAULT_STATUS_INTERVAL_S,
        sink_options: SinkOptions = DEFAULT_SINK_OPTIONS,
        no_retry: NoRetryRule = RETRY_ALL,
    ) -> None:
        """``no_retry``: the failures that end the job without a restart."""
        self.log_dir = log_dir
        self._no_retry = no_retry
        self.activity = RankActivity()
        self.channel = ActivityChannel(self.activity)
        self.events = EventLog.in_dir(log_dir)
        # the whole job's progress, over the rendezvous store (see job_progress.py)
        self.job_progress = JobProgressExchange(
            self.activity, log_dir, record_event=self.events.emit
        )
        self.console = make_console(mode, self.activity, status_interval_s, self.job_progress)
        self._sink_options = sink_options
        self._sinks: list[RankSink] = []
        self._closed = False
        self._round: tuple[Any, int, int] | None = None  # store, node rank, nodes
        self._failed: FailedAttempt | None = None
        self._oom_at_start = oom.OomCounts()  # the OOM killer's counts as the attempt started

    def start_round(self, store: Any, node_rank: int, num_nodes: int) -> None:
        """A rendezvous round completed (its store reaches the job-wide exchanges)."""
        self._round = (store, node_rank, num_nodes)
        self.job_progress.start_round(store, node_rank, num_nodes)

    def rendezvous_lost(self) -> None:
        """The rendezvous host is lost: nothing more is exchanged through its store."""
        self._round = None
        self.job_progress.store_lost()

    def waiting_for_nodes(self, line: str | None) -> None:
        """The job-wide progress line while the first round waits (None: it is complete)."""
        self.console.waiting_for_nodes(line)

    def worker_env(self) -> dict[str, str]:
        """Extra environment of every worker: the channel's address, and the failures not
        retried when some are named (the bootstrap reads them)."""
        named = self._no_retry.text()
        return {**self.channel.env(), **({NO_RETRY_ENV: named} if named else {})}

    def make_sink(self, ranks: list[RankOutput]) -> OutputSink:
        attempt_dir = os.path.dirname(os.path.dirname(ranks[0].stdout_path)) if ranks else "."
        sink = RankSink(
            ranks,
            self.console,
            self._sink_options,
            {
                s: os.path.join(attempt_dir, FILTERED_FILE.format(stream=s))
                for s in ("stdout", "stderr")
            },
        )
        self._sinks.append(sink)
        self._oom_at_start = oom.read_counts()
        self.job_progress.set_ranks({r.local_rank: r.global_rank for r in ranks})
        return _EndingSink(sink, self.job_progress.workers_ended)

    def close(self) -> None:
        """Stop the console (a live bar is drawn one last time) and the channel."""
        if self._closed:
            return
        self._closed = True
        self.job_progress.close()  # its final figures first: the console shows them last
        self.console.close()
        self.channel.close()

    def finish(
        self, result: RunResult | None, exit_code: int, attempt: int, out: TextIO | None = None
    ) -> report.Verdict | None:
        """After the run: close, write the summary, log ``exit``, print the report on failure."""
        self.close()
        outputs = self._sinks[-1].outputs if self._sinks else []
        node = outputs[0].node_rank if outputs else (self.events.node or 0)
        verdict, first = None, None
        elsewhere = result is None and self._failed is not None and self._failed[0] is None
        failed = (result is not None and result.is_failed()) or elsewhere
        if failed:
            if self._failed is not None and self._failed[0] is result:
                _, verdict, first, failed_attempt = self._failed
                if self._round is not None and self._round[2] > 1:
                    leave_together(self._round[0], failed_attempt, self._round[2])
            else:
                assert result is not None
                verdict = self._verdict(result)
                first = _own_first_failure(verdict)
        state = "FAILED" if failed else ("SUCCEEDED" if exit_code == 0 else "STOPPED")
        path: str | None = report.summary_path(self.log_dir, node)
        try:
            report.write_summary(
                report.summary_path(self.log_dir, node),
                {
                    **report.summary(verdict, state, node, attempt, self.log_dir, exit_code),
                    "job_root_cause": None if first is None else asdict(first),
                },
            )
        except OSError as err:
            log.warning("cannot write the run summary %s: %s", path, err)
            path = None
        root = verdict.root if verdict else None
        self.events.emit(
            ev.EXIT,
            exit_code=exit_code,
            state=state,
            attempt=attempt,
            root_cause_rank=None if root is None else root.rank,
            summary=path,
            job_root_cause_rank=None if first is None else first.rank,
            job_root_cause_node=None if first is None else first.node,
        )
        if verdict is not None:
            self._write_reply_file(verdict, first)
            owner = first is None or (first.rank, first.node) == (
                (root.rank, root.node) if root else None
            )
            text = (
                report.render(verdict, self.log_dir, path)
                if owner or first is None
                else report.render_peer_failure(verdict, first, self.log_dir, path)
            )
            if first is not None:
                text += job_failure_line.line(first.describe()) + "\n"
            print(text, file=out or sys.stderr, end="", flush=True)
        return verdict

    def attempt_failed(
        self,
        result: RunResult,
        attempt: int,
        lost_peer: Callable[[], FirstFailure | None] | None = None,
    ) -> FirstFailure | None:
        """This node's ranks failed: the job's first failure, agreed with the other nodes
        (``lost_peer``: a peer found lost while waiting for it, see ``agree``)."""
        verdict = self._verdict(result)
        own = _own_first_failure(verdict)
        first = own
        if self._round is not None and self._round[2] > 1:
            offered = None if verdict.root_is_victim else own
            first = agree(self._round[0], attempt, offered, lost_peer=lost_peer)
        self._failed = (result, verdict, first, attempt)
        return first

    def failed_elsewhere(self, attempt: int) -> FirstFailure | None:
        """The rendezvous closed under this node's running ranks: the first failure that
        another node named for ``attempt``, if any (the job then failed there)."""
        if self._round is None or self._round[2] <= 1:
            return None
        first = agree(self._round[0], attempt, None)
        if first is not None:
            self._failed = (None, report.Verdict(root=None), first, attempt)
        return first

    def _verdict(self, result: RunResult) -> report.Verdict:
        sink = self._sinks[-1] if self._sinks else None
        outputs = sink.outputs if sink else []
        error_paths = {
            o.local_rank: os.path.join(os.path.dirname(o.stderr_path), RANK_ERROR_FILE)
            for o in outputs
        }
        facts = report.collect(result.failures, outputs, sink.ended_at if sink else {}, error_paths)
        kills, where = oom.kills_between(self._oom_at_start, oom.read_counts())
        if kills:
            facts = report.with_oom_kills(facts, kills, where)
        return report.classify(report.with_not_retried(facts, self._no_retry))

    @staticmethod
    def _write_reply_file(verdict: report.Verdict, first: FirstFailure | None = None) -> None:
        """The job's root cause into the agent's own error file, if its scheduler gave it
        one: every node writes the same rank and message."""
        path = os.environ.get(ERROR_FILE_ENV)
        data = report.reply_file_data(verdict, time.time(), first)
        # an empty file may be there already: Kubernetes creates the termination-message file
        if not path or data is None or (os.path.exists(path) and os.path.getsize(path) > 0):
            return
        try:
            if os.path.exists(path):
                # written in place: a file mounted there (Kubernetes) cannot be replaced
                with open(path, "w") as file:
                    json.dump(data, file)
            else:
                report.write_summary(path, data)
        except OSError as err:
            log.warning("cannot write the error file %s: %s", path, err)


def _own_first_failure(verdict: report.Verdict) -> FirstFailure | None:
    root = verdict.root
    if root is None:
        return None
    where = innermost_frame(root.traceback)
    return FirstFailure(root.rank, root.node, root.how, root.message, where)


class _EndingSink:
    """A sink that also says when the attempt's workers are gone (it is closed then)."""

    def __init__(self, sink: OutputSink, on_close: Callable[[], None]) -> None:
        self._sink = sink
        self._on_close = on_close
        self.terminal = sink.terminal

    def feed(self, local_rank: int, stream: Stream, data: bytes) -> None:
        self._sink.feed(local_rank, stream, data)

    def tick(self) -> None:
        self._sink.tick()

    def end(self, local_rank: int, stream: Stream) -> None:
        self._sink.end(local_rank, stream)

    def close(self) -> None:
        self._sink.close()
        self._on_close()
