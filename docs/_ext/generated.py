"""The reference tables of the documentation site, generated from the code at build time.

Each directive below renders a Markdown table (parsed as the page's MyST) from what the
package itself declares, so the pages cannot drift from the code:

- ``agent-flags``: the agent's flag tables (``torchx_elastic.agent.config.cli``:
  ``TORCHRUN_FLAGS`` and ``OWN_FLAGS``), each flag beside the installed torchrun's default;
- ``environment-variables``: the ``*_ENV`` names of ``torchx_elastic.contract`` with the
  comments written beside them;
- ``job-files`` and ``job-events``: the names of ``contract/log_layout.py`` and the event
  kinds of ``contract/events.py``, with their comments; ``summary-fields``: the keys of the
  summary a node writes (``agent/console/failure/report.py``);
- ``bench-figures``: one table per benchmark from the bench's JSON documents in
  ``bench/figures/`` (``python bench/run.py`` writes one; the newest holding a benchmark wins).

Nothing here changes the package; it reads it (the agent's tables by import, the contract's
comments from its source).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import io
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "torchx_elastic" / "contract"
FIGURES = REPO / "bench" / "figures"


# --- Markdown helpers -------------------------------------------------------------------


def cell(text: object) -> str:
    """``text`` as one Markdown table cell (pipes escaped, one line)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def prose(text: object) -> str:
    """A comment of the code as Markdown text: what would read as markup (``<k>``, ``*``)
    escaped; inline code in it (`...`) left as it is."""
    parts = re.split(r"(`[^`]*`)", str(text))
    return "".join(
        part if part.startswith("`") else re.sub(r"([<>*_\[\]])", r"\\\1", part) for part in parts
    )


