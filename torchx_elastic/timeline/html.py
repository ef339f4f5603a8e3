"""The timeline as one self-contained HTML page: data, script and styles inline, nothing
fetched (its Content-Security-Policy forbids any request), so it opens from ``file://``,
an e-mail attachment or a CI artifact alike."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from torchx_elastic.timeline.model import Mark, Timeline

_TEMPLATE = "page.html"


def _mark(mark: Mark, start_s: float) -> dict[str, Any]:
    return {
        "t": round(mark.time_s - start_s, 3),
        "kind": mark.kind,
        "label": mark.label,
        "detail": mark.detail,
        "lr": mark.local_rank,
    }


def page_data(timeline: Timeline) -> dict[str, Any]:
    """What the page's script draws, with times in seconds since the job's first record."""
    t0 = timeline.start_s

    def rel(time_s: float) -> float:
        return round(time_s - t0, 3)

    return {
        "title": timeline.title,
        "source": timeline.source,
        "state": timeline.state,
        "start": t0,
        "end": rel(timeline.end_s),
        "ranks": timeline.ranks,
        "notes": timeline.notes,
        "nodes": [
            {
                "n": lane.node,
                "host": lane.host,
                "lr_count": lane.local_ranks,
                "spans": [
                    [
                        s.attempt,
                        rel(s.start_s),
                        rel(s.end_s),
                        list(s.ranks),
                        s.end,
                        None if s.round_s is None else rel(s.round_s),
                    ]
                    for s in lane.spans
                ],
                "marks": [_mark(m, t0) for m in lane.marks],
            }
            for lane in timeline.nodes
        ],
        "job": [_mark(m, t0) for m in timeline.job_marks],
        "failures": [
            {
                "attempt": f.attempt,
                "t": rel(f.time_s),
                "rank": f.rank,
                "node": f.node,
                "local_rank": f.local_rank,
                "how": f.how,
                "role": f.role,
                "reason": f.reason,
                "traceback": f.traceback_head,
            }
            for f in timeline.failures
        ],
        "progress": [
            [
                rel(p.time_s),
                p.step,
                p.fastest_step,
                p.total,
                p.slowest,
                p.fastest,
                None if p.rate_per_s is None else round(p.rate_per_s, 3),
            ]
            for p in timeline.progress
        ],
    }


def _escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(timeline: Timeline) -> str:
    template = resources.files(__package__).joinpath(_TEMPLATE).read_text(encoding="utf-8")
    data = json.dumps(page_data(timeline), separators=(",", ":"), ensure_ascii=True)
    # inside <script>: no "</" may close it early
    data = data.replace("</", "<\\/").replace("<!--", "<\\!--")
    # the data first, then the title in <title>, which comes before it: each marker once
    page = template.replace("__DATA__", data, 1)
    return page.replace("__TITLE__", _escape_html(timeline.title), 1)
