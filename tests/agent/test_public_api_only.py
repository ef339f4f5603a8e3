"""The package builds on torch's and torchx's public API: their private names (``_name``)
are read only in one compatibility module per library, ``agent/compat.py`` for torch and
``schedulers/compat.py`` for torchx (``docs/architecture.md``); torch's compat module reads
three listed names, none of them the rendezvous' (which is the agent's own).

Checked over every module of the package: attribute reads of another object's private
name, ``getattr``/``setattr``/``hasattr``/``delattr`` with one, imports of a private torch or
torchx module or name, a private torch module named as a string (to import it), a private
attribute that a torch or torchx base class keeps and our subclass reads through ``self``,
and overrides of a torch or torchx class's private methods. Runs in the agent's end-to-end
selection (``AGENT_E2E_TESTS``), so on every torch version CI runs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import torchx_elastic

PACKAGE = Path(torchx_elastic.__file__).parent
COMPAT_MODULES = {PACKAGE / "agent" / "compat.py", PACKAGE / "schedulers" / "compat.py"}
# the documented hooks of an extension: PContext's abstract methods (torch), a torchx
# scheduler's (torchx's "implementing a scheduler": these it asks a scheduler to provide)
ALLOWED_OVERRIDES = {
    "_start",
    "_poll",
    "_close",
    "_abc_impl",  # abc.ABC's
    "_submit_dryrun",
    "_run_opts",
    "_validate",
    "_cancel_existing",
}
# the standard library's underscore names (not torch's): os._exit is documented;
# atexit._run_exitfuncs is CPython's only way to run the atexit handlers without the
# interpreter's teardown (workers/worker_end.py), unchanged since Python 3.0
ALLOWED_ATTRIBUTES = {"os._exit", "atexit._run_exitfuncs"}
FOREIGN = ("torch", "torchx")
# the modules whose classes extend torch's or torchx's (imported to see their bases)
EXTENDING = ("agent", "schedulers")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _foreign(module: str) -> bool:
    return module.split(".")[0] in FOREIGN


def _foreign_private_module(module: str) -> bool:
    return _foreign(module) and any(_private(part) for part in module.split("."))


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p not in COMPAT_MODULES)


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def _is_super_hook(node: ast.Attribute) -> bool:
    """``super()._submit_dryrun``: a documented hook of the base class, called as such."""
    call = node.value
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "super"
        and node.attr in ALLOWED_OVERRIDES
    )


def _private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (
                _private(node.attr)
                and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls"))
                and ast.unparse(node) not in ALLOWED_ATTRIBUTES
                and not _is_super_hook(node)
            ):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.args[1] if len(node.args) > 1 else None
            if (
                node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _private(name.value)
            ):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module and _foreign(node.module):
            if _foreign_private_module(node.module) or any(_private(a.name) for a in node.names):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Import):
            if any(_foreign_private_module(alias.name) for alias in node.names):
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _foreign_private_module(node.value)
        ):
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_private_name_of_torch_or_torchx_is_used_outside_the_compat_modules() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line} {text}"
        for path in _modules()
        for line, text in _private_uses(ast.parse(path.read_text()))
    ]
    assert found == []


# the private torch names agent/compat.py still reads, none of them the rendezvous': torch
# keeps no public trace of a CUDA fork hazard (its fork handler is registered in C++), and no
# public registry of live process groups (the public creators are the fallback)
COMPAT_PRIVATE_TORCH = {
    "getattr(torch.cuda, '_is_in_bad_fork', None)",
    "getattr(c10d, '_world', None)",
    "setattr(c10d, '_pg_map', wrap(registry))",
}


def test_torchs_compat_module_reads_the_listed_private_names_only() -> None:
    """A private torch name added anywhere in the package, compat.py included, fails."""
    compat = PACKAGE / "agent" / "compat.py"
    found = {text for _, text in _private_uses(ast.parse(compat.read_text()))}
    assert found == COMPAT_PRIVATE_TORCH


def test_the_check_sees_each_form_of_private_use() -> None:
    code = (
        "import torch._dynamo\n"
        "from torch.distributed.elastic.agent.server.api import _get_fq_hostname\n"
        "from torchx.schedulers import _local\n"
        "x = scheduler._apps\n"
        "getattr(handler, '_store')\n"
        "setattr(module, '_pg_map', {})\n"
        "y = 'torch._dynamo'\n"
        "z = super()._submit_dryrun(app, cfg)\n"
        "w = self._own\n"
    )
    assert [line for line, _ in _private_uses(ast.parse(code))] == [1, 2, 3, 4, 5, 6, 7]


def _self_reads_and_writes(cls: type) -> tuple[set[str], set[str]]:
    """The private names a class of ours reads through ``self`` and those it defines
    (assigns through ``self``, or names in its body)."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))  # type: ignore[arg-type]
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    reads, writes = set(), set(vars(cls))
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"
            and _private(sub.attr)
        ):
            (writes if isinstance(sub.ctx, ast.Store) else reads).add(sub.attr)
    return reads, writes


def _extending_classes() -> list[type]:
    classes = []
    for path in _modules():
        if path.name == "__main__.py" or path.relative_to(PACKAGE).parts[0] not in EXTENDING:
            continue
        module = importlib.import_module(_module_name(path))
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and any(_foreign(base.__module__) for base in cls.__mro__[1:])
            ):
                classes.append(cls)
    return classes


def test_no_class_overrides_or_reads_a_private_name_of_its_torch_or_torchx_base() -> None:
    overrides, reads_of_base = [], []
    classes = _extending_classes()
    for cls in classes:
        bases = [b for b in cls.__mro__[1:] if _foreign(b.__module__)]
        ours = [c for c in cls.__mro__ if c.__module__.startswith("torchx_elastic.")]
        for name in vars(cls):
            private = _private(name) and name not in ALLOWED_OVERRIDES
            if private and any(hasattr(base, name) for base in bases):
                overrides.append(f"{cls.__qualname__}.{name}")
        reads: set[str] = set()
        defined: set[str] = set()
        for own in ours:
            own_reads, own_writes = _self_reads_and_writes(own)
            reads |= own_reads
            defined |= own_writes
        reads_of_base += [
            f"{cls.__qualname__}: self.{name}"
            for name in sorted(reads - defined - ALLOWED_OVERRIDES)
        ]
    # WorkerProcesses (PContext), RankLogsSpecs (LogsSpecs), the local_cwd, docker,
    # kubernetes and slurm schedulers at least
    assert len(classes) >= 6
    assert overrides == []
    assert reads_of_base == []
