"""Fork server: import torch once, then fork every worker from that warm process.

Most of a worker's start-up on a small machine is importing torch again; N workers on few
cores pay it N times over. The agent forks this server from itself right after importing
torch (before any thread exists), and each worker of each attempt is a ``fork()`` of it that
runs the script through :mod:`bootstrap`: the same ``__main__``, ``sys.argv``, ``__file__``
and ``sys.path[0]`` as ``python SCRIPT``, with the worker's own environment, working
directory, stdout/stderr pipes (passed over the socket), fresh standard streams, random
seeds and session.

Protocol over a ``SOCK_SEQPACKET`` socket pair (one message per packet, JSON):
agent -> server ``{"argv", "env", "cwd"}`` with the stdout and stderr descriptors attached;
server -> agent ``{"started": pid}`` in order, and ``{"exited": pid, "status": code}`` as
children end (``code`` is negative for a signal, as ``subprocess``).

Standard library only here; :func:`serve` imports what workers need beyond what the agent
imported (torch's compiler only when :mod:`preload` says the script may use it) while the
agent rendezvouses, then freezes
the garbage collector's view of everything so far (``gc.freeze``): a worker's collections
and its end (``worker_end``) never walk, nor copy on write, the pages of those objects.
"""

from __future__ import annotations

import array
import gc
import json
import os
import selectors
import signal
import socket
import sys
import threading
import weakref
from collections.abc import Collection
from typing import Any, NoReturn

from torchx_elastic.agent.workers import bootstrap, fresh_state, worker_end
from torchx_elastic.contract import AGENT_PID_ENV

_MAX_MESSAGE_BYTES = 1 << 20
# what a DDP training script imports, directly or when it builds DistributedDataParallel
# (which pulls in torch's compiler too: compat.preload_compiler, when preload.needs_compiler)
PRELOAD_MODULES = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data")


def _recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(_MAX_MESSAGE_BYTES, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return (json.loads(data) if data else None), list(fds)


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class WorkerExit(SystemExit):
    """A forked worker of a function launch is done: unwinds to the launch, which leaves
    without running the caller's code (``function/launch.py``)."""


def _run_child(
    request: dict[str, Any],
    stdout_fd: int,
    stderr_fd: int,
    server_fds: list[int],
    script_workers: bool,
) -> NoReturn:
    """In the forked child: become the worker, run it, end it: a script's worker through
    :mod:`worker_end`, a function's by raising :class:`WorkerExit`."""
    try:
        os.setsid()
        _fresh_signals()
        for fd in server_fds:  # the server's socket, selector and wake-up pipe
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        fresh_state.as_fresh_interpreter(script_workers)
        sys.argv = [""]
    except BaseException:  # noqa: BLE001 - the worker could not be set up
        import traceback

        traceback.print_exc()
        os._exit(1)
    if not script_workers:
        raise WorkerExit(_run_bootstrap(request["argv"]))
    worker_end.keep_process_groups()
    worker_end.finish(_run_bootstrap(request["argv"]))


def _fresh_signals() -> None:
    """The dispositions a new interpreter starts with (the server ignores SIGINT and SIGTERM
    and catches SIGCHLD; ignored signals would survive an exec too), and no Python handler
    inherited from the agent (its stop signals'): a worker blocked in C++ code (a collective
    with a vanished peer) runs a Python handler only when that call returns, so SIGTERM
    would not end it until the SIGKILL that follows the shutdown timeout."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if callable(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _run_bootstrap(argv: list[str]) -> int:
    """``bootstrap.main`` as the worker's whole life; the exit code as Python would give it."""
    sys.argv = ["bootstrap", *argv]
    try:
        bootstrap.main()
        code = 0
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    return code


def close_inherited_fds(keep: Collection[int]) -> None:
    """Close what the agent inherited beyond the standard streams: a spawned worker
    (``close_fds``) never sees those descriptors, so a forked one must not either."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the descriptor of the listing itself


def share_with_forks() -> None:
    """What exists now is shared with every process forked from here: the garbage collector
    never walks it again (each walk copies the pages on write), and a forked worker's exit
    leaves its finalizers alone."""
    keep_finalizers_here()
    gc.freeze()


def keep_finalizers_here() -> None:
    """The ``weakref.finalize`` callbacks registered so far clean up after what this
    process made (torch's operator libraries, ...): a worker's exit runs its own atexit
    handlers, not these (they would rewrite most of the pages it shares with the server,
    tens of MiB a worker, for a process about to end; a forked child of ``multiprocessing``
    runs none either)."""
    for obj in gc.get_objects():
        if type(obj) is weakref.finalize:  # type(): some objects warn when asked for theirs
            obj.atexit = False


def serve(
    sock: socket.socket,
    script_workers: bool = True,
    compiler: bool = True,
    keep_fds: tuple[int, ...] = (),
) -> None:
    if script_workers:  # a function's workers may use what the caller opened
        close_inherited_fds(keep=(sock.fileno(), *keep_fds))
    for name in PRELOAD_MODULES:
        __import__(name)
    if compiler:
        from torchx_elastic.agent import compat

        compat.preload_compiler()
    share_with_forks()
    bootstrap.die_with_agent()  # the server is the agent's child: go with it
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # the agent decides what workers get and when the server ends (it closes the server's
    # socket, or the server dies with it): a SIGTERM to every process of the node (Slurm
    # stopping a step) must not end the server first, whose workers would then be SIGKILLed
    # (their parent-death signal) in the middle of their own SIGTERM handlers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "request")
    selector.register(wakeup_r, selectors.EVENT_READ, "child")
    my_pid = os.getpid()
    try:
        _serve_requests(sock, selector, wakeup_r, wakeup_w, keep_fds, script_workers)
    except ConnectionError:
        if os.getpid() != my_pid:
            raise  # a worker's own
        # the agent was killed while a message of the server's was unread (its socket
        # resets then, instead of ending): gone, as at the end of its stream


def _serve_requests(
    sock: socket.socket,
    selector: selectors.DefaultSelector,
    wakeup_r: int,
    wakeup_w: int,
    keep_fds: tuple[int, ...],
    script_workers: bool,
) -> None:
    """Fork a worker for each of the agent's requests and tell it the exits, until the
    agent's end of the socket is gone."""
    my_pid = os.getpid()
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                os.read(wakeup_r, 4096)
                _reap(sock)
                continue
            request, fds = _recv(sock)
            if request is None:
                return  # the agent is gone
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.environ[AGENT_PID_ENV] = str(my_pid)
                request["env"][AGENT_PID_ENV] = str(my_pid)
                server_fds = [sock.detach(), selector.fileno(), wakeup_r, wakeup_w, *keep_fds]
                _run_child(request, fds[0], fds[1], server_fds, script_workers)
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"started": pid}).encode())
        _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exited": pid, "status": _exit_code(status)}).encode())


