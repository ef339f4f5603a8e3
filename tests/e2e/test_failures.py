"""Failures read right (real agents): whatever a worker leaves in its error file, the agent
reports; one root cause per job; every restart said once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_agent, run_torchx
from torchx_elastic.contract import EVENTS_FILE, RANK_ERROR_FILE, SUMMARY_PREFIX

pytestmark = pytest.mark.slow

# torch's @record: a victim killed while it writes its error file leaves it empty
RECORD_SCRIPT = """\
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    if dist.get_rank() == 2:
        raise ValueError("rank 2 gives up")
    dist.all_reduce(value)  # the other ranks wait here until they lose their peer


if __name__ == "__main__":
    main()
"""
RAISE_LINE = 12

# the race made deterministic: rank 3 has created its error file, not written it, when the
# agent stops it after rank 2's failure
EMPTY_ERROR_FILE_SCRIPT = """\
import os, time
rank = int(os.environ["RANK"])
path = os.environ["TORCHELASTIC_ERROR_FILE"]
if rank == 3:
    open(path, "w").close()
if rank == 2:
    while not os.path.exists(path.replace("rank_2", "rank_3")):
        time.sleep(0.05)
    raise ValueError("rank 2 gives up")
time.sleep(120)
"""


def _log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def test_a_rank_stopped_before_it_wrote_its_error_file_never_crashes_the_agent(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(EMPTY_ERROR_FILE_SCRIPT)
    result = run_agent(
        "--nproc-per-node", "4", "--log-dir", str(_log_dir(tmp_path)), "train.py", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "JSONDecodeError" not in result.stderr and "Failed to parse" not in result.stderr
    assert "Root cause\n" in result.stderr
    assert re.search(
        r"  rank 2 \(node 0, local rank 2, pid \d+\) failed first: exit code 1\n", result.stderr
    ), result.stderr[-3000:]
    assert "    ValueError: rank 2 gives up\n" in result.stderr
    assert result.stderr.endswith(
        "torchx-elastic: job failed: rank 2 (node 0) failed first: ValueError: rank 2 gives up\n"
    )
    error_file = _log_dir(tmp_path) / "attempt_0" / "rank_3" / RANK_ERROR_FILE
    assert (
        "  rank 3 (node 0, local rank 3): signal SIGTERM, stopped by SIGTERM after another rank"
        " failed; error file unreadable (empty)\n" in result.stderr
    ), result.stderr[-3000:]
    summary = json.loads((_log_dir(tmp_path) / f"{SUMMARY_PREFIX}0.json").read_text())
    (victim,) = [v for v in summary["victims"] if v["rank"] == 3]
    assert victim["error_problem"] == "empty" and victim["error_path"] == str(error_file)


# rank 1 exits at once; its child writes a partial error file after it died (before the
# agent reports: the agent waits for the worker's output pipes, which the child holds)
FORKING_SCRIPT = """\
import os, sys, time
if os.environ["RANK"] == "1":
    worker = os.getpid()
    if os.fork() == 0:
        os.setsid()  # out of the worker's process group: the agent's stop does not reach it
        while os.getppid() == worker:  # until the worker has exited (its child is adopted)
            time.sleep(0.01)
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as file:
            file.write('{"message": {"message": "half')
        os._exit(0)
    sys.exit(3)
