"""A spare on three simulated hosts (``../shared/netns/hosts.sh``): ``--nnodes 2``, h0 (the
rendezvous host) and h1 train, h2 stands by; h1 is lost, SIGKILLed or cut off, and h2 takes
its place at the next round. The job succeeds on h0 and h2, the spare never trained alone,
and nothing is left running. How soon world 2 trains again after the fault is printed
(``pytest -s``; docs/agent.md and the bench quote it), not asserted: a speed."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns.hosts import WAIT_S, Job, assert_nothing_left, assert_resumed, hosts, netns_job
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300)]

STANDING_BY = "torchx-elastic: standing by: the job has its 2 nodes (3 here)"


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    with netns_job(tmp_path) as job:
        job.nnodes = "2"
        job.steps = 100
        # the job trains until the spare took over and trained (a loaded machine may take
        # longer than any number of steps to start the spare)
        job.hold_file = tmp_path / "release"
        yield job


def spare_standing_by(job: Job) -> None:
    """h0 and h1 train, then h2 comes and stands by."""
    job.start_host("h0")
    job.start_host("h1")
    job.wait_for_step(20)
    job.start_host("h2")
    wait_until(
        lambda: STANDING_BY in job.log("h2").read_text(errors="replace"),
        what="h2 standing by",
        detail=job.shown,
    )


def assert_spare_took_the_place_of_h1(job: Job, fault_s: float) -> None:
    wait_until(
        lambda: [s for s, world, t in job.steps_seen() if world == 2 and t > fault_s and s >= 20],
        what="world 2 training after the fault",
        timeout_s=WAIT_S,
        detail=job.shown,
    )
    job.release()
    codes = job.wait(["h0", "h2"], WAIT_S)
    assert codes == {"h0": 0, "h2": 0}, job.shown()
    assert_resumed(job, fault_s)
    h0, h2 = job.log("h0").read_text(), job.log("h2").read_text()
    assert "done world 2" in h0 + h2, job.shown()
    assert " world 1 " not in h0 + h2, job.shown()  # never alone, the spare least of all
    assert re.search(
        r"torchx-elastic: round 2: h2 \(agent pid \d+\) takes the place of h1 \(agent pid \d+\),"
        r" lost; the job is back at 2 nodes",
        h0,
    ), job.shown()
    assert_nothing_left(job)


def test_a_spare_takes_the_place_of_a_killed_host(job: Job) -> None:
    spare_standing_by(job)
    kill_s = time.time()
    job.kill_host("h1")
    assert_spare_took_the_place_of_h1(job, kill_s)


def test_a_spare_takes_the_place_of_a_cut_off_host(job: Job) -> None:
    spare_standing_by(job)
    cut_s = time.time()
    hosts("cut", "h1")
    assert_spare_took_the_place_of_h1(job, cut_s)
    assert job.wait(["h1"], WAIT_S) == {"h1": 1}, job.shown()
    assert "torchx-elastic: error: this node is cut off" in job.log("h1").read_text()
