"""A stub CUDA driver (``libcuda.so.1``) and NVML (``libnvidia-ml.so.1``), compiled by the tests
with gcc, that append ``<function> <pid>`` to the file named by ``CUDA_STUB_LOG`` at each call.

Put first on ``LD_LIBRARY_PATH``, they are what a CUDA build of torch loads on a machine
without a GPU. NVML reports ``CUDA_STUB_DEVICES`` devices (2 unless set): torch's
``device_count()`` asks NVML first, and so does ``is_available()`` with
``PYTORCH_NVML_BASED_CUDA_CHECK=1``. The driver answers ``cuInit``, ``cuDriverGetVersion``,
``cuDeviceGetCount`` and ``cuGetProcAddress`` (found: those; anything else: not found), which
is not enough for the CUDA runtime: its ``cudaGetDeviceCount`` fails gracefully, so
``is_available()`` without NVML says False (after ``cuInit`` in the asking process).
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import pytest

LOG_ENV = "CUDA_STUB_LOG"
DEVICES_ENV = "CUDA_STUB_DEVICES"

_RECORD = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void record(const char *name) {
  const char *path = getenv("CUDA_STUB_LOG");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  char line[200];
  int n = snprintf(line, sizeof line, "%s %d\n", name, (int)getpid());
  if (write(fd, line, n) < 0) {}
  close(fd);
}
static int devices(void) {
  const char *s = getenv("CUDA_STUB_DEVICES");
  return s ? atoi(s) : 2;
}
"""

DRIVER = (
    _RECORD
    + r"""
int cuInit(unsigned flags) { (void)flags; record("cuInit"); return 0; }
int cuDriverGetVersion(int *v) { record("cuDriverGetVersion"); *v = 13090; return 0; }
int cuDeviceGetCount(int *n) { record("cuDeviceGetCount"); *n = devices(); return 0; }
int cuGetProcAddress(const char *, void **, int, unsigned long long);
static int lookup(const char *symbol, void **pfn) {
  record("cuGetProcAddress");
  if (!strcmp(symbol, "cuInit")) *pfn = (void *)cuInit;
  else if (!strcmp(symbol, "cuDriverGetVersion")) *pfn = (void *)cuDriverGetVersion;
  else if (!strcmp(symbol, "cuDeviceGetCount")) *pfn = (void *)cuDeviceGetCount;
  else if (!strcmp(symbol, "cuGetProcAddress")) *pfn = (void *)cuGetProcAddress;
  else { *pfn = 0; return 500; /* CUDA_ERROR_NOT_FOUND */ }
  return 0;
}
int cuGetProcAddress(const char *s, void **p, int v, unsigned long long f) {
  (void)v; (void)f; return lookup(s, p);
}
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *status) {
  (void)v; (void)f;
  int r = lookup(s, p);
  if (status) *status = r ? 1 : 0;
  return r;
}
"""
)

NVML = (
    _RECORD
    + r"""
int nvmlInit_v2(void) { record("nvmlInit_v2"); return 0; }
int nvmlInit(void) { record("nvmlInit"); return 0; }
int nvmlInitWithFlags(unsigned f) { (void)f; record("nvmlInitWithFlags"); return 0; }
int nvmlShutdown(void) { record("nvmlShutdown"); return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) {
  record("nvmlDeviceGetCount_v2"); *n = devices(); return 0;
}
int nvmlDeviceGetCount(unsigned *n) { record("nvmlDeviceGetCount"); *n = devices(); return 0; }
const char *nvmlErrorString(int r) { (void)r; return "stub NVML"; }
"""
)


def build(directory: Path) -> Path:
    """Compile both libraries into ``directory``; fails (never skips) without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("the stub CUDA driver needs gcc (apt-get install gcc)")
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in (("libcuda.so.1", DRIVER), ("libnvidia-ml.so.1", NVML)):
        src = directory / f"{name}.c"
        src.write_text(source)
        subprocess.run(
            [gcc, "-shared", "-fPIC", "-O1", "-o", str(directory / name), str(src)], check=True
        )
    return directory


def calls_by_pid(log: Path) -> dict[int, list[str]]:
    """pid -> the stub functions it called, in order."""
    calls: dict[int, list[str]] = collections.defaultdict(list)
    if log.exists():
        for line in log.read_text().splitlines():
            name, pid = line.rsplit(" ", 1)
            calls[int(pid)].append(name)
    return dict(calls)
