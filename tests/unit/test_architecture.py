"""Who may import whom (docs/architecture.md): every import of the package, function-level
ones included, read from the source.

Three rules: the package's parts import only downward (``PACKAGE_ORDER``), so do the agent's
(``AGENT_ORDER``); no two modules import each other, however far round (no circle); and a
part never imports the outside code it must run without (``FORBIDDEN``)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import torchx_elastic

PACKAGE = Path(torchx_elastic.__file__).parent
ROOT = "torchx_elastic"

# bottom to top: a module imports its own part or a part below it, never one above
PACKAGE_ORDER = (
    "contract", "worker", "rich_job_bar", "agent", "launcher", "ft", "components", "schedulers",
    "timeline", "pipelines", "",  # "": the package's __init__
)  # fmt: skip
AGENT_ORDER = (
    "compat", "console", "config", "rendezvous", "workers", "supervision", "function", "doctor",
    "__main__", "",  # "": the agent's __init__
)  # fmt: skip

# part of the package -> outside module prefixes it must never import
FORBIDDEN = {
    "agent": ("torchx", "docker", "kubernetes"),
    "contract": ("torch", "torchx", "docker", "kubernetes", "yaml", "rich"),
    "worker": ("torch", "torchx"),
    "components": ("torch",),
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of this package."""
    relative = Path(*name.split(".")).relative_to(ROOT) if name != ROOT else Path()
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative).is_dir()


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import in ``path``; ``from x import y`` names ``x.y`` when
    that is a module of this package, else ``x``, and ``x`` for any other package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                own = sub.split(".")[0] == ROOT and is_module(sub)
                found.append((node.lineno, sub if own else node.module))
    return found


def package_modules() -> Iterator[tuple[Path, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, module_name(path)


def part_of(module: str, order: tuple[str, ...], prefix: str) -> str | None:
    """The part of ``order`` that ``module`` belongs to, below ``prefix`` (None: outside)."""
    if module != prefix and not module.startswith(prefix + "."):
        return None
    rest = module[len(prefix) + 1 :].split(".")[0] if module != prefix else ""
    assert rest in order, f"{module} is in no part of {prefix}: add it to the order"
    return rest


def upward_imports(order: tuple[str, ...], prefix: str) -> list[str]:
    wrong = []
    for path, module in package_modules():
        own = part_of(module, order, prefix)
        if own is None:
            continue
        for line, imported in imported_modules(path):
            other = part_of(imported, order, prefix)
            if other is not None and order.index(other) > order.index(own):
                wrong.append(f"{module}:{line} ({own or '__init__'}) imports {imported} ({other})")
    return wrong


def test_the_package_imports_only_downward() -> None:
    assert upward_imports(PACKAGE_ORDER, ROOT) == []


def test_the_agent_imports_only_downward() -> None:
    assert upward_imports(AGENT_ORDER, f"{ROOT}.agent") == []


def import_graph() -> dict[str, set[str]]:
    known = {module for _, module in package_modules()}
    graph: dict[str, set[str]] = {}
    for path, module in package_modules():
        graph[module] = {m for _, m in imported_modules(path) if m in known and m != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other() -> None:
    assert circles(import_graph()) == []


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_a_part_never_imports_what_it_must_run_without(part: str) -> None:
    wrong = sorted(
        f"{module}:{line} imports {imported}"
        for path, module in package_modules()
        if part_of(module, PACKAGE_ORDER, ROOT) == part
        for line, imported in imported_modules(path)
        if any(imported == p or imported.startswith(p + ".") for p in FORBIDDEN[part])
    )
    assert wrong == []


def test_the_check_sees_each_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import torchx_elastic.agent.compat\n"
        "def f():\n"
        "    from torchx_elastic.agent import compat\n"
        "    from torchx_elastic import agent\n"
        "    from torchx_elastic.contract import RANK0_ENV\n"
    )
    assert [module for _, module in imported_modules(source)] == [
        "torchx_elastic.agent.compat", "torchx_elastic.agent.compat", "torchx_elastic.agent",
        "torchx_elastic.contract",
    ]  # fmt: skip


def test_an_upward_import_and_a_circle_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks fail on what they are for: an import of a higher part, and two modules
    that import each other through a third."""
    assert part_of("torchx_elastic.agent.config.cli", AGENT_ORDER, f"{ROOT}.agent") == "config"
    assert part_of("torchx_elastic.schedulers.local_cwd", AGENT_ORDER, f"{ROOT}.agent") is None
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    real = imported_modules

    def with_an_upward_import(path: Path) -> list[tuple[int, str]]:
        extra = [(1, f"{ROOT}.agent.supervision.loop")] if path.name == "cli.py" else []
        return real(path) + extra

    monkeypatch.setattr(sys.modules[__name__], "imported_modules", with_an_upward_import)
    wrong = upward_imports(AGENT_ORDER, f"{ROOT}.agent")
    assert any("config" in w and "(supervision)" in w for w in wrong)
