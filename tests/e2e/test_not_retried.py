"""Failures that end the job at once (real agents): a class named in ``--no-retry-on``, an exit
code listed there, ``torchx_elastic.NotRetried`` and exit code 78 are not restarted, however
many restarts are left, on one node and on every node of a job through ``torchx run``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_agent, run_torchx
from torchx_elastic.contract import EVENTS_FILE

pytestmark = pytest.mark.slow

# rank 1 fails at once, rank 0 would run for a minute: only the agent's stop ends it
FAILS = """\
import os, sys, time
{prelude}
if os.environ["RANK"] == "1":
    {fail}
time.sleep(60)
"""
MYPKG = "class ConfigError(Exception):\n    pass\n"
RECORD = (
    "from torch.distributed.elastic.multiprocessing.errors import record\n"
    "import mypkg\n"
    "@record\n"
    "def main():\n"
    "    raise mypkg.ConfigError('no lr given')\n"
)


@pytest.mark.parametrize(
    ("prelude", "fail", "flags", "message"),
    [
        pytest.param(
            "class ConfigProblem(ValueError):\n    pass",
            "raise ConfigProblem('bad lr')",
            ["--no-retry-on", "KeyError,ValueError"],
            "not retried: ConfigProblem: bad lr",
            id="a-subclass-of-a-named-class",
        ),
        pytest.param(
            "import argparse",
            "argparse.ArgumentParser().parse_args(['--lr'])",
            ["--no-retry-on", "2"],
            "not retried: exit code 2",
            id="argparse-usage-error-listed",
        ),
        pytest.param(
            "import torchx_elastic",
            "raise torchx_elastic.NotRetried('the data set is missing')",
            [],
            "not retried: NotRetried: the data set is missing",
            id="NotRetried",
        ),
        pytest.param("", "sys.exit(78)", [], "not retried: exit code 78", id="exit-78"),
        pytest.param(
            RECORD,
            "main()",
            ["--no-retry-on", "mypkg.ConfigError"],
            "not retried: ConfigError: no lr given",
            id="error-file-of-record",
        ),  # fmt: skip
    ],
)
def test_a_failure_not_retried_ends_the_job_with_restarts_left(
    tmp_path: Path, prelude: str, fail: str, flags: list[str], message: str
) -> None:
    (tmp_path / "mypkg.py").write_text(MYPKG)
    (tmp_path / "train.py").write_text(FAILS.format(prelude=prelude, fail=fail))
    logs = tmp_path / "logs"
    result = run_agent(
        "--nproc-per-node", "2", "--max-restarts", "3", "--log-dir", str(logs), *flags,
        "train.py", cwd=tmp_path,
    )  # fmt: skip
    out = result.stderr
    assert result.returncode == 1, out[-3000:]
    assert (
        f"torchx-elastic: rank 1 (node 0) failed first: {message}; the job ends without a"
        " restart (3 restarts left unused)\n"
    ) in out, out[-3000:]
    assert "restarting every node" not in out
    assert out.endswith(f"torchx-elastic: job failed: rank 1 (node 0) failed first: {message}\n")
    events = [json.loads(line) for line in (logs / EVENTS_FILE).read_text().splitlines()]
    assert [e["event"] for e in events].count("rendezvous") == 1
    assert not [e for e in events if e["event"] == "restart"]


def test_the_same_failure_is_retried_when_not_named(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILS.format(prelude="", fail="raise ValueError('bad lr')"))
    result = run_agent(
        "--nproc-per-node", "2", "--max-restarts", "1", "--no-retry-on", "KeyError,3",
        "train.py", cwd=tmp_path,
    )  # fmt: skip
    assert "restarting every node: attempt 2 of 2" in result.stderr, result.stderr[-3000:]
    assert result.stderr.endswith("failed first: ValueError: bad lr\n")


# every rank meets in a collective first; rank 1 then fails, rank 0 waits for it in the next
TWO_NODES = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
if dist.get_rank() == 1:
    raise ValueError("bad lr")
dist.all_reduce(torch.ones(1))
"""


def test_every_node_of_the_job_ends_without_a_restart(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TWO_NODES)
    result = run_torchx(
        "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1", "--max_retries", "2",
        "--no_retry_on", "ValueError", "--script", "train.py", cwd=tmp_path,
    )  # fmt: skip
    out = result.stderr
    assert result.returncode != 0, out[-4000:]
    assert "restarting every node" not in out, out[-4000:]
    # said once for the job, by the node of rank 1 (which replica that is, the rendezvous says)
    said = re.findall(
        r"train/\d torchx-elastic: rank 1 \(node 1\) failed first: not retried: ValueError:"
        r" bad lr; the job ends without a restart \(2 restarts left unused\)\n",
        out,
    )
    assert len(said) == 1, out[-4000:]
    job_line = "torchx-elastic: job failed: rank 1 (node 1) failed first: not retried: ValueError"
    assert sorted(re.findall(rf"train/(\d) {re.escape(job_line)}: bad lr\n", out)) == ["0", "1"]
    assert "message: 'rank 1 (node 1) failed first: not retried: ValueError: bad lr'" in out
