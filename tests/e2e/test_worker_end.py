"""A worker's end (real runs): what a normal exit guarantees still happens, and freeing a
DDP model after ``destroy_process_group`` never deadlocks (``worker_end.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_agent
from torchx_elastic.contract.agent_args import FORK_SERVER

pytestmark = pytest.mark.slow

BIG_BYTES = 10_000_001

UNCLOSED_FILES = f"""
import atexit, os, sys
out = os.environ["OUT_DIR"]
rank = os.environ["RANK"]
# a big file written through Python's buffers and never closed nor flushed
big = open(os.path.join(out, "big." + rank), "w")
big.write("x" * {BIG_BYTES})
binary = open(os.path.join(out, "bin." + rank), "wb", buffering=1 << 20)
binary.write(b"y" * 4097)
def bye():
    with open(os.path.join(out, "atexit." + rank), "w") as f:
        f.write("ran")
atexit.register(bye)
sys.stdout.write("last words without a newline")
"""


# spawn is the interpreter's own finalization, which does not promise this: its unclosed
# binary file came out empty in a run here
@pytest.mark.parametrize("method", [FORK_SERVER])
def test_unclosed_files_keep_every_byte_and_atexit_runs(tmp_path: Path, method: str) -> None:
    (tmp_path / "end.py").write_text(UNCLOSED_FILES)
    result = run_agent(
        "--nproc-per-node",
        "2",
        "--start-method",
        method,
        "end.py",
        cwd=tmp_path,
        env={"OUT_DIR": str(tmp_path), "PYTHONUNBUFFERED": ""},
    )
    assert result.returncode == 0, result.stderr
    for rank in ("0", "1"):
        assert (tmp_path / f"big.{rank}").stat().st_size == BIG_BYTES
        assert (tmp_path / f"bin.{rank}").stat().st_size == 4097
        assert (tmp_path / f"atexit.{rank}").read_text() == "ran"
    assert "[n0 r0] last words without a newline" in result.stdout
    assert "[n0 r1] last words without a newline" in result.stdout


# Every round trains a DDP model, destroys the process group and drops the model at once:
# the reducer's reference to the group is then the last one unless the worker keeps its own
# (torch's gloo destructor with the GIL held vs a gloo thread that needs it: the exit hang).
DDP_ROUNDS = """
import json, os
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

def one_round(store, round_):
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{round_}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return total.item()  # the model dies here, right after the last collective

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1,
                      int(os.environ["WORLD_SIZE"]), os.environ["RANK"] == "0")
totals = [one_round(store, r) for r in range(int(os.environ["ROUNDS"]))]
with open(os.path.join(os.environ["OUT_DIR"], "totals." + os.environ["RANK"]), "w") as f:
    json.dump(totals, f)
"""


@pytest.mark.parametrize("method", [FORK_SERVER])
def test_dropping_a_ddp_model_after_destroy_never_hangs(tmp_path: Path, method: str) -> None:
    (tmp_path / "rounds.py").write_text(DDP_ROUNDS)
    rounds = 25
    result = run_agent(
        "--nproc-per-node",
        "4",
        "--start-method",
        method,
        "rounds.py",
        cwd=tmp_path,
        env={"OUT_DIR": str(tmp_path), "ROUNDS": str(rounds), "OMP_NUM_THREADS": "1"},
        timeout_s=240,
    )
    assert result.returncode == 0, result.stderr
    for rank in range(4):
        assert json.loads((tmp_path / f"totals.{rank}").read_text()) == [4.0] * rounds
