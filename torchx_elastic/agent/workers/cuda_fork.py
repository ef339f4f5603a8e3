"""Whether workers forked from this process could use CUDA.

A process forked after its parent asked CUDA for its devices (``torch.cuda.is_available()``,
``device_count()``, ``torch.accelerator``...) or initialized it cannot use CUDA: torch raises
``Cannot re-initialize CUDA in forked subprocess`` at its first CUDA call, the driver answers
``CUDA_ERROR_NOT_INITIALIZED``. The agent itself never asks (devices are counted in a child:
``config/devices.py``), but a caller of ``launch(fn)`` may have, or a module imported before
the fork. Then workers start by spawn, never silently in a bad fork: :func:`fork_hazard` says
why, in one line.

torch keeps no public trace of having asked (its fork handler is registered in C++): a probe
child, forked and gone at once, reads torch's flag of a bad fork. Only CUDA (and ROCm) builds
of torch are probed; the CPU build cannot poison a fork.
"""

from __future__ import annotations

import os
import sys
import warnings

from torchx_elastic.agent import compat

POISONED = (
    "CUDA was asked for its devices in this process (torch.cuda.is_available(), device_count()"
    " or torch.accelerator, e.g. by building torch's LaunchConfig), so a worker forked from it"
    " could not use CUDA"
)
INITIALIZED = (
    "CUDA is initialized in this process (torch.cuda.is_initialized()), so a worker forked from"
    " it could not use CUDA"
)
BAD_FORK = (
    "this process is itself a fork of one that initialized CUDA, so a worker forked from it"
    " could not use CUDA"
)


def fork_hazard() -> str | None:
    """Why a worker forked from this process could not use CUDA; None when it could."""
    torch = sys.modules.get("torch")
    if torch is None or not compat.cuda_built():
        return None
    if compat.in_bad_cuda_fork():
        return BAD_FORK
    if torch.cuda.is_initialized():
        return INITIALIZED
    if _probe_in_bad_fork():
        return POISONED
    return None


def _probe_in_bad_fork() -> bool:
    """Fork a child that only reads torch's bad-fork flag and exits with it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with warnings.catch_warnings():  # 3.12: a fork with other threads warns; this one is safe
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe child
        code = 1
        try:
            code = 3 if compat.in_bad_cuda_fork() else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 3
