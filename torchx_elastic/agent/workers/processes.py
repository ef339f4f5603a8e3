"""Worker processes of one attempt, started with their output on pipes to the agent.

Where the agent's output reaches a person's terminal (the sink's ``terminal``), each
worker's stdout and stderr are pseudo-terminals of that terminal's size instead, as under
torchrun, where the worker inherits the terminal (``console/output/terminal.py``).

A ``PContext`` of torch.distributed.elastic (what ``LocalElasticAgent`` supervises), so
the agent's monitor / restart / shutdown logic is torch's own; what differs from torch's
``SubprocessContext`` is that output comes back through pipes (whole lines, see
``output.py``) and every worker runs in its own session, dies with the agent, and is
stopped together with its children (the whole process group).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing.api import (
    LogsSpecs,
    PContext,
    RunProcsResult,
)
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from torchx_elastic.agent.console.output.sinks import OutputSink, Stream
from torchx_elastic.agent.console.output.terminal import resize
from torchx_elastic.agent.workers import bootstrap
from torchx_elastic.agent.workers.forkserver import ForkServer
from torchx_elastic.agent.workers.janitor import Janitor
from torchx_elastic.contract.error_file import read_error_file

log = logging.getLogger(__name__)

_DRAIN_TIMEOUT_S = 2.0


def process_failure(local_rank: int, pid: int, exitcode: int, error_file: str) -> ProcessFailure:
    """torch's ``ProcessFailure``, whatever the worker left in its error file.

    torch's constructor parses the file and raises on an empty, partial or foreign one (a
    worker killed while ``@record`` writes it leaves it empty); such a file is left out
    here, and the report reads it again itself (:func:`read_error_file`) and says why it
    could not be used.
    """
    content = read_error_file(error_file)
    if content is not None and not content.problem:
        try:
            return ProcessFailure(local_rank, pid, exitcode, error_file)
        except Exception as err:  # noqa: BLE001 - changed since it was read: as unreadable
            log.debug("torch could not read the error file %s: %s", error_file, err)
    return ProcessFailure(local_rank, pid, exitcode, error_file="")


class PipePump(threading.Thread):
    """Reads every worker pipe with one selector and feeds the bytes to the sink."""

    def __init__(self, sink: OutputSink) -> None:
        super().__init__(name="torchx-elastic-output", daemon=True)
        self._sink = sink
        self._selector = selectors.DefaultSelector()
        self._open = 0
        self._lock = threading.Lock()
        self._all_closed = threading.Event()

    def add(self, fd: int, local_rank: int, stream: Stream) -> None:
        os.set_blocking(fd, False)
        with self._lock:
            self._selector.register(fd, selectors.EVENT_READ, (local_rank, stream))
            self._open += 1
            self._all_closed.clear()

    def run(self) -> None:
        while True:
            with self._lock:
                if self._open == 0:
                    self._all_closed.set()
                    return
            for key, _ in self._selector.select(timeout=0.2):
                local_rank, stream = key.data
                fd = key.fd
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:  # a pseudo-terminal whose worker end is closed (EIO)
                    data = b""
                if data:
                    self._sink.feed(local_rank, stream, data)
                    continue
                with self._lock:
                    self._selector.unregister(fd)
                    self._open -= 1
                os.close(fd)
                self._sink.end(local_rank, stream)
            self._sink.tick()

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until every pipe reached end of file (workers and their children exited)."""
        return self._all_closed.wait(timeout_s)


