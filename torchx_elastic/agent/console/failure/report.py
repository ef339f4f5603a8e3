"""When the job fails: which rank failed first and why, which ranks only died with it.

:func:`classify` is the whole policy (pure, unit-tested): a rank is a *victim* when it was
stopped by SIGTERM/SIGKILL (the agent stops every rank once one fails) or when its error
shows a lost peer (gloo "Connection closed by peer", "Connection reset by peer", NCCL
remote errors, broken pipes); the *root cause* is the first failure by time (error-file
timestamp, then exit time) among the others. :func:`render` writes the "Root cause" section,
:func:`summary` the same facts as JSON (``summary_node<N>.json`` in the log directory).
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from torchx_elastic.agent.console.failure.first_failure import FirstFailure
from torchx_elastic.agent.console.failure.oom import out_of_memory
from torchx_elastic.agent.console.output.sinks import RankOutput
from torchx_elastic.contract.error_file import ErrorFileContent, error_data, read_error_file
from torchx_elastic.contract.events import summary_path as summary_path
from torchx_elastic.contract.events import write_summary as write_summary
from torchx_elastic.contract.not_retried import NoRetryRule, is_not_retried, not_retried

STDERR_TAIL_LINES = 10
_TAIL_BYTES = 64 * 1024
_REASON_CHARS = 160
_NOT_AVAILABLE = "<N/A>"  # torch's ProcessFailure.error_file when it has none
_AGENT_STOP_SIGNALS = frozenset({-int(signal.SIGTERM), -int(signal.SIGKILL)})
PEER_LOST = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe"
    r"|ncclRemoteError|remote process exited|NCCL communicator was aborted",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RankFailure:
    """The facts about one failed rank."""

    rank: int
    local_rank: int
    node: int
    pid: int
    exitcode: int
    error_time_s: float | None = None
    exit_time_s: float | None = None
    message: str = ""
    traceback: str = ""
    stderr_tail: tuple[str, ...] = ()
    stdout_path: str = ""
    stderr_path: str = ""
    error_path: str = ""
    error_problem: str = ""  # why the error file could not be used ("empty", ...)

    @property
    def how(self) -> str:
        """``exit code 1`` or ``signal SIGTERM``."""
        if self.exitcode < 0:
            try:
                return f"signal {signal.Signals(-self.exitcode).name}"
            except ValueError:
                return f"signal {-self.exitcode}"
        return f"exit code {self.exitcode}"

    def sort_key(self) -> tuple[float, float, int]:
        # error-file timestamps have whole seconds: compare those first, then exit times
        first = self.error_time_s if self.error_time_s is not None else self.exit_time_s
        return (
            math.inf if first is None else math.floor(first),
            math.inf if self.exit_time_s is None else self.exit_time_s,
            self.rank,
        )


@dataclass(frozen=True)
class Victim:
    failure: RankFailure
    reason: str


@dataclass(frozen=True)
class Verdict:
    """``root`` failed first; ``root_is_victim``: even it only lost a peer (look elsewhere)."""

    root: RankFailure | None
    root_is_victim: bool = False
    causes: tuple[RankFailure, ...] = ()
    victims: tuple[Victim, ...] = field(default=())


def victim_reason(failure: RankFailure) -> str | None:
    """Why this rank looks like a victim of another rank's failure; None if it does not."""
    for text in (failure.message, failure.traceback, *reversed(failure.stderr_tail)):
        match = PEER_LOST.search(text)
        if match:
            line = next(ln for ln in text.splitlines() if PEER_LOST.search(ln)).strip()
            if len(line) > _REASON_CHARS:
                line = line[: _REASON_CHARS - 3] + "..."
            return f"lost a peer: {line}"
    if failure.exitcode in _AGENT_STOP_SIGNALS and not failure.traceback and not failure.message:
        return f"stopped by {failure.how[len('signal ') :]} after another rank failed"
    return None


def with_oom_kills(failures: Sequence[RankFailure], kills: int, where: str) -> list[RankFailure]:
    """``failures`` where the first ``kills`` ranks that died of SIGKILL with nothing to say
    (no traceback, no message) are said to be out of memory: the OOM killer killed ``kills``
    processes ``where`` during the attempt (oom.py). The agent's own SIGKILL comes only after
    its SIGTERM went unheeded, so the earliest are the kernel's."""
    silent = [
        f
        for f in failures
        if f.exitcode == -int(signal.SIGKILL) and not f.traceback and not f.message
    ]
    chosen = {f.rank for f in sorted(silent, key=RankFailure.sort_key)[:kills]}
    message = out_of_memory(kills, where)
    return [replace(f, message=message) if f.rank in chosen else f for f in failures]


