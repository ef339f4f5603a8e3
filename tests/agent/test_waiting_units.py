"""The line a node prints while its first round waits, as the node count grows."""

from __future__ import annotations

from torchx_elastic.agent.config.cli import build_parser
from torchx_elastic.agent.config.launch import AgentConfig, config_from_args
from torchx_elastic.agent.rendezvous.roll_call import NodeEntry
from torchx_elastic.agent.rendezvous.waiting import progress_line, waiting_line


def config(nnodes: str) -> AgentConfig:
    argv = ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29500"]
    return config_from_args(build_parser().parse_args([*argv, "--rdzv-id", "job", "train.py"]))


def peers(count: int) -> list[NodeEntry]:
    return [NodeEntry(f"n{i}", 7, "job", f"n{i}", "1:3", 1, 0, "c10d") for i in range(count)]


def test_a_fixed_size_job_counts_what_is_missing() -> None:
    assert waiting_line(peers(1), config("2"), True, "10:00:00") == (
        "waiting for nodes: 1 of 2 joined; here: n0 (pid 7); missing: 1 node; hosting the"
        " rendezvous at n0:29500, run id 'job'; gives up at 10:00:00 (join timeout 600s)"
    )
    assert progress_line(peers(1), config("2")) == (
        "[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node"
    )


def test_an_elastic_job_below_its_minimum_and_in_its_last_call() -> None:
    assert progress_line(peers(1), config("2:3")) == (
        "[job progress] waiting for nodes: 1 of 2 joined (starts with 2, takes up to 3);"
        " missing: 1 node"
    )
    # its minimum is here: the round waits its last call for more (never "2 of 1 joined")
    assert waiting_line(peers(2), config("1:3"), False, "10:00:00") == (
        "waiting for nodes: 2 joined, enough to start (takes up to 3; the round closes after"
        " its last call); here: n0 (pid 7), n1 (pid 7); missing: none; rendezvous at"
        " n0:29500, run id 'job'; gives up at 10:00:00 (join timeout 600s)"
    )
