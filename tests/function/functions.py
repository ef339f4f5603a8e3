"""Worker functions for the function-launch tests (importable by spawned workers)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any


def all_reduce_rank(scale: float) -> dict[str, float]:
    """Each rank adds rank + 1 over gloo; returns its rank and the sum times ``scale``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"sum on rank {dist.get_rank()}: {value.item()}", flush=True)
    result = {"rank": float(dist.get_rank()), "sum": value.item() * scale}
    dist.destroy_process_group()
    return result


def raise_on_rank_1(text: str) -> str:
    if os.environ["RANK"] == "1":
        raise ValueError(f"bad batch {text}")
    time.sleep(300)  # stopped by the agent once rank 1 failed
    return text


def crash_in_first_attempt(crash_rank: int) -> tuple[int, int]:
    """Rank ``crash_rank`` dies in attempt 0; every rank returns (rank, attempt)."""
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    if attempt == 0 and dist.get_rank() == crash_rank:
        os._exit(13)
    dist.barrier()
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank, attempt


def return_a_lock() -> Any:
    return threading.Lock()


def exit_early() -> None:
    raise SystemExit(0)


def write_pid_and_sleep(directory: str) -> None:
    Path(directory, f"worker.{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    time.sleep(300)


def report_progress(steps: int) -> int:
    from torchx_elastic import progress

    for step in range(steps):
        time.sleep(0.05)
        progress(step + 1, steps)
    return steps