time.sleep(120)
"""


def test_a_worker_that_forks_and_exits_never_crashes_the_agent(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FORKING_SCRIPT)
    result = run_agent(
        "--nproc-per-node", "2", "--log-dir", str(_log_dir(tmp_path)), "train.py", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(
        r"  rank 1 \(node 0, local rank 1, pid \d+\) failed first: exit code 3\n", result.stderr
    ), result.stderr[-3000:]
    assert "  error file unreadable (not JSON (Unterminated string" in result.stderr
    assert result.stderr.endswith(
        "torchx-elastic: job failed: rank 1 (node 0) failed first: exit code 3\n"
    )


def test_the_record_case_restarted_again_and_again_always_names_rank_2(tmp_path: Path) -> None:
    """The real case, once per attempt: 12 attempts of a 1-in-7 race in one agent run."""
    (tmp_path / "train.py").write_text(RECORD_SCRIPT)
    restarts = 11
    result = run_agent(
        "--nproc-per-node",
        "4",
        "--max-restarts",
        str(restarts),
        "--log-dir",
        str(_log_dir(tmp_path)),
        "train.py",
        cwd=tmp_path,
        timeout_s=400,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "JSONDecodeError" not in result.stderr and "Failed to parse" not in result.stderr
    where = f'File "{tmp_path / "train.py"}", line {RAISE_LINE}'
    for attempt in range(1, restarts + 1):
        left = restarts - attempt
        line = (
            f"torchx-elastic: rank 2 (node 0) failed: ValueError: rank 2 gives up ({where});"
            f" restarting every node: attempt {attempt + 1} of {restarts + 1}"
            f" ({left} restart{'' if left == 1 else 's'} left),"
            f" rendezvous round {attempt + 1} next\n"
        )
        assert line in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("Root cause\n") == 1
    assert re.search(
        r"  rank 2 \(node 0, local rank 2, pid \d+\) failed first: exit code 1\n", result.stderr
    )
    assert f"      {where}, in main\n" in result.stderr  # the path as python shows it
    assert "    ValueError: rank 2 gives up\n" in result.stderr
    events = [
        json.loads(line) for line in (_log_dir(tmp_path) / EVENTS_FILE).read_text().splitlines()
    ]
    restarts_logged = [e for e in events if e["event"] == "restart"]
    assert len(restarts_logged) == restarts
    assert (
        restarts_logged[0]
        | {
            "failed_rank": 2,
            "failed_node": 0,
            "failure": f"ValueError: rank 2 gives up ({where})",
            "max_restarts": restarts,
            "restarts_left": restarts - 1,
            "next_round": 2,
            "reason": "failure",
            "attempt": 1,
        }
        == restarts_logged[0]
    )
    assert [e["round"] for e in events if e["event"] == "rendezvous"] == list(
        range(1, restarts + 2)
    )


def test_two_nodes_one_root_cause_and_the_same_status(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RECORD_SCRIPT)
    result = run_torchx(
        "run",
        "-s",
        "local_cwd",
        "dist.ddp",
        "-j",
        "2x2",
        "--max_retries",
        "1",
        "--script",
        "train.py",
        cwd=tmp_path,
    )
    out = result.stderr
    assert result.returncode != 0
    # which replica is node 1 is the rendezvous' choice (it may change between rounds)
    root_replica = re.findall(r"train/(\d) Root cause\n", out)
    assert len(root_replica) == 1, out[-4000:]  # one root-cause section for the job
    owner, other = root_replica[0], "1" if root_replica[0] == "0" else "0"
    # the restart, said once for the job: by the node whose rank failed first
    restart = re.findall(r"train/\d torchx-elastic: rank 2 \(node 1\) failed: (.*)\n", out)
    assert restart == [
        f'ValueError: rank 2 gives up (File "{tmp_path / "train.py"}", line {RAISE_LINE});'
        " restarting every node: attempt 2 of 2 (0 restarts left), rendezvous round 2 next"
    ], out[-4000:]
    assert re.search(rf"train/{owner}   rank 2 \(node 1, local rank 0, pid \d+\) failed first", out)
    assert f"train/{other} Job failed\n" in out
    assert f"train/{other}   rank 2 (node 1) failed first: ValueError: rank 2 gives up\n" in out
    assert f'train/{other}   at File "{tmp_path / "train.py"}", line {RAISE_LINE}\n' in out
    assert f"train/{other}   its traceback and logs are in node 1's report\n" in out
    # its ranks failed with the lost peer, or were still running when node 1 ended the job
    assert (
        re.search(
            rf"train/{other}   rank [01] \(node 0, local rank [01]\): .*(lost a peer|stopped)", out
        )
        or f"train/{other}   this node's ranks were still running: they were stopped\n" in out
    )
    # torchx's status of the job: the same rank and message
    assert "message: 'rank 2 (node 1) failed first: ValueError: rank 2 gives up'" in out, out[
        -2000:
    ]
    # every node's last word, what torchx status on docker reads from any replica's log
    job_line = (
        "torchx-elastic: job failed: rank 2 (node 1) failed first: ValueError: rank 2 gives up"
    )
    assert sorted(re.findall(r"train/(\d) " + re.escape(job_line) + "\n", out)) == ["0", "1"]
    assert out.count("Setting OMP_NUM_THREADS environment variable") == 1
