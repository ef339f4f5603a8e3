"""The agent's own lines to the user, apart from the workers' (a stop, a restart, a node
dropped from the job or lost, the rendezvous moved): each one whole line on stderr, flushed
at once (the agent may leave with ``os._exit`` next, or a worker may be about to print).

Standard library only: the stop-signal handlers use it before the agent imports torch.
"""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """Print ``line`` (it names the agent itself: ``torchx-elastic: ...``) on stderr."""
    print(line, file=sys.stderr, flush=True)
