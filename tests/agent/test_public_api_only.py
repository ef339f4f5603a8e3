"""The agent builds on torch's public API: no overridden underscore methods of torch
classes, no reads of a torch object's underscore attributes outside ``compat.py``."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import torchx_elastic.agent

AGENT_DIR = Path(torchx_elastic.agent.__file__).parent
COMPAT = AGENT_DIR / "compat.py"
# PContext's abstract hooks are the documented way to provide one
ALLOWED_OVERRIDES = {"_start", "_poll", "_close", "_abc_impl"}  # _abc_impl: abc.ABC
# the standard library's underscore names (not torch's): os._exit is documented;
# atexit._run_exitfuncs is CPython's only way to run the atexit handlers without the
# interpreter's teardown (workers/worker_end.py), unchanged since Python 3.0
ALLOWED_ATTRIBUTES = {"os._exit", "atexit._run_exitfuncs"}


def _modules() -> list[Path]:
    return sorted(p for p in AGENT_DIR.rglob("*.py") if p != COMPAT)


def _module_name(path: Path) -> str:
    relative = path.relative_to(AGENT_DIR.parent.parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__").removesuffix(".__main__")


def test_no_class_overrides_an_underscore_method_of_a_torch_class() -> None:
    found = []
    checked = 0
    for path in _modules():
        if path.name == "__main__.py":
            continue
        module = importlib.import_module(_module_name(path))
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            torch_bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("torch.")]
            checked += bool(torch_bases)
            for name in vars(cls):
                if not name.startswith("_") or name.startswith("__") or name in ALLOWED_OVERRIDES:
                    continue
                if any(hasattr(base, name) for base in torch_bases):
                    found.append(f"{cls.__qualname__}.{name}")
    assert checked >= 2  # WorkerProcesses (PContext) and RankLogsSpecs (LogsSpecs) at least
    assert found == []


def test_no_private_attribute_of_another_object_is_read_outside_compat() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and ast.unparse(node) not in ALLOWED_ATTRIBUTES
            ):
                found.append(f"{path.relative_to(AGENT_DIR)}:{node.lineno} {ast.unparse(node)}")
    assert found == []
