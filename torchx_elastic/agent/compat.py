"""Everything the agent does that depends on the torch release, in one place.

The rest of the agent uses torch.distributed.elastic's public API only (rendezvous handlers'
``next_rendezvous`` / ``num_nodes_waiting`` / ``shutdown``, ``PContext``, ``LogsSpecs``,
``RunResult``, ...). What differs between the torch releases the package declares
(``torch>=2.4,<3``), or is not public at all, is here:

- :func:`next_round` / :func:`round_of`: ``next_rendezvous()`` returns a ``RendezvousInfo``
  (with the workers' master address in ``bootstrap_store_info``); older releases returned
  ``(store, rank, world_size)``; from 2.5 on it hosts a store shared by every round unless
  told not to.
- :func:`job_ended` / :func:`stood_by` / :func:`is_this_machine`: the "rendezvous
  closed" errors of each release (and of the agent's own rendezvous, rendezvous/rounds/);
  whether an endpoint names this machine, as torch's c10d backend decides.
- :func:`shares_agent_store`: whether torchrun's workers get the agent's store
  (``TORCHELASTIC_USE_AGENT_STORE``), from 2.5 on.
- :func:`accelerator_count`: ``torch.accelerator`` exists from 2.6 on; ``torch.xpu`` and a
  custom (PrivateUse1) backend's device module are looked up only when asked for.
- :func:`in_bad_cuda_fork` / :func:`without_device_query`: torch's private bad-fork flag;
  ``LaunchConfig.__post_init__``'s device query, which poisons the caller's forks;
  :func:`launch_config_fields` / :func:`launch_config_value`: the ``LaunchConfig`` fields 2.4 lacks.
- :func:`exit_barrier`: ``torch.distributed.elastic.utils.store.barrier`` grew parameters.
- :func:`start_file_timer`: ``FileTimerServer`` takes ``run_id`` from 2.x on.
- :func:`wrap_group_registry`: torch's registry of live process groups is private (a module
  global that ``_World.pg_map`` reads every time, the same from 2.4 to 2.15);
  :func:`keep_created_groups` is its fallback, through torch's public group creators.
- :func:`tcp_store_on_socket`: a ``TCPStore`` server on a socket the caller bound
  (``master_listen_fd``); 2.4's default (libuv) server cannot take one, its legacy one can.
- :func:`torchrun_defaults`: the defaults of the installed torchrun's flags (2.4's
  ``--master-port`` defaults to 29500, later ones to a free port for one node; 2.4 has no
  ``--signals-to-handle``), read from torch's public ``get_args_parser()``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from torch.distributed.distributed_c10d import PrefixStore, Store
from torch.distributed.elastic.rendezvous import RendezvousHandler

from torchx_elastic.contract import MASTER_KEY, SHARE_STORE_OPT_OUT_ENV

log = logging.getLogger(__name__)
T = TypeVar("T")

# torch's key prefix of the agents' exit barrier (api.py, _TERMINAL_STATE_SYNC_ID)
EXIT_BARRIER_PREFIX = "torchelastic/agent/terminal_state"


@dataclass(frozen=True)
class Round:
    """One completed rendezvous round, as this node sees it."""

    store: Store
    rank: int
    world_size: int
    master_addr: str
    master_port: int


def preload_compiler() -> None:
    """Import torch's compiler, which DistributedDataParallel imports when it is built:
    over a second per process, once in the fork server (through the public
    ``torch.compiler.reset``, which imports it)."""
    import torch.compiler

    torch.compiler.reset()  # imports the compiler; nothing to reset in a fresh process


def round_placement(result: Any) -> tuple[Store, int, int]:
    """(store, this node's rank, nodes) of what ``next_rendezvous()`` returned: a tuple in
    releases before ``RendezvousInfo``."""
    if isinstance(result, tuple):
        store, rank, world_size = result
        return store, int(rank), int(world_size)
    return result.store, int(result.rank), int(result.world_size)


def round_of(result: Any, local_addr: str | None = None) -> Round:
    """The round from what ``RendezvousHandler.next_rendezvous()`` returned."""
    if isinstance(result, tuple):  # (store, rank, world_size): releases before RendezvousInfo
        store, rank, world_size = round_placement(result)
        addr, port = _master_through_store(store, rank, local_addr)
        return Round(store, int(rank), int(world_size), addr, port)
    info = result.bootstrap_store_info
    return Round(
        result.store, int(result.rank), int(result.world_size), info.master_addr, info.master_port
    )


def _master_through_store(store: Store, rank: int, local_addr: str | None) -> tuple[str, int]:
    """Rank 0 picks a free port on its host and tells the others through the store."""
    if rank == 0:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        addr = local_addr or socket.getfqdn()
        store.set(MASTER_KEY, f"{addr} {port}")
        return addr, int(port)
    addr, port_text = store.get(MASTER_KEY).decode().split(" ")
    return addr, int(port_text)


def job_ended(err: BaseException) -> bool:
    """Whether a rendezvous error says the rendezvous was closed: the job is over (torch
    2.5 on raises ``RendezvousGracefulExitError`` for a node that waited as a spare)."""
    from torch.distributed.elastic import rendezvous

    ended = (rendezvous.RendezvousClosedError,)
    graceful = getattr(rendezvous, "RendezvousGracefulExitError", None)
    return isinstance(err, ended + ((graceful,) if graceful else ()))


def stood_by(err: BaseException) -> bool:
    """Whether the rendezvous was closed while this node waited in it as a spare (torch 2.5
    on says so; 2.4's closed-rendezvous error reads as any node's that came late)."""
    from torch.distributed.elastic import rendezvous

    graceful = getattr(rendezvous, "RendezvousGracefulExitError", None)
    if getattr(err, "standing_by", False):  # the agent's own rendezvous says so itself
        return True
    return graceful is not None and isinstance(err, graceful)


def shares_agent_store() -> bool:
    """Whether torchrun's agent of this torch gives its workers the agent's store
    (``TORCHELASTIC_USE_AGENT_STORE``): torch's c10d handler does from 2.5 on."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    return "use_agent_store" in vars(handler)


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine, as torch's c10d backend decides who hosts the
    store when ``is_host`` is not given: ``localhost``, a loopback address, this host's name
    or fully qualified name, or an address this host's name resolves to."""
    import ipaddress

    if host == "localhost" or host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if addr.is_loopback:
        return True
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return any(ipaddress.ip_address(info[4][0]) == addr for info in infos)


def quiet_cpp_warnings() -> None:
    """torch's C++ warnings are not printed by this process (the agent's own, never a
    worker's: call it after the fork server is forked). A store call to a host that has left
    prints one with 25 lines of C++ frames, several per stop; the agent says what happened
    in its own words. ``TORCH_CPP_LOG_LEVEL``, when set, still decides."""
    if os.environ.get("TORCH_CPP_LOG_LEVEL"):
        return
    import ctypes

    import torch

    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    try:  # c10's log level (0 INFO, 1 WARNING, 2 ERROR), read by every C++ warning
        level = ctypes.c_int.in_dll(ctypes.CDLL(library), "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return  # another build of torch: its warnings are printed
    level.value = max(level.value, 2)


def accelerator_count(kind: str) -> int | None:
    """Devices of ``kind`` (``gpu``, ``xpu``, ``auto`` or a custom backend's name) on this
    node; 0 when that kind has none; None when torch has no such kind."""
    import torch

    if kind == "gpu":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu.device_count() if xpu is not None and xpu.is_available() else 0
    if kind == "auto":
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            return int(accelerator.device_count()) if accelerator.is_available() else 0
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    # a custom (PrivateUse1) backend registers its device module as torch.<its name>
    module = getattr(torch, kind, None) if kind.isidentifier() else None
    if module is None or not callable(getattr(module, "device_count", None)):
        return None
    available = getattr(module, "is_available", lambda: True)
    return int(module.device_count()) if available() else 0


def cuda_built() -> bool:
    """Whether this torch is a CUDA (or ROCm) build: only those can poison a fork."""
    import torch

    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


def in_bad_cuda_fork() -> bool:
    """Whether this process was forked after its parent asked CUDA for its devices, so that
    it cannot use CUDA (``torch.cuda._is_in_bad_fork``, private)."""
    import torch

    is_bad = getattr(torch.cuda, "_is_in_bad_fork", None)
    return bool(is_bad()) if callable(is_bad) else False


_NO_DEVICE_QUERY = object()

# fields torch's LaunchConfig gained after 2.4, with torch's defaults (read where absent)
LAUNCH_CONFIG_DEFAULTS: dict[str, Any] = {
    "event_log_handler": "null",
    "signals_to_handle": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "duplicate_stdout_filters": None,
    "duplicate_stderr_filters": None,
    "virtual_local_rank": False,
    "shutdown_timeout": None,
}


def launch_config_fields(**values: Any) -> dict[str, Any]:
    """The values of fields this release's ``LaunchConfig`` has (2.4 has none of
    :data:`LAUNCH_CONFIG_DEFAULTS`); a value for a missing one must be torch's default."""
    from torch.distributed.launcher.api import LaunchConfig

    names = {f.name for f in dataclasses.fields(LaunchConfig)}
    for name, value in values.items():
        if name not in names and value != LAUNCH_CONFIG_DEFAULTS[name]:
            raise ValueError(f"{name}={value!r} needs a newer torch (this one has no such option)")
    return {name: value for name, value in values.items() if name in names}


def launch_config_value(config: Any, name: str) -> Any:
    """A field of torch's ``LaunchConfig``; torch's default where this release has none."""
    return getattr(config, name, LAUNCH_CONFIG_DEFAULTS[name])


def without_device_query(config: Any, post_init: Callable[[], None]) -> None:
    """Run torch's ``LaunchConfig.__post_init__`` without its device query: releases with
    ``numa_options`` ask ``torch.cuda`` (2.13) or ``torch.accelerator`` (2.15) whether the
    devices match ``nproc_per_node``, to pick default NUMA options (None outside Meta), which
    initializes the CUDA driver in the caller; every worker forked from the caller afterwards
    could not use CUDA. A placeholder in ``numa_options`` skips the query; None is put back."""
    if not hasattr(config, "numa_options") or config.numa_options is not None:
        post_init()
        return
    config.numa_options = _NO_DEVICE_QUERY
    try:
        post_init()
    finally:
        config.numa_options = None


def exit_barrier(store: Store, world_size: int, timeout_s: float) -> None:
    """Wait until every node of the round reached this barrier (or ``timeout_s`` passed)."""
    from torch.distributed.elastic.utils import store as store_util

    store_util.barrier(
        store=store,
        world_size=world_size,
        key_prefix=EXIT_BARRIER_PREFIX,
        barrier_timeout=timeout_s,
    )


def start_file_timer(path: str, run_id: str) -> Any:
    """torch's ``FileTimerServer`` on ``path`` (``TORCHELASTIC_ENABLE_FILE_TIMER=1``)."""
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerServer

    kwargs: dict[str, Any] = {"file_path": path, "max_interval": 0.1, "daemon": True}
    if "run_id" in inspect.signature(FileTimerServer).parameters:
        kwargs["run_id"] = run_id
    server = FileTimerServer(**kwargs)
    server.start()
    return server


def next_round(handler: RendezvousHandler, local_addr: str | None = None) -> Round:
    """The next rendezvous round, without torch's store shared by every attempt.

    torch's c10d handler (2.5 on) hosts one store on the rank-0 agent for the workers of
    every round unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; the agent hosts a fresh one
    per attempt instead (rendezvous/worker_store.py), so it sets torch's opt-out for the
    call only (torch's own handler, ``--rdzv-conf handler=torch``): the workers'
    environment does not get it.
    """
    saved = os.environ.get(SHARE_STORE_OPT_OUT_ENV)
    os.environ[SHARE_STORE_OPT_OUT_ENV] = "1"
    try:
        result = handler.next_rendezvous()
    finally:
        if saved is None:
            del os.environ[SHARE_STORE_OPT_OUT_ENV]
        else:
            os.environ[SHARE_STORE_OPT_OUT_ENV] = saved
    return round_of(result, local_addr)


@functools.cache
def torchrun_defaults() -> dict[str, Any]:
    """Flag (argparse dest) -> default of the installed torch's torchrun, without the
    ``PET_*`` variables (the agent's own parser applies those, as torchrun's does)."""
    from torch.distributed.run import get_args_parser

    saved = {key: value for key, value in os.environ.items() if key.startswith("PET_")}
    for key in saved:
        del os.environ[key]
    try:
        parser = get_args_parser()
    finally:
        os.environ.update(saved)
    defaults = vars(parser.parse_args(["script"]))  # a command line of defaults only
    return {key: value for key, value in defaults.items() if not key.startswith("training_")}


def wrap_group_registry(wrap: Callable[[dict[Any, Any]], dict[Any, Any]]) -> bool:
    """Replace torch's registry of live process groups (``_world.pg_map``: every group,
    whatever created it, is in it until destroyed) with ``wrap(registry)``; False, changing
    nothing, where this torch keeps it otherwise."""
    import torch.distributed.distributed_c10d as c10d

    registry = vars(c10d).get("_pg_map")
    read_by_world = getattr(getattr(c10d, "_world", None), "pg_map", None) is registry
    if not isinstance(registry, dict) or not read_by_world:
        return False
    setattr(c10d, "_pg_map", wrap(registry))  # noqa: B010
    return True


def keep_created_groups(kept: list[Any]) -> None:
    """Where :func:`wrap_group_registry` cannot: append to ``kept`` every process group that
    torch's public creators (``init_process_group``, ``new_group``) make from now on."""
    import torch.distributed as distributed
    import torch.distributed.distributed_c10d as c10d

    init = c10d.init_process_group
    new_group = c10d.new_group

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        if distributed.group.WORLD is not None:
            kept.append(distributed.group.WORLD)
        return result

    @functools.wraps(new_group)
    def kept_new_group(*args: Any, **kwargs: Any) -> Any:
        group = new_group(*args, **kwargs)
        if group is not None:
            kept.append(group)
        return group

    for module in (distributed, c10d):
        for name, old, new in (
            ("init_process_group", init, init_process_group),
            ("new_group", new_group, kept_new_group),
        ):
            if getattr(module, name, None) is old:
                setattr(module, name, new)


def tcp_store_on_socket(sock: socket.socket, host: str, port: int, **kwargs: Any) -> Any:
    """A ``TCPStore`` server listening on ``sock`` (bound to ``host:port``, listening)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    fd = sock.detach()
    try:
        try:
            return TCPStore(host, port, is_master=True, master_listen_fd=fd, **kwargs)
        except NotImplementedError:  # 2.4: "The libuv TCPStore backend does not support ..."
            return TCPStore(
                host, port, is_master=True, master_listen_fd=fd, use_libuv=False, **kwargs
            )
    except BaseException:
        try:
            os.close(fd)
        except OSError:
            pass
        raise


def unprefixed(store: Store) -> Store:
    """The store under a round's ``PrefixStore`` (torch's static backend prefixes the store
    it hands out with the run id)."""
    return store.underlying_store if isinstance(store, PrefixStore) else store