def with_not_retried(failures: Sequence[RankFailure], rule: NoRetryRule) -> list[RankFailure]:
    """``failures`` where a rank that must not be retried (contract/not_retried.py) says so:
    its exit code, or the class its error file names when the bootstrap did not decide (the
    script wrote that file itself). A rank that only lost a peer is left as it is."""

    def decided(f: RankFailure) -> RankFailure:
        if f.exitcode <= 0 or is_not_retried(f.message) or victim_reason(f) is not None:
            return f
        if rule.exit_code_not_retried(f.exitcode) or rule.message_not_retried(
            f.message, f.traceback
        ):
            return replace(f, message=not_retried(f.message or f.how))
        return f

    return [decided(f) for f in failures]


def classify(failures: Sequence[RankFailure]) -> Verdict:
    """Root cause, other independent failures, and victims (each sorted by time)."""
    ordered = sorted(failures, key=RankFailure.sort_key)
    reasons = {f.rank: victim_reason(f) for f in ordered}
    if ordered and all(f.exitcode in _AGENT_STOP_SIGNALS and not f.traceback for f in ordered):
        # only signals (e.g. the OOM killer's SIGKILL, then the agent's SIGTERMs): the first
        # signalled rank did not die of another rank's failure
        reasons[ordered[0].rank] = None
    causes = [f for f in ordered if reasons[f.rank] is None]
    if causes:
        root, root_is_victim = causes[0], False
    elif ordered:
        root, root_is_victim = ordered[0], True
    else:
        return Verdict(root=None)
    victims = tuple(
        Victim(f, reasons[f.rank] or "")
        for f in ordered
        if reasons[f.rank] is not None and f is not root
    )
    return Verdict(root, root_is_victim, tuple(c for c in causes if c is not root), victims)


