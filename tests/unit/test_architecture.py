"""Who may import whom (docs/architecture.md): every import of the package, function-level
ones included, read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchx_elastic

PACKAGE = Path(torchx_elastic.__file__).parent

# part of the package -> module prefixes it must never import
FORBIDDEN = {
    "agent": ("torchx", "docker", "kubernetes", "torchx_elastic.schedulers",
              "torchx_elastic.components", "torchx_elastic.timeline"),
    "schedulers": ("torchx_elastic.agent",),
    "components": ("torchx_elastic.agent", "torchx_elastic.schedulers", "torch"),
}  # fmt: skip


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import in ``path``; ``from x import y`` names ``x.y`` too (a
    submodule or a name of ``x``: either way ``x`` is imported)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_a_part_imports_only_what_it_may(part: str) -> None:
    wrong = sorted(
        f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        for path in (PACKAGE / part).rglob("*.py")
        for line, module in imported_modules(path)
        if any(_matches(module, prefix) for prefix in FORBIDDEN[part])
    )
    assert wrong == []


def test_the_check_sees_each_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import torchx_elastic.agent.compat\n"
        "def f():\n"
        "    from torchx_elastic.agent import compat\n"
        "    from torchx_elastic import agent\n"
    )
    modules = [module for _, module in imported_modules(source)]
    hits = [m for m in modules if _matches(m, "torchx_elastic.agent")]
    assert hits == [
        "torchx_elastic.agent.compat", "torchx_elastic.agent", "torchx_elastic.agent.compat",
        "torchx_elastic.agent",
    ]  # fmt: skip
