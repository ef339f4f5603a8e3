"""The timeline benchmark's process: one job's agents' log directory to a page, timed in here.

``--kind ours``: what ``torchx-elastic timeline`` does with a log directory: the timeline
(``timeline_of_dir``: the events, the failed ranks' error files and output; torch is imported
on the way, as the command does, since the job failed), its HTML page and its trace, both
written to ``--out-dir``. ``--kind ours_warm``: the same twice in this process, the second
pass timed (the imports done). ``--kind floor``: reading the same files and parsing the
events' JSON lines, without building anything. Writes ``{"seconds": ..., ...}`` (sizes
as facts) as JSON to ``--result-file``; the interpreter's start and the top imports are not
timed.
"""

import argparse
import json
import os
import time
from pathlib import Path

from torchx_elastic.contract.events import read_events
from torchx_elastic.contract.log_layout import NodeLogs
from torchx_elastic.timeline import html, trace
from torchx_elastic.timeline.log_dir import timeline_of_dir

KINDS = ("ours", "ours_warm", "floor")


def build_page_and_trace(log_dir: str, out_dir: Path) -> dict[str, int]:
    timeline = timeline_of_dir(log_dir)
    page = html.render(timeline)
    trace_text = json.dumps(trace.trace_events(timeline))
    (out_dir / "timeline.html").write_text(page, encoding="utf-8")
    (out_dir / "trace.json").write_text(trace_text, encoding="utf-8")
    return {
        "ranks": timeline.ranks,
        "nodes": len(timeline.nodes),
        "page_bytes": len(page.encode()),
        "trace_bytes": len(trace_text.encode()),
    }


def read_only(log_dir: str) -> dict[str, int]:
    """The floor: every file of the directory read, the events' lines parsed."""
    read_bytes = 0
    for folder, _, names in os.walk(log_dir):
        for name in names:
            read_bytes += len(Path(folder, name).read_bytes())
    return {"records": len(read_events(NodeLogs(log_dir).events)), "read_bytes": read_bytes}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--result-file", required=True)
    args = parser.parse_args()
    if args.kind == "ours_warm":
        build_page_and_trace(args.log_dir, args.out_dir)
    started = time.perf_counter()
    if args.kind == "floor":
        facts = read_only(args.log_dir)
    else:
        facts = build_page_and_trace(args.log_dir, args.out_dir)
    seconds = time.perf_counter() - started
    with open(args.result_file, "w") as file:
        json.dump({"seconds": seconds, **facts}, file)


if __name__ == "__main__":
    main()
