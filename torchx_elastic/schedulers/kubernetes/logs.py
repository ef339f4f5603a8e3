"""Pod logs as whole lines: chunks of a (followed) log stream never glue lines together."""

from __future__ import annotations

import codecs
import math
from datetime import datetime
from typing import Iterable, Iterator, Optional


def whole_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Each complete line of a byte stream, ending in ``\\n``, as soon as it is complete.

    A line split across chunks (or a UTF-8 character split across chunks) is held back
    until its end arrives; a last line without a newline gets one.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line + "\n"
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending + "\n"


def since_seconds(since: Optional[datetime], now: Optional[datetime] = None) -> Optional[int]:
    """The API's ``sinceSeconds`` (a whole number, at least 1) for a start time."""
    if since is None:
        return None
    now = now or datetime.now(since.tzinfo)
    return max(1, math.ceil((now - since).total_seconds()))
