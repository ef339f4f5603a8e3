"""The failures of one attempt, job-wide: which rank failed first, which were only victims.

The agent's own report policy (``agent/console/failure/report.py``: :func:`collect` reads each
failed rank's error file and stderr, :func:`classify` names the root cause and the victims)
applied to the failed ranks of every node of an attempt, from the files the agents left in
their log directory (``attempt_<k>/rank_<r>/``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchx_elastic.contract.log_layout import NodeLogs
from torchx_elastic.timeline.model import ClassifyFailures, RankFailureView

TRACEBACK_HEAD_LINES = 12


def classifier(log_dir: str) -> ClassifyFailures:
    """``classify(attempt, failed)`` for the build of a timeline of ``log_dir``."""

    def classify(attempt: int, failed: Sequence[Mapping[str, Any]]) -> list[RankFailureView]:
        return classify_attempt(log_dir, attempt, failed)

    return classify


def classify_attempt(
    log_dir: str, attempt: int, failed: Sequence[Mapping[str, Any]]
) -> list[RankFailureView]:
    """``failed``: one dict per failed rank (rank, node, local_rank, pid, exitcode, time_s)."""
    # torch is imported only when a job failed (the report takes torch's ProcessFailure)
    from torchx_elastic.agent.console.failure import report
    from torchx_elastic.agent.console.output.sinks import RankOutput
    from torchx_elastic.agent.workers.processes import process_failure

    logs = NodeLogs(log_dir)
    facts: list[report.RankFailure] = []
    for entry in failed:
        error_path = logs.rank_error_file(attempt, entry["rank"])
        output = RankOutput(
            local_rank=entry["local_rank"],
            global_rank=entry["rank"],
            node_rank=entry["node"],
            stdout_path=logs.rank_stdout(attempt, entry["rank"]),
            stderr_path=logs.rank_stderr(attempt, entry["rank"]),
        )
        # as the agent reads it: an empty or partial error file is reported, not raised
        failure = process_failure(entry["local_rank"], entry["pid"], entry["exitcode"], error_path)
        facts += report.collect(
            {entry["rank"]: failure},
            [output],
            {entry["local_rank"]: entry["time_s"]},
            {entry["local_rank"]: error_path},
        )
    verdict = report.classify(facts)
    victims = {v.failure.rank: v.reason for v in verdict.victims}
    views = []
    for fact in sorted(facts, key=report.RankFailure.sort_key):
        if verdict.root is not None and fact.rank == verdict.root.rank:
            role, reason = "root", fact.message
        elif fact.rank in victims:
            role, reason = "victim", victims[fact.rank]
        else:
            role, reason = "other", fact.message
        text = fact.traceback or "\n".join(fact.stderr_tail)
        views.append(
            RankFailureView(
                attempt=attempt,
                rank=fact.rank,
                node=fact.node,
                local_rank=fact.local_rank,
                time_s=fact.exit_time_s if fact.exit_time_s is not None else 0.0,
                how=fact.how,
                role=role,
                reason=reason,
                traceback_head=traceback_head(text),
            )
        )
    return views


def traceback_head(text: str, lines: int = TRACEBACK_HEAD_LINES) -> str:
    """The first ``lines`` lines, and the last one (the exception) when there are more."""
    all_lines = text.rstrip("\n").splitlines()
    if len(all_lines) <= lines + 1:
        return "\n".join(all_lines)
    return "\n".join([*all_lines[:lines], "  ...", all_lines[-1]])
