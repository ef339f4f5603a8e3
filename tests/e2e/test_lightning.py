"""PyTorch Lightning's ``Trainer`` through ``torchx run -s local_cwd dist.ddp -j 2x2``.

Training code nobody here wrote, run as its users run it: strategy ``ddp`` on CPU, 2 nodes
of 2 devices. Lightning must find torchelastic's environment (``TorchElasticEnvironment``,
world size 4), its own log lines must come out as a rank's lines (not under the agent's
label), and a crash on one rank in the first attempt must end in a restart that resumes from
the checkpoint Lightning saved, to the last epoch.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import BIN, run_torchx

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 2  # 64 samples, batches of 8, 4 ranks
MAX_EPOCHS = 4
CRASH_EPOCH = 2
TRAIN = f"""
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

CKPT_DIR = os.path.join(os.getcwd(), "checkpoints")


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def on_train_start(self):
        print(f"train start epoch={{self.current_epoch}} global_step={{self.global_step}}")

    def training_step(self, batch, batch_idx):
        first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
        if first_attempt and self.global_rank == 3 and self.current_epoch == {CRASH_EPOCH} \\
                and batch_idx == 1:
            raise RuntimeError(f"crash at epoch {{self.current_epoch}} step {{self.global_step}}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = pl.Trainer(
    strategy="ddp",
    accelerator="cpu",
    devices=2,
    num_nodes=2,
    max_epochs={MAX_EPOCHS},
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[ModelCheckpoint(dirpath=CKPT_DIR, save_last=True)],
)
environment = type(trainer.strategy.cluster_environment).__name__
print(f"cluster_environment={{environment}} world_size={{trainer.world_size}}", flush=True)
last = os.path.join(CKPT_DIR, "last.ckpt")
resume = last if os.path.exists(last) else None
trainer.fit(Tiny(), DataLoader(data, batch_size=8), ckpt_path=resume)
print(f"finished epoch={{trainer.current_epoch}} global_step={{trainer.global_step}}", flush=True)
"""
# Lightning's own INFO records (its `lightning.pytorch` logger, rank 0 or every rank)
LIGHTNING_LINES = ("GPU available: False", "Initializing distributed:", "Restoring states from")


def rank_lines(output: str, rank: int, text: str) -> list[str]:
    """The lines of ``rank`` (any node) that start with ``text`` after the rank prefix."""
    pattern = re.compile(rf"\[n\d r{rank}\] {re.escape(text)}")
    return [line for line in output.splitlines() if pattern.search(line)]


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> str:
    cwd = tmp_path_factory.mktemp("lightning")
    (cwd / "train.py").write_text(TRAIN)
    args = ("dist.ddp", "-j", "2x2", "--max_retries", "1", "--script", "train.py")
    result = run_torchx("run", "-s", "local_cwd", *args, cwd=cwd, timeout_s=280)
    assert result.returncode == 0, result.stderr[-5000:]
    assert (cwd / "checkpoints" / "last.ckpt").exists()
    return result.stderr


def test_lightning_finds_torchelastic_and_the_whole_world(output: str) -> None:
    for rank in range(4):
        # once per attempt
        found = rank_lines(output, rank, "cluster_environment=TorchElasticEnvironment world_size=4")
        assert len(found) == 2, output[-5000:]


def test_lightning_log_lines_are_the_ranks_own(output: str) -> None:
    assert rank_lines(output, 0, "GPU available: False, used: False"), output[-5000:]
    for rank in range(4):
        assert rank_lines(output, rank, f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER:")
    for line in output.splitlines():
        if any(text in line for text in LIGHTNING_LINES):
            assert "[torchx-elastic" not in line, line


def test_a_crash_restarts_and_resumes_from_lightnings_checkpoint(output: str) -> None:
    crash_step = CRASH_EPOCH * STEPS_PER_EPOCH + 1
    assert re.search(
        rf"torchx-elastic: rank 3 \(node \d\) failed: RuntimeError: crash at epoch {CRASH_EPOCH}"
        rf" step {crash_step} \(File .*train\.py.*\); restarting every node: attempt 2 of 2",
        output,
    ), output[-5000:]
    assert rank_lines(output, 0, "Restoring states from the checkpoint path at "), output[-5000:]
    assert [line.rsplit("] ", 1)[1] for line in rank_lines(output, 0, "train start")] == [
        "train start epoch=0 global_step=0",
        f"train start epoch={CRASH_EPOCH} global_step={CRASH_EPOCH * STEPS_PER_EPOCH}",
    ]
    final = f"finished epoch={MAX_EPOCHS} global_step={MAX_EPOCHS * STEPS_PER_EPOCH}"
    for rank in range(4):
        assert len(rank_lines(output, rank, final)) == 1, output[-5000:]


BATCHES = 24
RICH_BAR = f"""
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import RichProgressBar
from torch.utils.data import DataLoader, TensorDataset


class Slow(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.15)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = TensorDataset(torch.randn({BATCHES * 2 * 4}, 4), torch.randn({BATCHES * 2 * 4}, 1))
trainer = pl.Trainer(
    strategy="ddp",
    accelerator="cpu",
    devices=2,
    max_epochs=1,
    logger=False,
    enable_model_summary=False,
    enable_checkpointing=False,
    callbacks=[RichProgressBar(refresh_rate=1)],
)
trainer.fit(Slow(), DataLoader(data, batch_size=4))
print("fit done", flush=True)
"""


def test_lightnings_rich_progress_bar_is_live_on_a_terminal(tmp_path: Path) -> None:
    """Lightning's ``RichProgressBar`` through ``torchx run`` on a pty: its states reach the
    terminal while the epoch runs (under a pipe Rich draws it once, at the end)."""
    from tests.e2e.test_worker_terminal import _on_a_pty

    (tmp_path / "train.py").write_text(RICH_BAR)
    argv = [str(BIN / "torchx"), "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'logs'}"]
    argv += ["dist.ddp", "-j", "1x2", "--script", "train.py"]
    code, pieces = _on_a_pty(argv, tmp_path, (40, 120))
    assert code == 0, "".join(pieces)[-5000:]
    states: set[int] = set()
    for piece in pieces:
        if "fit done" in piece:
            break
        states.update(
            int(n) for n in re.findall(rf"\[n0 r0\] Epoch 0/0 .*? (\d+)/{BATCHES}", piece)
        )
    assert len(states) >= 3, sorted(states)  # drawn once, at the end, before
