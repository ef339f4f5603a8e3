"""Whether the fork server imports torch's compiler before forking, from the worker's script.

torch's compiler costs over a second of CPU: a worker that builds ``DistributedDataParallel``
(or compiles, or shards) imports it, so the server imports it once for all of them. A job
that never gets there (init the process group, a few collectives, exit) would wait that
second for nothing before its first worker starts. So the script is read, not run: its
source and those of the modules it imports from its own folder (as ``python SCRIPT`` would
find them). The compiler is left out only when nothing there can reach it: no name that
leads to it, only standard library, light torch modules and local files imported, no
import by name at run time. When in doubt (a module run with ``-m``, a program, a file that
cannot be read, a package from elsewhere), it is preloaded.

A wrong guess costs time only: a worker imports what the server did not.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence

# torch modules that do not import the compiler
LIGHT_TORCH_MODULES = frozenset(
    {
        "torch",
        "torch.distributed",
        "torch.nn",
        "torch.nn.functional",
        "torch.optim",
        "torch.utils",
        "torch.utils.data",
        "torch.multiprocessing",
        "torch.autograd",
        "torch.cuda",
        "torch.backends",
    }
)
# names (variables, attributes, imported names, strings) that lead to the compiler, or
# to imports the source does not show
HEAVY_NAMES = frozenset(
    {
        "DistributedDataParallel",
        "DDP",
        "FullyShardedDataParallel",
        "FSDP",
        "fully_shard",
        "compile",
        "_dynamo",
        "dynamo",
        "export",
        "DeviceMesh",
        "init_device_mesh",
        "DTensor",
        "parallelize_module",
        "pipelining",
        "checkpoint",
        "import_module",
        "__import__",
        "run_path",
        "run_module",
        "exec",
        "eval",
    }
)
_MAX_FILES = 64


def needs_compiler(worker_args: Sequence[str]) -> bool:
    """Whether workers that run ``bootstrap WORKER_ARGS`` may import torch's compiler (the
    fork server then imports it before forking them: ``compat.preload_compiler``)."""
    script = worker_args[0] if worker_args else "-"
    if script.startswith("-") or not script.endswith(".py") or not os.path.isfile(script):
        return True  # -m, --exec, --call, a folder: unknown
    return _may_reach_heavy(os.path.abspath(script))


def _may_reach_heavy(script: str) -> bool:
    folder = os.path.dirname(script)
    seen: set[str] = set()
    pending = [script]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        if len(seen) > _MAX_FILES:
            return True
        try:
            with open(path, "rb") as file:
                tree = ast.parse(file.read(), path)
        except (OSError, ValueError, SyntaxError):
            return True
        if not HEAVY_NAMES.isdisjoint(_names(tree)):
            return True
        for name in _imported(tree, path, folder):
            local = _local_file(name, folder)
            if local is not None:
                pending.extend(local)
            elif not _light(name):
                return True
    return False


def _names(tree: ast.AST) -> Iterator[str]:
    """Every name the code uses: variables, attributes, imported names, string constants."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.alias):
            yield from node.name.split(".")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _imported(tree: ast.AST, path: str, folder: str) -> Iterator[str]:
    """Absolute names of the modules a file imports (``from X import y``: X and X.y)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: the file's package, as a path below the folder
                package = os.path.relpath(os.path.dirname(path), folder).split(os.sep)
                package = [p for p in package if p != "."]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            if base:
                yield base
            yield from (f"{base}.{alias.name}" if base else alias.name for alias in node.names)


def _local_file(name: str, folder: str) -> list[str] | None:
    """The files of the script's folder that ``import NAME`` runs (its packages' too), or
    None if its first part is not there."""
    parts = name.split(".")
    found: list[str] = []
    for depth in range(1, len(parts) + 1):
        stem = os.path.join(folder, *parts[:depth])
        if os.path.isfile(stem + ".py"):
            found.append(stem + ".py")
            break  # a module: what follows are names in it
        if os.path.isfile(os.path.join(stem, "__init__.py")):
            found.append(os.path.join(stem, "__init__.py"))
        elif depth == 1:
            return None
        else:
            break  # a name in the package, not a module
    return found or None


def _light(name: str) -> bool:
    top = name.split(".", 1)[0]
    if top == "torch":
        if name in LIGHT_TORCH_MODULES:
            return True
        parent = name.rpartition(".")[0]  # ``from torch.nn import Linear``: a name in it
        return parent in LIGHT_TORCH_MODULES and not _torch_module(name)
    return top in sys.stdlib_module_names or top == "__future__"


def _torch_module(name: str) -> bool:
    """Whether ``torch.X.Y`` is a module of torch's (a file or a folder), not a name in one."""
    spec = importlib.util.find_spec("torch")  # a top-level name: nothing is imported
    folder = os.path.dirname(spec.origin) if spec is not None and spec.origin else ""
    if not folder:
        return True  # cannot tell: as if it were
    stem = os.path.join(folder, *name.split(".")[1:])
    return os.path.isfile(stem + ".py") or os.path.isdir(stem)
