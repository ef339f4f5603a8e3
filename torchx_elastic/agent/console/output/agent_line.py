"""The agent's own lines to the user, apart from the workers' (a stop, a restart, a node
dropped from the job or lost, the rendezvous moved): each one whole line on stderr, flushed
at once (the agent may leave with ``os._exit`` next, or a worker may be about to print).

Standard library only: the stop-signal handlers use it before the agent imports torch.
"""

from __future__ import annotations

import logging
import sys


def say(line: str) -> None:
    """Print ``line`` (it names the agent itself: ``torchx-elastic: ...``) on stderr."""
    print(line, file=sys.stderr, flush=True)


class LabelledLines(logging.Formatter):
    """The agent's log records, and torch's in the agent's process: every line of a record
    under the agent's label (``[torchx-elastic WARNING] ...``), blank lines left out (torch's
    ``OMP_NUM_THREADS`` banner begins with one), no timestamps, pids or source paths."""

    def format(self, record: logging.LogRecord) -> str:
        label = f"[torchx-elastic {record.levelname}] "
        lines = super().format(record).splitlines()
        return "\n".join(label + line for line in lines if line.strip())


def label_log_records(logger: logging.Logger) -> None:
    """Every handler of ``logger`` writes :class:`LabelledLines` (torch's own logger has a
    handler of its own, which does not propagate to the root's)."""
    for handler in logger.handlers:
        handler.setFormatter(LabelledLines())
