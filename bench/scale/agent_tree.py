"""The agent of one commit, beside this harness: what ``--agent-commit`` runs.

The simulated nodes import ``torchx_elastic`` from a tree of their own: the package as
committed (``git archive``), with this harness's ``bench/scale`` copied beside it, so a
table can be made of the agent before a change while the working tree holds the change.
The tree is ``bench/results/agent-<commit>/`` (git-ignored), made once; its
``AGENT_COMMIT`` file names the commit. Another machine (without the repository's git)
runs it in place: ``cd bench/results/agent-<commit> && python -m bench.scale ...``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

COMMIT_FILE = "AGENT_COMMIT"


def agent_tree(repo: Path, commit: str) -> Path:
    """The tree of ``commit``'s agent and this harness (made if missing)."""
    full = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = repo / "bench" / "results" / f"agent-{full[:12]}"
    if not (tree / COMMIT_FILE).exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", full, "torchx_elastic"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        (tree / COMMIT_FILE).write_text(full + "\n")
    # this harness as it is now (made again on every run)
    shutil.rmtree(tree / "bench", ignore_errors=True)
    (tree / "bench" / "scale").mkdir(parents=True)
    shutil.copy(repo / "bench" / "__init__.py", tree / "bench" / "__init__.py")
    for source in (repo / "bench" / "scale").glob("*.py"):
        shutil.copy(source, tree / "bench" / "scale" / source.name)
    return tree


def agent_source(root: Path) -> dict[str, object]:
    """Where the simulated agents' ``torchx_elastic`` comes from: the commit, and whether
    the working tree's package differs from it."""
    recorded = root / COMMIT_FILE
    if recorded.exists():
        return {"tree": str(root), "commit": recorded.read_text().strip(), "modified": False}
    git = ["git", "-C", str(root)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            [*git, "status", "--porcelain", "--", "torchx_elastic"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"tree": str(root), "commit": None, "modified": None}
    return {"tree": str(root), "commit": commit, "modified": bool(status.strip())}
