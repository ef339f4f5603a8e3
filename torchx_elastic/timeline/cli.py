"""``torchx-elastic timeline <log dir | app handle> [--format html|trace] [-o FILE]``.

Writes the job's timeline (one self-contained HTML page, or Chrome Trace Event JSON for
Perfetto / ``chrome://tracing``) and prints its path. By default the file goes into the
agents' log directory (``timeline.html`` / ``timeline.trace.json``), or into the current
directory for a job whose files were copied from its containers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from torchx_elastic.contract.log_layout import LOCAL_LOG_ROOT
from torchx_elastic.contract.timeline_command import COMMAND, PROGRAM, SUBCOMMAND
from torchx_elastic.timeline import html, trace
from torchx_elastic.timeline.log_dir import SourceError
from torchx_elastic.timeline.model import Timeline
from torchx_elastic.timeline.source import load

log = logging.getLogger(__name__)

_FILE_NAMES = {"html": "timeline.html", "trace": "timeline.trace.json"}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROGRAM, description="torchx-elastic's tools")
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        SUBCOMMAND,
        help="draw a job's timeline (every node and rank) from the agents' files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        help="the agents' log directory (or one above it), or an app handle:"
        " local_cwd://<session>/<app_id>, docker://<session>/<app_id>,"
        " kubernetes://<session>/<namespace>:<app_id>",
    )
    p.add_argument(
        "--format",
        choices=sorted(_FILE_NAMES),
        default="html",
        help="html: one self-contained page (default); trace: Chrome Trace Event JSON",
    )
    p.add_argument("-o", "--output", help="the file to write (default: see above)")
    p.add_argument(
        "--log-dir",
        default=LOCAL_LOG_ROOT,
        help="local_cwd's log_dir, for local_cwd:// handles (default: %(default)s)",
    )
    return top


def default_output(timeline: Timeline, fmt: str) -> str:
    name = _FILE_NAMES[fmt]
    if os.path.isdir(timeline.source) and os.access(timeline.source, os.W_OK):
        return os.path.join(timeline.source, name)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in timeline.title)
    return f"{safe}.{name}"


def write(timeline: Timeline, fmt: str, output: str) -> str:
    text = html.render(timeline) if fmt == "html" else json.dumps(trace.trace_events(timeline))
    with open(output, "w", encoding="utf-8") as file:
        file.write(text)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="torchx-elastic: %(message)s")
    args = parser().parse_args(argv)
    try:
        timeline = load(args.target, local_log_dir=args.log_dir)
    except (SourceError, OSError, ValueError, RuntimeError) as err:  # the engines' errors too
        print(f"{COMMAND}: {err}", file=sys.stderr)
        return 1
    path = write(timeline, args.format, args.output or default_output(timeline, args.format))
    print(f"timeline of {timeline.title}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
