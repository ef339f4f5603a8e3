"""What a training script can observe of its process: run as a worker, it writes one JSON
file (``$PROBE_OUT/<RANK>.json``) of everything a fresh ``python script.py`` would see
the same way on every launch (differential test: tests/fidelity/test_fresh_interpreter.py).

The script imports what a DDP script imports first (torch, torch.distributed, ...), so the
comparison is with a fresh interpreter that imported them itself.
"""

# ruff: noqa: E402 - the modules imported before the probe are recorded first
from __future__ import annotations

import sys

# the modules imported before the script ran (a fork server's): a reference run imports the
# same ones first (PROBE_PRELOAD), so both have what those imports did
ALREADY_IMPORTED = sorted(sys.modules)

import importlib  # noqa: E402
import os  # noqa: E402

for _name in filter(None, os.environ.get("PROBE_PRELOAD", "").split(",")):
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S112 - not importable on its own (a submodule's alias)
        continue

import atexit
import faulthandler
import gc
import io
import json
import locale
import logging
import multiprocessing
import random
import signal
import threading
import warnings

import torch
import torch.distributed
import torch.nn.parallel
import torch.utils.data

# what differs by design from one launch to another (pids, paths, the launcher's variables)
LAUNCHER_ENV_PREFIXES = ("TORCHELASTIC_", "TORCHX_ELASTIC_", "PROBE_", "TORCH_NCCL_")
WORKER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
)


def _logger_state(logger: logging.Logger) -> dict[str, object]:
    return {
        "level": logger.level,
        "handlers": [type(h).__module__ + "." + type(h).__qualname__ for h in logger.handlers],
        "filters": [type(f).__module__ + "." + type(f).__qualname__ for f in logger.filters],
        "propagate": logger.propagate,
        "disabled": logger.disabled,
    }


def _logging() -> dict[str, object]:
    configured = {}
    for name, logger in sorted(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger):
            continue
        state = _logger_state(logger)
        # torch's own loggers exist in both; what was done to them is what counts
        if name.startswith("torchx_elastic") or state != _logger_state(logging.Logger("x")):
            configured[name] = state
    return {
        "root": _logger_state(logging.root),
        "disable": logging.root.manager.disable,
        "configured": configured,
        "last_resort": type(logging.lastResort).__name__,
        "logger_class": logging.getLoggerClass().__name__,
        "record_factory": logging.getLogRecordFactory().__module__,
        "raise_exceptions": logging.raiseExceptions,
    }


def _warnings() -> dict[str, object]:
    filters = [
        [
            action,
            getattr(message, "pattern", message),
            category.__name__,
            getattr(module, "pattern", module),
            lineno,
        ]
        for action, message, category, module, lineno in warnings.filters
    ]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # "default": once per location, as the registry says
        for _ in range(2):
            warnings.warn_explicit("probe", UserWarning, "probe_file", 1, registry={})
    # a warning torch already gave in the launcher must still show in the script
    registries = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("torch")
        and isinstance(getattr(module, "__warningregistry__", None), dict)
        and len(module.__warningregistry__) > 1
    )
    return {
        "filters": filters,
        "default_shows": len(seen),
        "onceregistry": len(warnings.onceregistry),
        "warned_modules": registries,
        "showwarning": warnings.showwarning.__module__,
    }


def _hooks() -> dict[str, object]:
    return {
        name: getattr(sys, name) is getattr(sys, f"__{name}__")
        for name in ("excepthook", "unraisablehook", "displayhook", "breakpointhook")
    } | {
        "threading.excepthook": threading.excepthook is threading.__excepthook__,
        "settrace": sys.gettrace() is None,
        "setprofile": sys.getprofile() is None,
        "audit_hooks_env": os.environ.get("PYTHONAUDITHOOK"),
    }


