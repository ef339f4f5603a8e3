"""Everything the agent does that depends on the torch release, in one place.

The rest of the agent uses torch.distributed.elastic's public API only (rendezvous handlers'
``next_rendezvous`` / ``num_nodes_waiting`` / ``shutdown``, ``PContext``, ``LogsSpecs``,
``RunResult``, ...). What differs between the torch releases the package declares
(``torch>=2.4,<3``), or is not public at all, is here:

- :func:`round_of`: ``next_rendezvous()`` returns a ``RendezvousInfo`` (with the workers'
  master address in ``bootstrap_store_info``); older releases returned ``(store, rank,
  world_size)``.
- :func:`round_members` / :func:`present_members`: who took part in the c10d rendezvous,
  for the "lost since the last round" message. No public API tells: this reads the c10d
  handler's private state, and degrades to nothing when that state changes.
- :func:`accelerator_count`: ``torch.accelerator`` exists from 2.6 on; ``torch.xpu`` and a
  custom (PrivateUse1) backend are looked up only when asked for.
- :func:`exit_barrier`: ``torch.distributed.elastic.utils.store.barrier`` grew parameters.
- :func:`start_file_timer`: ``FileTimerServer`` takes ``run_id`` from 2.x on.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from torch.distributed.distributed_c10d import Store
from torch.distributed.elastic.rendezvous import RendezvousHandler

log = logging.getLogger(__name__)

# torch's key prefix of the agents' exit barrier (api.py, _TERMINAL_STATE_SYNC_ID)
EXIT_BARRIER_PREFIX = "torchelastic/agent/terminal_state"
_MASTER_KEY = "torchx_elastic/master_addr_port"


@dataclass(frozen=True)
class Round:
    """One completed rendezvous round, as this node sees it."""

    store: Store
    rank: int
    world_size: int
    master_addr: str
    master_port: int


def round_of(result: Any, local_addr: str | None = None) -> Round:
    """The round from what ``RendezvousHandler.next_rendezvous()`` returned."""
    if isinstance(result, tuple):  # (store, rank, world_size): releases before RendezvousInfo
        store, rank, world_size = result
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
        store.set(_MASTER_KEY, f"{addr} {port}")
        return addr, int(port)
    addr, port_text = store.get(_MASTER_KEY).decode().split(" ")
    return addr, int(port_text)


def _participants(handler: RendezvousHandler) -> tuple[Any, dict[Any, int], Any]:
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    return (
        getattr(handler, "_this_node", None),
        dict(getattr(state, "participants", None) or {}),
        tuple(getattr(state, "wait_list", None) or ()),
    )


def _node_name(node: Any) -> str:
    return f"{getattr(node, 'addr', '?')} (agent pid {getattr(node, 'pid', '?')})"


def round_members(handler: RendezvousHandler) -> dict[int, str]:
    """Node rank -> "addr (agent pid N)" of the handler's last known round, if it tells."""
    _, participants, _ = _participants(handler)
    return {rank: _node_name(node) for node, rank in participants.items()}


def present_members(handler: RendezvousHandler) -> set[str]:
    """Nodes the handler knows to be in the rendezvous now (this node included)."""
    this_node, participants, wait_list = _participants(handler)
    nodes = [this_node, *participants, *wait_list]
    return {_node_name(node) for node in nodes if node is not None}


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
    custom = torch._C._get_privateuse1_backend_name()
    if kind == custom and custom != "privateuseone":
        module = getattr(torch, custom, None)
        if module is None or not module.is_available():
            return 0
        return int(module.device_count())
    return None


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


def fresh_store_per_attempt() -> None:
    """Give the workers of every attempt a new TCPStore.

    By default torch shares the agent's rendezvous TCPStore with the workers of every
    attempt, without a per-attempt key prefix: a restarted group then reads the previous
    attempt's keys (gloo's peer addresses, init barriers) and connects to dead peers
    ("Gloo connectFullMesh failed ... Connection refused") or hangs in init_process_group.
    torch's own opt-out makes rank 0 host a fresh store on a new port for each attempt.
    """
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