class ForkServer:
    """The agent's side: fork the server from the agent, ask it for workers, learn exits.

    Created right after the agent imported torch and before it started any thread, so the
    server is a copy of a process that imported torch once (no second import) and holds no
    lock another thread could own. ``allow_threads``: fork even while other threads run, as
    multiprocessing's fork does (a function launch with ``start_method="fork"``).
    ``script_workers``: workers run scripts and end through :mod:`worker_end`; False (a
    function launch): a worker raises :class:`WorkerExit` into the caller's frames.
    ``compiler``: the server imports torch's compiler too before it forks (what
    ``preload.needs_compiler`` says of the script). ``keep_fds``: descriptors of the
    agent's that the server keeps (the copy of the agent's console: the server's own
    errors), never its workers.
    """

    def __init__(
        self,
        allow_threads: bool = False,
        script_workers: bool = True,
        compiler: bool = True,
        keep_fds: tuple[int, ...] = (),
    ) -> None:
        if threading.active_count() > 1 and not allow_threads:
            raise RuntimeError("the fork server must be created before any thread starts")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        agent_pid = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        self._pid = os.fork()
        if self._pid == 0:  # the server; a function's forked workers raise WorkerExit
            try:
                ours.close()
                os.setsid()  # a Ctrl-C in the terminal is for the agent
                os.environ[AGENT_PID_ENV] = str(agent_pid)
                serve(theirs, script_workers, compiler, keep_fds)
            except WorkerExit:
                raise
            except BaseException:  # noqa: BLE001 - the server failed: say so, leave
                import traceback

                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._started: list[int] = []
        self._exit_codes: dict[int, int] = {}
        self._closed = False
        self._reader = threading.Thread(
            target=self._read, name="torchx-elastic-forkserver", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                message, _ = _recv(self._sock)
            except OSError:
                message = None
            with self._changed:
                if message is None:
                    self._closed = True
                elif "started" in message:
                    self._started.append(int(message["started"]))
                else:
                    self._exit_codes[int(message["exited"])] = int(message["status"])
                self._changed.notify_all()
            if message is None:
                return

    def start(
        self, argv: list[str], env: dict[str, str], cwd: str, stdout_fd: int, stderr_fd: int
    ) -> int:
        """Fork a worker running ``bootstrap ARGV``; its pid."""
        payload = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        with self._lock:
            self._sock.sendmsg(
                [payload],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [stdout_fd, stderr_fd]))],
            )
            with self._changed:
                self._changed.wait_for(lambda: self._started or self._closed)
                if not self._started:
                    raise RuntimeError("the fork server exited")
                return self._started.pop(0)

    def exit_code(self, pid: int) -> int | None:
        """The worker's exit code once it ended (SIGKILL's if the server died first)."""
        with self._changed:
            return self._code(pid)

    def wait(self, pid: int, timeout_s: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exit_codes or self._closed, timeout_s)
            return self._code(pid)

    def exits(self) -> int:
        """How many workers' exits the server has reported so far."""
        with self._changed:
            return len(self._exit_codes)

    def wait_for_exits(self, more_than: int, timeout_s: float) -> None:
        """Until more than ``more_than`` exits are known, or ``timeout_s`` passed (at once
        if the server is gone: its workers' codes are known)."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self._exit_codes) > more_than or self._closed, timeout_s
            )

    def _code(self, pid: int) -> int | None:
        if pid in self._exit_codes:
            return self._exit_codes[pid]
        return -int(signal.SIGKILL) if self._closed else None

    def close(self) -> None:
        """Stop the server at once: it holds no state worth a clean exit."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        except OSError:
            pass
        self._sock.close()
        try:
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
