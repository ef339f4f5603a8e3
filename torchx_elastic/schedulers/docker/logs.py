"""Log lines of one replica's container: whole lines, followed or not, since/until, a stream."""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Iterator, Optional

from torchx.schedulers.api import Stream

from torchx_elastic.schedulers.log_lines import whole_lines

if TYPE_CHECKING:
    from docker.models.containers import Container


def container_log_lines(
    container: Container,
    regex: Optional[str] = None,
    since: Optional[datetime] = None,
    until: Optional[datetime] = None,
    follow: bool = False,
    streams: Optional[Stream] = None,
) -> Iterator[str]:
    """The container's log as whole lines; ``follow`` keeps reading until it stops."""
    if streams not in (None, Stream.COMBINED, Stream.STDOUT, Stream.STDERR):
        raise ValueError(f"unknown log stream {streams!r}: use stdout, stderr or combined")
    chunks = container.logs(
        stdout=streams != Stream.STDERR,
        stderr=streams != Stream.STDOUT,
        stream=True,
        follow=follow,
        since=since,
        until=until,
    )
    lines = whole_lines(chunks)
    if regex:
        pattern = re.compile(regex)
        return (line for line in lines if pattern.search(line))
    return lines
