"""The fork server imports torch's compiler only for a script that may reach it."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchx_elastic.agent.workers.preload import needs_compiler

SHORT_JOB = """\
import os
import torch
import torch.distributed as dist
from torch.nn import Linear

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_a_job_without_ddp_skips_the_compiler(tmp_path: Path) -> None:
    assert needs_compiler([write(tmp_path, "job.py", SHORT_JOB), "--flag"]) is False


@pytest.mark.parametrize(
    "line",
    [
        "from torch.nn.parallel import DistributedDataParallel",
        "model = torch.compile(model)",
        "import torch.distributed.fsdp",
        "from torch.distributed import fsdp",
        "import numpy",  # a package from elsewhere: unknown
        "importlib.import_module(name)",
    ],
)
def test_a_job_that_may_reach_them_gets_everything(tmp_path: Path, line: str) -> None:
    assert needs_compiler([write(tmp_path, "job.py", SHORT_JOB + line + "\n")]) is True


def test_local_modules_are_read_too(tmp_path: Path) -> None:
    write(tmp_path, "helpers/__init__.py", "")
    write(tmp_path, "helpers/model.py", "from torch.nn.parallel import DistributedDataParallel\n")
    script = write(tmp_path, "job.py", SHORT_JOB + "from helpers import model\n")
    assert needs_compiler([script]) is True
    write(tmp_path, "helpers/model.py", "import torch\n")
    assert needs_compiler([script]) is False


@pytest.mark.parametrize("args", [["-m", "train"], ["--exec", "prog"], [], ["missing.py"]])
def test_what_cannot_be_read_gets_everything(args: list[str]) -> None:
    assert needs_compiler(args) is True


def test_a_file_that_does_not_parse_gets_everything(tmp_path: Path) -> None:
    assert needs_compiler([write(tmp_path, "job.py", "def (:\n")]) is True


def test_words_in_comments_and_docstrings_do_not_count(tmp_path: Path) -> None:
    text = '"""Runs as exec would; no DDP, no compile."""\n# not torch.compile either\n'
    assert needs_compiler([write(tmp_path, "job.py", text + SHORT_JOB)]) is False