def _signals() -> dict[str, str]:
    dispositions = {}
    for sig in sorted(signal.valid_signals()):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(sig)
        if handler is signal.default_int_handler:
            text = "default_int_handler"
        elif callable(handler):
            text = f"python:{handler.__module__}"
        else:
            text = str(handler)
        dispositions[
            signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        ] = text
    blocked = sorted(str(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    dispositions["blocked"] = ",".join(blocked)
    return dispositions


def _stream(stream: io.TextIOBase | None) -> dict[str, object]:
    if stream is None:
        return {"none": True}
    return {
        "type": type(stream).__name__,
        "encoding": getattr(stream, "encoding", None),
        "errors": getattr(stream, "errors", None),
        "line_buffering": getattr(stream, "line_buffering", None),
        "write_through": getattr(stream, "write_through", None),
        "buffer": type(getattr(stream, "buffer", None)).__name__,
        "fileno": stream.fileno(),
        "closefd_guard": stream.closed,
        "newlines": getattr(stream, "newlines", None),
    }


def _multiprocessing() -> dict[str, object]:
    import multiprocessing.process as mp_process
    import multiprocessing.util as mp_util

    tracker = sys.modules.get("multiprocessing.resource_tracker")
    tracker_fd = getattr(getattr(tracker, "_resource_tracker", None), "_fd", None)
    return {
        "start_method": multiprocessing.get_start_method(allow_none=True),
        "current": multiprocessing.current_process().name,
        "identity": list(multiprocessing.current_process()._identity),
        "parent": multiprocessing.parent_process() is not None,
        "children": len(multiprocessing.active_children()),
        "afterfork": len(mp_util._afterfork_registry),
        "finalizers": len(mp_util._finalizer_registry),
        "resource_tracker": tracker_fd is not None,
        "counter": next(mp_process._process_counter) if False else None,
    }


def _torch() -> dict[str, object]:
    state: dict[str, object] = {
        "num_threads_matches_env": torch.get_num_threads()
        == int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()),
        "interop_threads": torch.get_num_interop_threads(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn": [
            torch.backends.cudnn.enabled,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
        ],
        "initial_seed": torch.initial_seed(),
        "first_rand": torch.rand(1).item(),
        "dist_initialized": torch.distributed.is_initialized(),
        "cuda_initialized": torch.cuda.is_initialized(),
        "cuda_bad_fork": torch.cuda._is_in_bad_fork(),
        "default_device": str(torch.get_default_device())
        if hasattr(torch, "get_default_device")
        else None,
        "flush_denormal": torch.set_flush_denormal(False) and None,
    }
    return state


def _process() -> dict[str, object]:
    umask = os.umask(0o22)
    os.umask(umask)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(LAUNCHER_ENV_PREFIXES) and key not in WORKER_ENV
    }
    return {
        "env": env,
        "worker_env": sorted(k for k in WORKER_ENV if k in os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "threads": sorted(t.name for t in threading.enumerate()),
        "thread_count_native": len(os.listdir("/proc/self/task")),
        "argv": sys.argv,
        "orig_argv_tail": sys.orig_argv[-len(sys.argv) :] if sys.argv else [],
        "path0": sys.path[0],
        "path_rest": sys.path[1:],
        "flags": list(sys.flags),
        "dont_write_bytecode": sys.dont_write_bytecode,
        "recursion_limit": sys.getrecursionlimit(),
        "switch_interval": sys.getswitchinterval(),
        "gc": [gc.isenabled(), gc.get_threshold(), gc.get_debug()],
        "faulthandler": faulthandler.is_enabled(),
        "atexit": atexit._ncallbacks(),
        "locale": locale.setlocale(locale.LC_ALL),
        "stdin": _stream(sys.stdin),
        "stdout": _stream(sys.stdout),
        "stderr": _stream(sys.stderr),
        "std_originals": [
            sys.stdin is sys.__stdin__,
            sys.stdout is sys.__stdout__,
            sys.stderr is sys.__stderr__,
        ],
        "main": sorted(k for k in vars(sys.modules["__main__"]) if k.startswith("__")),
        "main_file": os.path.basename(getattr(sys.modules["__main__"], "__file__", "")),
        "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3],
        "extra_fds": len(os.listdir("/proc/self/fd")) - 4,  # 0-2 and the listing's own
        "random_differs_from_siblings": random.getrandbits(64),
    }


def observe() -> dict[str, object]:
    return {
        "logging": _logging(),
        "warnings": _warnings(),
        "hooks": _hooks(),
        "signals": _signals(),
        "multiprocessing": _multiprocessing(),
        "torch": _torch(),
        "process": _process(),
        "modules": [
            name for name in ALREADY_IMPORTED if not name.startswith(("torchx_elastic", "__"))
        ],
    }


if __name__ == "__main__":
    out = os.environ["PROBE_OUT"]
    with open(os.path.join(out, os.environ.get("RANK", "0") + ".json"), "w") as file:
        json.dump(observe(), file, indent=1, sort_keys=True, default=str)
