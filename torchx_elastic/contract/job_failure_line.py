"""The line every node's agent prints last when the job failed, and how it is read back.

``torchx-elastic: job failed: rank 2 (node 1) failed first: ValueError: rank 2 gives up``:
the same on every node (the job's first failure, agreed over the rendezvous store), so
whatever replica's log ``torchx status`` reads (docker: the tail of the container that ended
first) names the same rank and message.

Standard library only (the contract): the agent writes it, the schedulers read it.
"""

from __future__ import annotations

PREFIX = "torchx-elastic: job failed: "


def line(first_failure: str) -> str:
    """The line for ``first_failure`` (``rank 2 (node 1) failed first: ...``)."""
    return PREFIX + first_failure


def find(log_text: str) -> str:
    """The first failure named by the last such line in ``log_text`` ('' when none); a
    prefix before it (``[<replica>] ``, a timestamp) is ignored."""
    for text in reversed(log_text.splitlines()):
        index = text.find(PREFIX)
        if index >= 0:
            return text[index + len(PREFIX) :].strip()
    return ""
