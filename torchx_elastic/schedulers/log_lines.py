"""Log streams as whole lines: chunks of a (followed) stream never glue or split lines."""

from __future__ import annotations

import codecs
from typing import Iterable, Iterator, Union


def whole_lines(chunks: Iterable[Union[bytes, str]]) -> Iterator[str]:
    """Each complete line of a stream, ending in ``\\n``, as soon as it is complete.

    Docker's and Kubernetes' log streams hand out chunks as they were read: a line (or a
    UTF-8 character) can be split over chunks and a chunk can hold several lines. A split
    line is held back until its end arrives; a last line without a newline gets one.
    Undecodable bytes are replaced.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        pending += chunk if isinstance(chunk, str) else decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line + "\n"
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending + "\n"
