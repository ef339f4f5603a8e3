"""A torch ``Store`` that counts every call of one simulated node: kind, bytes, time, CAS.

:class:`CountingStore` is a ``torch.distributed.Store`` written in Python (torch's
``PythonStore`` trampoline), so torch's own ``PrefixStore`` of a round can wrap it and the
calls made through that prefix are counted too. Each call goes to the node's own
``TCPStore`` client. Counted per call kind (``get``, ``set``, ``compare_set``, ``add``,
``check``, ``multi_get``, ...): calls, payload bytes out (keys and values sent) and in
(values returned: the wire protocol's few framing bytes are not counted), seconds spent
waiting for the answer. Per key purpose too: ``state`` (the rendezvous state blob, torch's
``torch.rendezvous.<run id>``, and its generation counter; the agent's own rendezvous'
round keys, ``torchx-elastic/rounds/``, whose compare-and-sets are counted as CAS
attempts), ``liveness`` (the keyed liveness' heartbeat keys, verdicts and suspects),
``progress``, ``roll_call``, ``other``.

A ``compare_set`` of the state key is a CAS of the rendezvous state: it succeeded when the
store answers with the value this node wanted to write, else another node wrote first (a
conflict: torch re-reads the answer and tries again). The time of each success is kept:
in steady state each success is one keep-alive heartbeat, so the gaps between them are the
node's real heartbeat period, and the conflicts before each success its retries. With the
keyed liveness (``--rdzv-conf liveness=keys``) a heartbeat is a ``set`` of the node's beat
key instead, which never conflicts.

:meth:`CountingStore.freeze` makes the node vanish: every call from then on waits and
never reaches the store (a host whose network died), until :meth:`release`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from torchx_elastic.agent.rendezvous.rounds.keys import PREFIX as ROUNDS_KEY_PREFIX
from torchx_elastic.contract import (
    LIVENESS_KEY_PREFIX,
    PROGRESS_KEY_PREFIX,
    PROGRESS_PUBLISHERS_KEY,
    ROLL_CALL_KEY_PREFIX,
)

PURPOSES = ("state", "liveness", "progress", "roll_call", "other")


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8  # a number


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


@dataclass
class KindStats:
    calls: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)

    def add(self, out: int, into: int, seconds: float) -> None:
        self.calls += 1
        self.bytes_out += out
        self.bytes_in += into
        self.seconds += seconds
        self.latencies_s.append(seconds)


@dataclass
class NodeCounters:
    """What one node did since the last :meth:`reset` (the start of a window)."""

    kinds: dict[str, KindStats] = field(default_factory=dict)
    purposes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PURPOSES, 0))
    # bytes out and in per purpose (a call of several keys: its first key's)
    purpose_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PURPOSES, 0))
    cas_attempts: int = 0
    cas_conflicts: int = 0
    first_attempts: int = 0  # CASes that are not a retry after a conflict
    first_conflicts: int = 0
    state_bytes: int = 0  # the last state value this node wrote or read
    beat_gaps_s: list[float] = field(default_factory=list)  # between successful state CASes
    beat_retries: list[int] = field(default_factory=list)  # conflicts before each success
    beat_spans_s: list[float] = field(default_factory=list)  # first try to success
    # a CAS writes over the state the node read last (a get, or a failed CAS's answer):
    # another node's write since then makes it fail. How old that state is at each CAS;
    # and where the same thread read it (a retry, a get of the same operation), the wall
    # time from the read to the CAS and the CPU time the thread used in it (the rest is
    # waiting for the GIL or a CPU: the harness, not the agent)
    token_age_s: list[float] = field(default_factory=list)
    think_wall_s: list[float] = field(default_factory=list)
    think_cpu_s: list[float] = field(default_factory=list)

    def kind(self, name: str) -> KindStats:
        stats = self.kinds.get(name)
        if stats is None:
            stats = self.kinds[name] = KindStats()
        return stats


def is_beat_key(key: str) -> bool:
    return key.startswith(LIVENESS_KEY_PREFIX) and "/beat/" in key


def verdict_named(key: str) -> str | None:
    """The node id a keyed liveness verdict (its ``dead`` key) names; None for other keys."""
    if key.startswith(LIVENESS_KEY_PREFIX) and "/dead/" in key:
        return key.rsplit("/dead/", 1)[1]
    return None


def purpose_of(key: str, state_key: str) -> str:
    if key == state_key or key.startswith(ROUNDS_KEY_PREFIX):
        return "state"
    if key.startswith(LIVENESS_KEY_PREFIX):
        return "liveness"
    if PROGRESS_KEY_PREFIX in key or PROGRESS_PUBLISHERS_KEY in key:
        return "progress"
    if ROLL_CALL_KEY_PREFIX in key:
        return "roll_call"
    return "other"


class NodeStopped(RuntimeError):
    """A call of a node the harness made vanish, after the run."""


class CountingStore(dist.Store):  # type: ignore[misc]
    """One node's store client, counted (see the module's docstring)."""

    def __init__(self, inner: Any, state_key: str, twin_of: CountingStore | None = None) -> None:
        super().__init__()
        self._inner = inner
        self._state_key = state_key
        # a second connection of the same node (connect_again) counts into the first's
        # counters, and vanishes with it
        first = twin_of
        self._lock: threading.Lock = first._lock if first else threading.Lock()
        self._box: list[NodeCounters] = first._box if first else [NodeCounters()]
        self._twins: list[CountingStore] = []
        self._origin: CountingStore = first if first else self
        # told the id of each node this node's liveness says dead (see :func:`verdict_named`)
        self.on_verdict: Callable[[str], None] | None = None
        # the node's longest gap between two of its heartbeats, over the whole run
        self._longest_gap_s: list[float] = first._longest_gap_s if first else [0.0]
        self._last_success_s: float | None = None
        self._last_beat_set_s: float | None = None  # the keyed liveness' last beat
        self._read_at: tuple[float, int, float] | None = None  # time, thread, its CPU time
        self._streak = 0  # conflicts since the last successful state CAS
        self._streak_start_s = 0.0
        self._frozen: threading.Event = first._frozen if first else threading.Event()
        self._released: threading.Event = first._released if first else threading.Event()
        super().set_timeout(inner.timeout)

    @property
    def counters(self) -> NodeCounters:
        return self._box[0]

    def longest_beat_gap_s(self) -> float:
        """The longest time between two heartbeats of this node so far (its beat thread did
        not run, or its store call waited: a watcher cannot tell that from a dead node)."""
        with self._lock:
            return self._longest_gap_s[0]

    def connect_again(self) -> CountingStore:
        """Another connection of this node to the store (the agent's liveness has its own:
        handler.py's ``own_connection``), counted as this one."""
        from torch.distributed import TCPStore

        inner = self._inner
        client = TCPStore(inner.host, inner.port, is_master=False, timeout=inner.timeout)
        twin = CountingStore(client, self._state_key, twin_of=self)
        self._twins.append(twin)
        return twin

    # -- the harness's controls ---------------------------------------------------------

    def reset(self) -> NodeCounters:
        """The counters so far; counting starts again from zero (the beat clock goes on)."""
        with self._lock:
            done, self._box[0] = self._box[0], NodeCounters()
            self._box[0].state_bytes = done.state_bytes
        return done

    def new_round(self) -> None:
        """The node returned from a round: its next heartbeat starts the beat clock again
        (the first one after a join comes later than the keep-alive interval)."""
        with self._lock:
            for store in (self, *self._twins):
                store._last_success_s = store._last_beat_set_s = None

    def freeze(self) -> None:
        self._frozen.set()

    def release(self) -> None:
        self._released.set()

    @property
    def frozen(self) -> bool:
        return self._frozen.is_set()

    # -- counting -----------------------------------------------------------------------

    def _call(self, kind: str, keys: list[str], out: int, fn: Any, *args: Any) -> Any:
        if self._frozen.is_set():
            self._released.wait()
            raise NodeStopped("this simulated node was stopped")
        start = time.perf_counter()
        result = fn(*args)
        seconds = time.perf_counter() - start
        into = 0 if result is None or isinstance(result, bool) else _size(result)
        with self._lock:
            counters = self.counters
            counters.kind(kind).add(out, into, seconds)
            for key in keys:
                counters.purposes[purpose_of(key, self._state_key)] += 1
            if keys:
                counters.purpose_bytes[purpose_of(keys[0], self._state_key)] += out + into
        return result

    def _state_read(self) -> None:
        self._read_at = (time.perf_counter(), threading.get_ident(), time.thread_time())

    def _state_cas(self, expected: Any, desired: Any) -> bytes:
        start_s, start_cpu_s = time.perf_counter(), time.thread_time()
        read = self._read_at
        key = self._state_key
        out = _size(key) + _size(expected) + _size(desired)
        result = self._call(
            "compare_set", [key], out, self._inner.compare_set, key, expected, desired
        )
        now_s = time.perf_counter()
        self._state_read()
        with self._lock:
            counters = self.counters
            counters.cas_attempts += 1
            counters.state_bytes = len(result)
            first = self._streak == 0
            counters.first_attempts += first
            if read is not None:
                counters.token_age_s.append(start_s - read[0])
                if read[1] == threading.get_ident():
                    counters.think_wall_s.append(start_s - read[0])
                    counters.think_cpu_s.append(start_cpu_s - read[2])
            if bytes(result) != _as_bytes(desired):
                counters.cas_conflicts += 1
                counters.first_conflicts += first
                if self._streak == 0:
                    self._streak_start_s = start_s
                self._streak += 1
                return result  # type: ignore[no-any-return]
            if self._last_success_s is not None:
                counters.beat_gaps_s.append(now_s - self._last_success_s)
            counters.beat_retries.append(self._streak)
            counters.beat_spans_s.append(
                now_s - (self._streak_start_s if self._streak else start_s)
            )
            self._last_success_s, self._streak = now_s, 0
        return result  # type: ignore[no-any-return]

    # -- torch's Store ------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        start_s = time.perf_counter()
        self._call("set", [key], _size(key) + _size(value), self._inner.set, key, value)
        named = verdict_named(key)
        tell = self._origin.on_verdict
        if named is not None and tell is not None:
            tell(named)  # this node said that node dead (while joining, too)
        if is_beat_key(key):  # a heartbeat of the keyed liveness: a write that cannot conflict
            now_s = time.perf_counter()
            with self._lock:
                counters = self.counters
                if self._last_beat_set_s is not None:
                    gap_s = now_s - self._last_beat_set_s
                    counters.beat_gaps_s.append(gap_s)
                    self._longest_gap_s[0] = max(self._longest_gap_s[0], gap_s)
                counters.beat_retries.append(0)
                counters.beat_spans_s.append(now_s - start_s)
                self._last_beat_set_s = now_s

    def get(self, key: str) -> bytes:
        result = self._call("get", [key], _size(key), self._inner.get, key)
        if key == self._state_key:
            self._state_read()
            with self._lock:
                self.counters.state_bytes = len(result)
        return result  # type: ignore[no-any-return]

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        if key == self._state_key and _size(expected) > 0:  # not the backend's first write
            return self._state_cas(expected, desired)
        out = _size(key) + _size(expected) + _size(desired)
        result = self._call(
            "compare_set", [key], out, self._inner.compare_set, key, expected, desired
        )
        if key.startswith(ROUNDS_KEY_PREFIX):  # the agent's own rendezvous: a round's CAS
            with self._lock:
                self.counters.cas_attempts += 1
                self.counters.cas_conflicts += bytes(result) != _as_bytes(desired)
        return result  # type: ignore[no-any-return]

    def add(self, key: str, amount: int) -> int:
        return self._call("add", [key], _size(key) + 8, self._inner.add, key, amount)  # type: ignore[no-any-return]

    def check(self, keys: list[str]) -> bool:
        return self._call("check", keys, _size(keys), self._inner.check, keys)  # type: ignore[no-any-return]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._call("multi_get", keys, _size(keys), self._inner.multi_get, keys)  # type: ignore[no-any-return]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        out = _size(keys) + _size(values)
        self._call("multi_set", keys, out, self._inner.multi_set, keys, values)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        args = (keys,) if timeout is None else (keys, timeout)
        self._call("wait", keys, _size(keys), self._inner.wait, *args)

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", [key], _size(key), self._inner.delete_key, key)  # type: ignore[no-any-return]

    def num_keys(self) -> int:
        return self._call("num_keys", [], 0, self._inner.num_keys)  # type: ignore[no-any-return]

    def append(self, key: str, value: Any) -> None:
        self._call("append", [key], _size(key) + _size(value), self._inner.append, key, value)

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        self._inner.set_timeout(timeout)