def code(text: object) -> str:
    """``text`` as inline code (a backtick inside gets a longer fence)."""
    value = str(text)
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def rst_to_markdown(text: str) -> str:
    """A docstring's inline markup as Markdown: ``x`` and :role:`x` become `x`."""
    text = re.sub(r":[\w:]+:`~?\.?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


# --- constants with their comments, from source --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Constant:
    name: str
    value: object
    comment: str
    module: str


def constants(path: Path, keep: Callable[[str, object], bool]) -> list[Constant]:
    """Module-level ``NAME = value`` of ``path`` that ``keep``, each with the comment beside it
    (on its line), else the comment lines right above it (section rules ``# ---`` left out)."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        if not keep(target.id, literal):
            continue
        end = lines[(node.end_lineno or node.lineno) - 1]
        comment = end.split("  # ", 1)[1].strip() if "  # " in end else ""
        if not comment:
            above: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].startswith("#") and not lines[row].startswith("# ---"):
                above.insert(0, lines[row].lstrip("# ").rstrip())
                row -= 1
            comment = " ".join(above)
        found.append(Constant(target.id, literal, comment, path.stem))
    return found


def module_docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


# --- the directives ------------------------------------------------------------------------


class Generated(SphinxDirective):
    """A directive whose body is Markdown made by :meth:`markdown`, parsed in place."""

    has_content = False
    optional_arguments = 0

    def markdown(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        lines = self.markdown()
        container = nodes.container()
        source = f"<generated by {type(self).__name__}>"
        self.state.nested_parse(StringList(lines, source=source), self.content_offset, container)
        return list(container.children)


class AgentFlags(Generated):
    """``python -m torchx_elastic.agent``'s flags, torchrun's then ours, from the parser's
    tables, each with its ``PET_*`` variable and torchrun's default where torchrun has it."""

    def markdown(self) -> list[str]:
        from torchx_elastic.agent import compat
        from torchx_elastic.agent.config import cli

        torchrun = compat.torchrun_defaults()
        torch_version = importlib.metadata.version("torch").split("+")[0]
        out: list[str] = []
        for title, rows in cli.GROUPS:
            ours = title == cli.OWN_GROUP
            out += [f"**{title}**", ""]
            header = ["flag", "what", "default here"] + ([] if ours else ["torchrun's default"])
            body = []
            for row in rows:
                dest = row.name.replace("-", "_")
                spellings = [f"--{row.name}"] + ([f"--{dest}"] if "-" in row.name else [])
                short = getattr(row, "short", None)
                flag = ", ".join(code(s) for s in ([short] if short else []) + spellings)
                if isinstance(row, cli.Flag):
                    default = row.default
                    if not ours and not row.own_default:
                        default = torchrun.get(dest, default)
                    here = code(default) if default not in (None, "", []) else "(none)"
                    env = code(cli.env_name(dest))
                elif isinstance(row, cli.Switch):
                    here, env = "off", code(cli.env_name(dest) + "=1")
                else:  # an action: no default, no variable
                    here, env = "(acts when given)", ""
                if row.choices if isinstance(row, (cli.Flag, cli.ActionFlag)) else False:
                    choices = ", ".join(code(c) for c in row.choices or ())
                    help_text = f"{row.help} (one of {choices})"
                else:
                    help_text = row.help
                what = prose(help_text) + (f"; also {env}" if env else "")
                theirs = []
                if not ours:
                    value = torchrun.get(dest)
                    if dest not in torchrun:
                        theirs = [f"(not in torch {torch_version})"]
                    elif value is False:
                        theirs = ["off"]
                    else:
                        theirs = [code(value) if value not in (None, "", []) else "(none)"]
                body.append([flag, what, here, *theirs])
            out += table(header, body)
        return out


def _environment() -> list[Constant]:
    files = [CONTRACT / "__init__.py"] + sorted(
        p for p in CONTRACT.glob("*.py") if p.name != "__init__.py"
    )
    found = []
    for path in files:
        found += constants(
            path, lambda name, value: name.endswith("_ENV") and isinstance(value, str)
        )
    return found


class EnvironmentVariables(Generated):
    """The variables of the contract: torchx-elastic's, then torch's that the agent sets or
    reads (``torchx_elastic/contract``), each with the comment written beside it."""

    def markdown(self) -> list[str]:
        found = _environment()
        own = [c for c in found if str(c.value).startswith("TORCHX")]
        torch = [c for c in found if not str(c.value).startswith("TORCHX")]
        out = ["**torchx-elastic's**", ""]
        out += table(
            ["variable", "what", "declared in"],
            [
                [code(c.value), prose(c.comment or "-"), code(f"contract/{c.module}.py")]
                for c in own
            ],
        )
        out += ["**torch's (torchrun's), set or read by the agent**", ""]
        out += table(
            ["variable", "what", "declared in"],
            [
                [code(c.value), prose(c.comment or "-"), code(f"contract/{c.module}.py")]
                for c in torch
            ],
        )
        return out


class JobFiles(Generated):
    """The files and folders of a log directory (``contract/log_layout.py``)."""

    def markdown(self) -> list[str]:
        path = CONTRACT / "log_layout.py"
        found = constants(path, lambda name, value: isinstance(value, str) and name.isupper())
        return [
            rst_to_markdown(module_docstring(path)),
            "",
            *table(
                ["name", "constant", "what"],
                [
                    [code(c.value), code(c.name), prose(rst_to_markdown(c.comment) or "-")]
                    for c in found
                ],
            ),
        ]


class JobEvents(Generated):
    """The event kinds of ``events.jsonl`` and the reasons of a restart (``contract/events.py``)."""

    def markdown(self) -> list[str]:
        path = CONTRACT / "events.py"
        found = constants(path, lambda name, value: isinstance(value, str))
        kinds = [c for c in found if not c.name.startswith("RESTART_")]
        reasons = [c for c in found if c.name.startswith("RESTART_")]
        return [
            rst_to_markdown(module_docstring(path)),
            "",
            *table(
                ["event", "fields and meaning"], [[code(c.value), prose(c.comment)] for c in kinds]
            ),
            "The reasons of a `restart` event:",
            "",
            *table(
                ["reason", "meaning"], [[code(c.value), prose(c.comment or "-")] for c in reasons]
            ),
        ]


class SummaryFields(Generated):
    """The keys of ``summary_node<N>.json`` and of each failure in it."""

    def markdown(self) -> list[str]:
        from torchx_elastic.agent.console.failure import report

        top = report.summary(None, "SUCCEEDED", 0, 0, "<log dir>", 0)
        failure_fields = [f.name for f in dataclasses.fields(report.RankFailure)]
        return [
            "Keys of the summary: " + ", ".join(code(k) for k in top) + ".",
            "",
            "`root_cause`, each of `other_causes` and each of `victims` (which adds `reason`)"
            " holds one failed rank: " + ", ".join(code(k) for k in [*failure_fields, "how"]) + ".",
            "",
        ]


# --- pictures ----------------------------------------------------------------------------

# what `torchx run -s local_cwd dist.ddp -j 2x2 --script examples/progress.py` shows on a
# terminal mid-run (the pty test tests/e2e/test_job_progress.py drives the same job): the
# nodes' lines scroll above the bar
JOB_BAR_LINES = (
    "progress/0 [n0 r0] step 100/200",
    "progress/1 [n1 r2] step 100/200",
    "progress/0 [n0 r1] step 100/200",
    "progress/1 [n1 r3] step 100/200",
    "progress/0 [n0 r0] step 150/200",
    "progress/0 [n0 r1] step 150/200",
    "progress/1 [n1 r2] step 150/200",
)


class JobBar(Generated):
    """The live job bar as local_cwd draws it on a terminal, drawn by the same code
    (``torchx_elastic.rich_job_bar.rich_bar``) and exported by rich as SVG, inline."""

    def run(self) -> list[nodes.Node]:
        from rich.console import Console
        from rich.text import Text

        from torchx_elastic.contract.job_progress import JobSummary
        from torchx_elastic.rich_job_bar import rich_bar

        summary = JobSummary(
            step=152, total=200, slowest_rank=3, slowest_node=1, fastest_rank=0,
            fastest_node=0, fastest_step=158, rate_per_s=19.5, eta_s=2.5,
            ranks_reporting=4, ranks=4, nodes_reporting=2, nodes=2,
        )  # fmt: skip
        console = Console(
            file=io.StringIO(), record=True, width=100, force_terminal=True,
            color_system="truecolor",
        )  # fmt: skip
        for line in JOB_BAR_LINES:
            console.print(Text(line))
        console.print(rich_bar(summary))
        svg = console.export_svg(title="torchx run dist.ddp -j 2x2 --script examples/progress.py")
        return [nodes.raw("", f'<div class="job-bar">{svg}</div>', format="html")]


# --- benchmarks ----------------------------------------------------------------------------


def bench_documents() -> list[dict[str, Any]]:
    """The bench's JSON documents in ``bench/figures``, newest first."""
    documents = [json.loads(p.read_text()) for p in sorted(FIGURES.glob("*.json"))]
    return sorted(documents, key=lambda d: d.get("started_unix_s", 0), reverse=True)


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if unit == "MiB" else f"{value:.2f}"


def _order(name: str, result: dict[str, Any]) -> tuple[int, str]:
    number = result["title"].split(".", 1)[0]
    return (int(number) if number.isdigit() else 99, name)


class BenchFigures(Generated):
    """One table per benchmark: its variants' medians, its ratios with their goals, the command
    of the run that measured it and that run's notes."""

    def markdown(self) -> list[str]:
        latest: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        for document in bench_documents():
            for name, result in document["benchmarks"].items():
                latest.setdefault(name, (result, document))
        out: list[str] = []
        for name, (result, document) in sorted(
            latest.items(), key=lambda item: _order(item[0], item[1][0])
        ):
            unit = result["unit"]
            machine = document.get("machine", {})
            out += [f"**{result['title']}** ({code(name)})", ""]
            out += table(
                ["variant", "what runs", f"median ({unit})", "min - max", "ok runs"],
                [
                    [
                        code(key),
                        v["label"],
                        _number(v["median"], unit),
                        "-"
                        if v["min"] is None
                        else f"{_number(v['min'], unit)} - {_number(v['max'], unit)}",
                        f"{v['n'] - v['failed']}/{v['n']}",
                    ]
                    for key, v in result["variants"].items()
                ],
            )
            if result["ratios"]:
                out += table(
                    ["ratio of medians", "value", "goal", "status"],
                    [
                        [
                            code(r["name"]),
                            "-" if r["value"] is None else f"{r['value']:.2f}x",
                            r["goal"] or "",
                            r["status"] or "",
                        ]
                        for r in result["ratios"]
                    ],
                )
            facts = ", ".join(
                f"{key} {machine[key]}" for key in ("cpus", "torch", "python") if key in machine
            )
            out += [f"Command: {code(document['command'])} ({facts})." if facts else "", ""]
            notes = [*result.get("notes", [])]
            out += [f"- {rst_to_markdown(n)}" for n in notes] + ([""] if notes else [])
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("agent-flags", AgentFlags)
    app.add_directive("environment-variables", EnvironmentVariables)
    app.add_directive("job-files", JobFiles)
    app.add_directive("job-events", JobEvents)
    app.add_directive("summary-fields", SummaryFields)
    app.add_directive("bench-figures", BenchFigures)
    app.add_directive("job-bar", JobBar)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