class ForkedWorker:
    """A worker forked by the fork server, with the part of ``Popen``'s interface we use."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid

    def poll(self) -> int | None:
        return self._server.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
        return code


Worker = subprocess.Popen[bytes] | ForkedWorker
_BOOTSTRAP_PREFIX = ("-m", bootstrap.__name__)


class WorkerProcesses(PContext):
    """The workers of one attempt, as ``subprocess.Popen`` children with piped output."""

    def __init__(
        self,
        name: str,
        entrypoint: str,
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        logs_specs: LogsSpecs,
        make_sink: Callable[[dict[int, str], dict[int, str]], OutputSink],
        janitor: Janitor | None = None,
        fork_server: ForkServer | None = None,
    ) -> None:
        super().__init__(name, entrypoint, args, envs, logs_specs)
        self._janitor = janitor
        self._fork_server = fork_server
        self._sink = make_sink(self.stdouts, self.stderrs)
        self._pump = PipePump(self._sink)
        self._terminal = self._sink.terminal
        self._ptys: list[int] = []  # our ends of the workers' pseudo-terminals, to resize
        self._ptys_lock = threading.Lock()  # a resize does not meet their closing
        self._stop_resizing: Callable[[], None] | None = None
        self._procs: dict[int, Worker] = {}
        self._failures: dict[int, ProcessFailure] = {}
        self._closed = False

    def _start(self) -> None:
        for local_rank in range(self.nprocs):
            command = [str(self.entrypoint), *map(str, self.args[local_rank])]
            env = {**os.environ, **self.envs[local_rank]}
            if self._fork_server is not None and tuple(command[1:3]) == _BOOTSTRAP_PREFIX:
                proc = self._fork(command[3:], env, local_rank)
            else:
                proc = self._spawn(command, env, local_rank)
            self._procs[local_rank] = proc
            if self._janitor is not None:
                self._janitor.watch(proc.pid)  # its session's process group id
        if self._terminal is not None:
            self._stop_resizing = self._terminal.listen(self._resized)
        self._pump.start()

    def _outputs(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(ours, the worker's) for its stdout and its stderr: pipes, or pseudo-terminals."""
        if self._terminal is None:
            return os.pipe(), os.pipe()
        out, err = self._terminal.open(), self._terminal.open()
        self._ptys += [os.dup(out[0]), os.dup(err[0])]
        return out, err

    def _spawn(self, command: list[str], env: dict[str, str], local_rank: int) -> Worker:
        (out_r, out_w), (err_r, err_w) = self._outputs()
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
            )
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        # the pump owns the descriptors from now on
        self._pump.add(out_r, local_rank, "stdout")
        self._pump.add(err_r, local_rank, "stderr")
        return proc

    def _fork(self, argv: list[str], env: dict[str, str], local_rank: int) -> Worker:
        assert self._fork_server is not None
        (out_r, out_w), (err_r, err_w) = self._outputs()
        try:
            pid = self._fork_server.start(argv, env, os.getcwd(), out_w, err_w)
        finally:
            os.close(out_w)
            os.close(err_w)
        self._pump.add(out_r, local_rank, "stdout")
        self._pump.add(err_r, local_rank, "stderr")
        return ForkedWorker(self._fork_server, pid)

    def _resized(self, size: tuple[int, int]) -> None:
        """The terminal was resized: so are the workers' (they get ``SIGWINCH``, which a
        pseudo-terminal that is nobody's controlling terminal does not send)."""
        with self._ptys_lock:
            for fd in self._ptys:
                resize(fd, size)
        self.signal_workers(signal.SIGWINCH)

    def _record_exits(self) -> set[int]:
        done = set()
        for local_rank, proc in self._procs.items():
            code = proc.poll()
            if code is None:
                continue
            done.add(local_rank)
            if code != 0 and local_rank not in self._failures:
                self._failures[local_rank] = process_failure(
                    local_rank, proc.pid, code, self.error_files[local_rank]
                )
        return done

    def _poll(self) -> RunProcsResult | None:
        done = self._record_exits()
        if len(done) < self.nprocs and not self._failures:
            return None
        self.close()
        self._record_exits()
        result = RunProcsResult(
            failures=dict(self._failures), stdouts=self.stdouts, stderrs=self.stderrs
        )
        if not result.is_failed():
            result.return_values = dict.fromkeys(range(self.nprocs))
        return result

    def pids(self) -> dict[int, int]:
        return {local_rank: proc.pid for local_rank, proc in self._procs.items()}

    def signal_workers(self, sig: int) -> None:
        """Send ``sig`` to every live worker (not to their children)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def any_running(self) -> bool:
        """Whether a worker has not exited yet (its own children aside)."""
        return any(proc.poll() is None for proc in self._procs.values())

    def _signal_groups(self, sig: signal.Signals) -> None:
        for proc in self._procs.values():
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _close(self, death_sig: signal.Signals, timeout: int = 30) -> None:
        if self._closed:
            return
        self._closed = True
        if any(proc.poll() is None for proc in self._procs.values()):
            self._signal_groups(death_sig)
            deadline = time.monotonic() + timeout
            for proc in self._procs.values():
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        # the rest of each group (a worker's own children) goes too
        self._signal_groups(signal.SIGKILL)
        for proc in self._procs.values():
            try:
                proc.wait(_DRAIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error(
                    "worker pid %d did not exit after SIGKILL (uninterruptible sleep?)", proc.pid
                )
        if self._janitor is not None:
            for proc in self._procs.values():
                self._janitor.forget(proc.pid)
        if self._procs and not self._pump.wait_drained(_DRAIN_TIMEOUT_S):
            log.warning("worker output pipes still open %.0fs after exit", _DRAIN_TIMEOUT_S)
        if self._stop_resizing is not None:
            self._stop_resizing()
        with self._ptys_lock:
            for fd in self._ptys:
                os.close(fd)
            self._ptys = []
        self._sink.close()
