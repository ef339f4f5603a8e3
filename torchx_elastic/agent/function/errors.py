"""The one exception a failed function launch raises in the caller.

A subclass of torch's ``ChildFailedError`` (what torch's ``elastic_launch`` raises), so code
written against torch's launcher (``except ChildFailedError``, ``@record``, ``.failures``)
keeps working; its message is the root cause only: the rank that failed first, the
exception raised there with its traceback, and where the logs are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

_TAIL_LINES = 10


class FunctionFailedError(ChildFailedError):
    """The launch failed: ``rank`` failed first, with ``exception`` (``Type: message``).

    ``failures`` (torch's) maps every failed global rank to its ``ProcessFailure``;
    ``traceback`` is the failed rank's traceback ("" when it died without one, e.g. by a
    signal); ``log_dir`` holds every rank's output.
    """

    def __init__(
        self,
        name: str,
        failures: dict[int, ProcessFailure],
        root_cause: Mapping[str, Any],
        log_dir: str,
    ) -> None:
        self.rank = int(root_cause["rank"])
        self.node = int(root_cause.get("node", 0))
        self.exception = str(root_cause.get("message") or root_cause.get("how") or "")
        self.traceback = str(root_cause.get("traceback") or "")
        self.log_dir = log_dir
        self._root_cause = dict(root_cause)
        super().__init__(name, failures)

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (a pipeline step may hand the error to another process)."""
        return (type(self), (self.name, self.failures, self._root_cause, self.log_dir))

    def get_first_failure(self) -> tuple[int, ProcessFailure]:
        """The root cause by our report (not only the earliest timestamp)."""
        if self.rank in self.failures:
            return self.rank, self.failures[self.rank]
        return super().get_first_failure()

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        root = self._root_cause
        how = str(root.get("how", ""))
        where = (
            f"rank {self.rank} (node {self.node}, local rank {root.get('local_rank')},"
            f" pid {root.get('pid')})"
        )
        lines = [f"{self.name} failed on {where}: {self.exception or how}"]
        if self.traceback:
            lines.append(self.traceback.rstrip("\n"))
        else:
            tail = [str(line) for line in root.get("stderr_tail") or []][-_TAIL_LINES:]
            if tail:
                lines.append(f"last lines of rank {self.rank}'s stderr ({how}):")
                lines += ["  " + line for line in tail]
        others = sorted(rank for rank in self.failures if rank != self.rank)
        if others:
            lines.append(
                "also failed (see the root-cause report above): ranks "
                + ", ".join(map(str, others))
            )
        lines.append(f"logs of every rank: {self.log_dir}")
        return "\n".join(lines)
