"""How a forked worker ends: what ``python script.py`` guarantees at exit, then ``os._exit``.

Why not let the interpreter finalize: with torch loaded that takes seconds, and it is where
forked workers hung. The hang (gdb and py-spy traces in docs/agent.md) is torch's
``ProcessGroupGloo`` destructor run with the GIL held: when a script drops the last reference
to a DDP model after ``destroy_process_group()``, the reducer (a pybind11 object whose
deallocation keeps the GIL) releases the last reference to the process group, whose destructor
joins gloo's worker threads. A gloo thread that is just dropping a finished collective
destroys the ``ThreadLocalState`` the work captured, which holds a Python object (the
``contextvars.Context`` that autograd stashes in thread-local state for every backward pass),
and needs the GIL to release it: deadlock. The window opens whenever the model dies within
a few milliseconds of the last collective; a forked worker reaches it far more often than a
spawned one (6 of 8 launches vs 0 of 8 under load), but both can.

So, in a forked worker:

- :func:`keep_process_groups` references every process group torch drops from its registry
  of live groups (``destroy_process_group`` and the like, whatever created the group:
  ``init_process_group``, ``new_group``, a ``DeviceMesh``): whatever the script frees, a
  group's last reference is this module's, never a reducer's;
- :func:`finish`, once the script is done, does what must still happen: non-daemon threads
  joined, ``atexit`` handlers,
  every open buffered file flushed, the standard streams flushed, then the process groups
  released through their Python objects, whose destructor releases the GIL (queued
  collectives complete, gloo's threads join without the deadlock); then ``os._exit``.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from typing import Any, NoReturn

_kept_groups: list[Any] = []
_FILE_TYPES = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)


class _GroupRegistry(dict):  # type: ignore[type-arg]
    """torch's registry of live process groups (``_world.pg_map``) that keeps a reference to
    every group removed from it (``destroy_process_group``, an abort, a shrink) until
    :func:`finish`: a group created by any path (``init_process_group``, ``new_group``,
    a ``DeviceMesh``'s sub-groups, ``split_group``) is in the registry while it lives."""

    def __delitem__(self, group: Any) -> None:
        _kept_groups.append(group)
        super().__delitem__(group)

    def pop(self, group: Any, *default: Any) -> Any:
        if group in self:
            _kept_groups.append(group)
        return super().pop(group, *default)

    def popitem(self) -> Any:
        item = super().popitem()
        _kept_groups.append(item[0])
        return item

    def clear(self) -> None:
        _kept_groups.extend(self)
        super().clear()


def keep_process_groups() -> None:
    """Reference every process group the script drops until :func:`finish` (no-op when
    ``torch.distributed`` is not available)."""
    distributed = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if distributed is None or c10d is None or not distributed.is_available():
        return
    from torchx_elastic.agent import compat

    if not compat.wrap_group_registry(_GroupRegistry):  # at least the public creators
        compat.keep_created_groups(_kept_groups)


def flush_open_files() -> None:
    """Flush every buffered file object still open (what finalization would do when it
    closes them), standard streams last."""
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects warn when their __class__ is read
        if issubclass(type(obj), _FILE_TYPES):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass  # a broken pipe, a full disk: as at a normal exit, nothing to do
    flush_std_streams()


def flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def release_process_groups() -> None:
    """Drop the references :func:`keep_process_groups` took; a group that nothing else
    references is destroyed now, with the GIL released by its Python object. Groups still
    registered (never destroyed by the script) live on to ``os._exit``, as the interpreter's
    own exit leaves them to the process's end."""
    while _kept_groups:
        _kept_groups.pop()


def join_non_daemon_threads() -> None:
    """What the interpreter does first at exit: wait for the threads that are not daemons."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()


def finish(code: int) -> NoReturn:
    """End the worker with ``code`` after what a normal exit guarantees."""
    try:
        join_non_daemon_threads()
        atexit._run_exitfuncs()
        flush_open_files()
        release_process_groups()
        flush_std_streams()
    finally:
        os._exit(code)
