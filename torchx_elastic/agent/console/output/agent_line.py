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


def label_log_records(name: str = "") -> None:
    """Every handler of the logger ``name`` (the root's: "") and of the loggers below it
    writes :class:`LabelledLines`. torch gives its ``torch`` logger and several below it
    (``torch.distributed``, ...) handlers of their own, which do not propagate."""
    loggers = [logging.getLogger(name)]
    if name:
        loggers += [
            logger
            for key, logger in logging.Logger.manager.loggerDict.items()
            if key.startswith(name + ".") and isinstance(logger, logging.Logger)
        ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setFormatter(LabelledLines())