def read_tail(path: str, lines: int = STDERR_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines of a file (empty when it cannot be read)."""
    try:
        with open(path, "rb") as file:
            file.seek(max(0, os.path.getsize(path) - _TAIL_BYTES))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return ()
    return tuple(text.splitlines()[-lines:])


def _error_file(failure: ProcessFailure, given_path: str) -> tuple[str, ErrorFileContent | None]:
    """The rank's error file, read now (a file written after its process died counts)."""
    for path in (failure.error_file, given_path):
        content = read_error_file(path) if path and path != _NOT_AVAILABLE else None
        if content is not None:
            return path, content
    return given_path, None


def _without_traceback(tail: tuple[str, ...], traceback: str) -> tuple[str, ...]:
    """The stderr lines before the traceback (which is shown on its own)."""
    if not traceback:
        return tail
    for index in range(len(tail) - 1, -1, -1):
        if tail[index].startswith("Traceback (most recent call last)"):
            return tail[:index]
    return tail if tail and tail[-1].strip() not in traceback else ()


def collect(
    failures: Mapping[int, ProcessFailure],
    outputs: Sequence[RankOutput],
    ended_at: Mapping[int, float],
    error_paths: Mapping[int, str],
) -> list[RankFailure]:
    """The facts of each failed rank (``failures`` by global rank, the rest by local rank)."""
    by_local = {o.local_rank: o for o in outputs}
    facts = []
    for rank, failure in failures.items():
        output = by_local.get(failure.local_rank)
        error_path, content = _error_file(failure, error_paths.get(failure.local_rank, ""))
        content = content or ErrorFileContent()
        traceback = content.traceback
        tail = read_tail(output.stderr_path, STDERR_TAIL_LINES + 40) if output else ()
        facts.append(
            RankFailure(
                rank=rank,
                local_rank=failure.local_rank,
                node=output.node_rank if output else 0,
                pid=failure.pid,
                exitcode=failure.exitcode,
                error_time_s=content.timestamp_s,
                exit_time_s=ended_at.get(failure.local_rank, float(failure.timestamp)),
                message=content.message,
                traceback=traceback,
                stderr_tail=_without_traceback(tail, traceback)[-STDERR_TAIL_LINES:],
                stdout_path=output.stdout_path if output else "",
                stderr_path=output.stderr_path if output else "",
                error_path=error_path,
                error_problem=content.problem,
            )
        )
    return facts


def _indent(text: str, spaces: int) -> list[str]:
    return [" " * spaces + line for line in text.rstrip("\n").splitlines()]


def render(verdict: Verdict, log_dir: str, summary_path: str | None = None) -> str:
    """The "Root cause" section printed when the job fails."""
    root = verdict.root
    lines = ["", "=" * 72, "Root cause", "=" * 72]
    if root is None:
        lines.append("  the job failed, but no worker did (see the agent's messages above)")
    else:
        first = (
            "failed first" if not verdict.root_is_victim else "failed first, but only lost a peer"
        )
        lines.append(
            f"  rank {root.rank} (node {root.node}, local rank {root.local_rank}, pid {root.pid})"
            f" {first}: {root.how}"
        )
        if verdict.root_is_victim:
            lines.append(
                "  no rank on this node failed on its own: look for the root cause in the"
                " other nodes' reports"
            )
        if root.traceback:
            lines.append("  traceback:")
            lines += _indent(root.traceback, 4)
        elif root.message:
            lines.append(f"  error: {root.message}")
        if root.stderr_tail:
            lines.append(
                f"  last lines of stderr{' before the traceback' if root.traceback else ''}:"
            )
            lines += ["    " + line for line in root.stderr_tail]
        lines.append(f"  stdout: {root.stdout_path}")
        lines.append(f"  stderr: {root.stderr_path}")
        if root.error_problem:
            lines.append(f"  error file unreadable ({root.error_problem}): {root.error_path}")
        elif root.error_path and os.path.exists(root.error_path):
            lines.append(f"  error file: {root.error_path}")
    return "\n".join(lines + _others(verdict.causes, verdict.victims, log_dir, summary_path))


def render_peer_failure(
    verdict: Verdict, first: FirstFailure, log_dir: str, summary_path: str | None = None
) -> str:
    """What a node prints when a rank of another node failed first: that rank, and this
    node's own failed ranks (victims, or later failures of their own); no root-cause
    section (the failing node prints it)."""
    lines = ["", "=" * 72, "Job failed", "=" * 72]
    lines.append(f"  {first.describe()}")
    if first.where:
        lines.append(f"  at {first.where}")
    lines.append(f"  its traceback and logs are in node {first.node}'s report")
    root = verdict.root
    if root is None:
        lines.append("  this node's ranks were still running: they were stopped")
    victims, causes = list(verdict.victims), list(verdict.causes)
    if root is not None and verdict.root_is_victim:
        victims.insert(0, Victim(root, victim_reason(root) or "lost a peer"))
    elif root is not None:
        causes.insert(0, root)
    return "\n".join(lines + _others(tuple(causes), tuple(victims), log_dir, summary_path))


def _others(
    causes: Sequence[RankFailure],
    victims: Sequence[Victim],
    log_dir: str,
    summary_path: str | None,
) -> list[str]:
    """The other failed ranks, the logs and the summary: the end of either report."""
    lines = []
    for cause in causes:
        lines.append(
            f"  also failed on its own: rank {cause.rank} ({cause.how}) {cause.message}".rstrip()
        )
    if victims:
        lines.append("Victims (failed only because a peer failed):")
        for victim in victims:
            f = victim.failure
            where = f"node {f.node}, local rank {f.local_rank}"
            unreadable = f"; error file unreadable ({f.error_problem})" if f.error_problem else ""
            lines.append(f"  rank {f.rank} ({where}): {f.how}, {victim.reason}{unreadable}")
    lines.append(f"Logs of every rank: {log_dir}")
    if summary_path:
        lines.append(f"Summary (JSON): {summary_path}")
    return [*lines, ""]


def summary(
    verdict: Verdict | None, state: str, node: int, attempt: int, log_dir: str, exit_code: int
) -> dict[str, Any]:
    """The JSON summary of the run on this node (same facts as :func:`render`)."""

    def facts(failure: RankFailure) -> dict[str, Any]:
        return {**asdict(failure), "stderr_tail": list(failure.stderr_tail), "how": failure.how}

    data: dict[str, Any] = {
        "state": state,
        "exit_code": exit_code,
        "node": node,
        "host": socket.gethostname(),
        "attempt": attempt,
        "log_dir": log_dir,
        "root_cause": None,
        "root_cause_is_victim": False,
        "other_causes": [],
        "victims": [],
    }
    if verdict is not None and verdict.root is not None:
        data["root_cause"] = facts(verdict.root)
        data["root_cause_is_victim"] = verdict.root_is_victim
        data["other_causes"] = [facts(c) for c in verdict.causes]
        data["victims"] = [{**facts(v.failure), "reason": v.reason} for v in verdict.victims]
    return data


def reply_file_data(
    verdict: Verdict, now_s: float, first: FirstFailure | None = None
) -> dict[str, Any] | None:
    """The root cause in torch's error-file format, for the scheduler's reply file.

    torchx reads the agent's ``TORCHELASTIC_ERROR_FILE`` for ``torchx status`` / ``describe``:
    with this it shows the failing rank's exception instead of no message at all.
    """
    root = verdict.root
    if root is None and first is None:
        return None
    timestamp = root.error_time_s if root and root.error_time_s is not None else now_s
    if first is not None and (root is None or (first.rank, first.node) != (root.rank, root.node)):
        # another node's rank failed first: every node's reply names that one
        return error_data(first.describe(), first.where, timestamp)
    assert root is not None
    what = root.message or root.how
    return error_data(
        f"rank {root.rank} (node {root.node}) failed first: {what}",
        root.traceback or "\n".join(root.stderr_tail),
        timestamp,
    )
