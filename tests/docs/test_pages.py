"""The pages a user reads: every shell command they show runs in CI or names what runs it, and
the README's links lead somewhere.

The pages are README.md and docs/**/*.md (the site `make docs` builds, where Sphinx checks the
links between pages itself). A *command block* is a fenced block marked ``console``, ``sh``,
``bash`` or ``shell``, or any other code block (fenced without a language, or indented) one of
whose lines starts with a command (``torchx ...``, ``python ...``, ``make ...``). The line
right above each says who runs it, in an HTML comment (invisible on GitHub and on the site):

- ``<!-- ci: run -->``: this file runs every command of the block (a console block's ``$``
  lines), in a directory of its own per page that holds the repository's ``examples/`` and
  ``examples/main.py`` as ``main.py``, with the repository's venv first on ``PATH``; each must
  exit 0 without a traceback;
- ``<!-- ci: BACKEND: PATH -->``: the commands need BACKEND (a cluster or engine that CI
  starts, or a long benchmark), and PATH, a test or script of the repository, runs them there
  (``make TARGET`` names a target of the Makefile).

Output is shown in ``text`` blocks, which hold no command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
PAGES = [p for p in PAGES if "_build" not in p.parts]
SHELLS = {"console", "sh", "bash", "shell"}
COMMAND = re.compile(
    r"^\s*(\$ )?(torchx|torchx-elastic|torchx-elastic-agent|python3?|pip|make|kubectl|docker"
    r"|bash|sbatch|srun|pytest|ci/\S+|docker/\S+|\.venv/bin/\S+|\. \S+)( |$)"
)
MARKER = re.compile(r"^<!-- ci: (?:(run)|([\w ,./-]+): (\S.*?)) -->$")
README_MAX_LINES = 150


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence or first indented line, 1-based
    language: str
    body: list[str]
    marker: str  # the line above, stripped

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def is_command_block(self) -> bool:
        if self.language in SHELLS:
            return True
        return self.language in ("", "indented") and any(COMMAND.match(ln) for ln in self.body)

    def commands(self) -> list[str]:
        """The block's commands: continued lines joined, comments and a console's output
        left out."""
        text = re.sub(r"\\\n\s*", "", "\n".join(self.body))
        found = []
        for line in text.splitlines():
            if self.language == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                found.append(line)
        return found


def blocks(page: Path) -> list[Block]:
    """Every code block of ``page``: fenced (with its language) and indented (outside lists)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(```+|~~~+)\s*(\{?[\w-]*\}?)", line)
        above = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        if fence:
            end = i + 1
            while end < len(lines) and not lines[end].startswith(fence.group(1)):
                end += 1
            found.append(Block(page, i + 1, fence.group(2), lines[i + 1 : end], above))
            i = end + 1
            continue
        previous = lines[i - 1] if i else ""
        if line.startswith("    ") and not previous.strip() and not _in_list(lines, i):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            body = [ln[4:] for ln in lines[i:end]]
            found.append(Block(page, i + 1, "indented", body, above))
            i = end
            continue
        i += 1
    return found


def _in_list(lines: list[str], i: int) -> bool:
    """Whether the indented line ``i`` continues a list item (the nearest unindented line above
    it starts one)."""
    for k in range(i - 1, -1, -1):
        if lines[k].strip() and not lines[k].startswith(" "):
            return bool(re.match(r"^([-*+]|\d+\.) ", lines[k]))
    return False


def command_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.is_command_block()]


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def test_the_pages_are_found() -> None:
    names = {_page_id(p) for p in PAGES}
    assert {"README.md", "docs/tutorial.md", "docs/spares.md", "docs/index.md"} <= names
    assert len(command_blocks()) > 20


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_block_says_who_runs_it(page: Path) -> None:
    makefile = (REPO / "Makefile").read_text()
    unmarked, wrong = [], []
    for block in (b for b in blocks(page) if b.is_command_block()):
        marker = MARKER.match(block.marker)
        if marker is None:
            unmarked.append(f"{block.where}: {block.body[:1]}")
            continue
        if marker.group(1) == "run":
            if block.language not in SHELLS:
                wrong.append(f"{block.where}: a block CI runs is fenced as console, sh or bash")
            continue
        runner = marker.group(3)
        if runner.startswith("make "):
            target = runner.split()[1]
            if not re.search(rf"^{re.escape(target)}:", makefile, re.M):
                wrong.append(f"{block.where}: no Makefile target {target!r}")
        elif not (REPO / runner).exists():
            wrong.append(f"{block.where}: {runner} does not exist")
    assert not unmarked, (
        "command blocks without a <!-- ci: run --> or <!-- ci: BACKEND: PATH --> line above"
        " them:\n" + "\n".join(unmarked)
    )
    assert not wrong, "\n".join(wrong)


RUN_PAGES = sorted({b.page for b in command_blocks() if b.marker == "<!-- ci: run -->"})
# a line of a rank's output: a script's own traceback (a crash the page shows on purpose)
RANK_LINE = re.compile(r"\[n\d+ r\d+\]")


def _scratch(tmp_path: Path) -> Path:
    """A directory as a reader has it: the examples, and examples/main.py as main.py."""
    work = tmp_path / "work"
    shutil.copytree(REPO / "examples", work / "examples")
    shutil.copy(REPO / "examples" / "main.py", work / "main.py")
    (tmp_path / "home").mkdir()
    return work


@pytest.mark.slow
@pytest.mark.cli_jobs
@pytest.mark.timeout(900)  # a page's jobs one after the other, on a loaded machine
@pytest.mark.parametrize("page", RUN_PAGES, ids=_page_id)
def test_the_commands_ci_runs_run(page: Path, tmp_path: Path) -> None:
    work = _scratch(tmp_path)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path / "home"),  # no ~/.torchxconfig of the machine's
    }
    env.pop("PYTHONPATH", None)
    env.pop("TORCHXCONFIG", None)
    ran = []
    for block in blocks(page):
        if not (block.is_command_block() and block.marker == "<!-- ci: run -->"):
            continue
        for command in block.commands():
            print(f"{block.where}: {command}", flush=True)  # which one, should it hang
            result = subprocess.run(
                ["bash", "-c", command], cwd=work, env=env,
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            output = result.stdout + result.stderr
            assert result.returncode == 0, (block.where, command, output[-4000:])
            launcher = [ln for ln in output.splitlines() if not RANK_LINE.search(ln)]
            assert not [ln for ln in launcher if "Traceback" in ln], (block.where, command, output)
            ran.append(command)
    assert ran


# --- the README -----------------------------------------------------------------------------

README = REPO / "README.md"


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and MyST's heading anchors) give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_is_a_front_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated run in the README"
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w)]
    assert not [h for h in hashes if re.search(r"\d", h)], f"commit hashes: {hashes}"
    for command in ("make example", "make test", "make docs"):
        assert command in text
    assert "Why not plain torchx or torchrun" in text


def test_readme_links_lead_somewhere() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    broken = []
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = (REPO / path) if path else README
        if not target.exists():
            broken.append(link)
            continue
        if anchor and target.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            if anchor not in {github_anchor(h) for h in headings}:
                broken.append(link)
    assert not broken, f"README.md links that lead nowhere: {broken}"
