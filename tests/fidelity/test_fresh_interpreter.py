"""A worker started by the agent sees the process a fresh interpreter would: differential.

One probe (probe.py) writes what a script can observe of its process (logging, warnings,
hooks, signals, streams, multiprocessing, torch's global state, environment, ...). It runs
under torchrun (the reference) and under the agent with each start method, and through a
function launch beside torch's own ``elastic_launch``; any difference beyond the documented
ones below fails, naming the state that differs.

A forked worker is compared with a torchrun worker that first imported the modules the fork
server had imported (``PROBE_PRELOAD``): what those imports do (torch's loggers, a warning
filter of sympy's) is the same in both, and what the agent or the server did on top is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchx_elastic.contract.agent_args import FORK_SERVER, SPAWN

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROBE = Path(__file__).with_name("probe.py")
REPO = Path(__file__).resolve().parents[2]
NPROC = 2

# Differences by design, each with its reason (docs/agent.md, "How workers start").
DOCUMENTED = {
    # a single-host job's workers bind gloo to the loopback interface (rendezvous/listen.py)
    "process.env.GLOO_SOCKET_IFNAME",
    # set by the import of torch's compiler, which a fork server made before the script ran
    # (torch's default cache folder, the same whether set or not); the worker's environment
    # is its own, as torchrun gives it
    "process.env.TORCHINDUCTOR_CACHE_DIR",
    # torchrun runs ``python -u``; the agent's workers get the same through the environment
    "process.env.PYTHONUNBUFFERED",
    # what each process draws for itself: checked apart (distinct between siblings)
    "process.random_differs_from_siblings",
    "torch.initial_seed",
    "torch.first_rand",
    # the modules imported before the script (the fork server's): not state, the comparison's
    # input
    "modules",
}
PER_PROCESS = ("process.random_differs_from_siblings", "torch.initial_seed", "torch.first_rand")


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _normalised(observed: dict[str, Any]) -> dict[str, Any]:
    flat = _flat(observed)
    # filters that preloaded imports added land in import order: the set is what matters
    flat["warnings.filters"] = sorted(map(json.dumps, flat["warnings.filters"]))
    return {key: value for key, value in flat.items() if key not in DOCUMENTED}


def differences(reference: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    ref, cand = _normalised(reference), _normalised(candidate)
    return [
        f"{key}: reference {ref.get(key, '<absent>')!r}, here {cand.get(key, '<absent>')!r}"
        for key in sorted(set(ref) | set(cand))
        if ref.get(key, "<absent>") != cand.get(key, "<absent>")
    ]


def _env(out: Path, preload: list[str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "_"))}
    env.update(PROBE_OUT=str(out), PYTHONPATH=str(REPO))
    if preload:
        env["PROBE_PRELOAD"] = ",".join(preload)
    return env


def _read(out: Path, nproc: int = NPROC) -> list[dict[str, Any]]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(nproc)]


def run_workers(launcher: list[str], tmp: Path, name: str, preload: list[str] | None = None):
    out = tmp / name
    out.mkdir()
    command = [
        *launcher,
        "--standalone",
        f"--nproc-per-node={NPROC}",
        str(PROBE),
    ]
    done = subprocess.run(
        command, env=_env(out, preload), cwd=PROBE.parent, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return _read(out)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
AGENT = [sys.executable, "-m", "torchx_elastic.agent"]


def _assert_same(reference: list[dict[str, Any]], candidate: list[dict[str, Any]]) -> None:
    for rank, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        diff = differences(ref, cand)
        assert not diff, f"rank {rank} differs from a fresh interpreter:\n" + "\n".join(diff)
    for key in PER_PROCESS:
        values = [_flat(observed)[key] for observed in candidate]
        assert len(set(values)) == len(values), f"{key} is the same in sibling workers: {values}"


@pytest.fixture(scope="module")
def fork_server_workers(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_workers(AGENT, tmp_path_factory.mktemp("fork"), FORK_SERVER)


def test_a_forked_worker_sees_what_a_fresh_interpreter_that_imported_the_same_sees(
    fork_server_workers: list[dict[str, Any]], tmp_path: Path
) -> None:
    preload = fork_server_workers[0]["modules"]
    reference = run_workers(TORCHRUN, tmp_path, "torchrun", preload)
    _assert_same(reference, fork_server_workers)


def test_the_agents_logging_is_not_the_scripts(fork_server_workers) -> None:
    """The issue's first two items, named: a script's ``basicConfig`` must take effect
    (no handler on the root logger, level WARNING), and no logger of ours is left."""
    for observed in fork_server_workers:
        assert observed["logging"]["root"] == {
            "level": 30,
            "handlers": [],
            "filters": [],
            "propagate": True,
            "disabled": False,
        }
        assert not [name for name in observed["logging"]["configured"] if "torchx" in name]


def test_a_spawned_worker_sees_what_a_torchrun_worker_sees(tmp_path: Path) -> None:
    reference = run_workers(TORCHRUN, tmp_path, "torchrun")
    spawned = run_workers([*AGENT, f"--start-method={SPAWN}"], tmp_path, SPAWN)
    _assert_same(reference, spawned)


def test_the_differences_are_found(fork_server_workers) -> None:
    """The comparison itself: a changed handler, filter, stream or seed is reported."""
    changed = json.loads(json.dumps(fork_server_workers[0]))
    changed["logging"]["root"]["handlers"] = ["logging.StreamHandler"]
    changed["process"]["stdout"]["encoding"] = "UTF-8"
    changed["warnings"]["filters"].append(["ignore", None, "UserWarning", None, 0])
    found = differences(fork_server_workers[0], changed)
    assert [line.split(":")[0] for line in found] == [
        "logging.root.handlers",
        "process.stdout.encoding",
        "warnings.filters",
    ]


def launch_function(which: str, start_method: str) -> list[dict[str, Any]]:
    driver = Path(__file__).with_name("function_driver.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "_"))}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, str(driver), which, start_method],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{which} {start_method}:\n{done.stdout}\n{done.stderr}"
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE-RESULTS "))
    return json.loads(line.removeprefix("PROBE-RESULTS "))


def test_a_function_forked_from_the_caller_keeps_the_callers_state_not_the_agents() -> None:
    """A function launched with a fork start method is a fork of the caller, as under
    torch's ``elastic_launch(start_method="fork")``: the caller's logging, warnings and
    arguments, and nothing of the agent's (its loggers); torch seeds of its own."""
    ours = launch_function("ours", FORK_SERVER)
    for observed in ours:
        assert observed["process"]["argv"][1:] == ["ours", FORK_SERVER]
        assert not [name for name in observed["logging"]["configured"] if "torchx" in name]
        assert observed["logging"]["root"]["handlers"] == []
        assert observed["torch"]["cuda_bad_fork"] is False
    for key in PER_PROCESS:
        values = [_flat(observed)[key] for observed in ours]
        assert len(set(values)) == len(values), f"{key} is the same in sibling workers: {values}"


SCRIPT_WITH_LOGGING = """
import logging, warnings
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger(__name__).info("the script's own INFO line")
logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False")
warnings.warn("a warning the script gives")
"""


@pytest.mark.parametrize("start_method", [FORK_SERVER, SPAWN])
def test_a_scripts_logging_configuration_takes_effect(tmp_path: Path, start_method: str) -> None:
    """``basicConfig`` configures the root logger as under torchrun, and a library's log
    lines come out under the rank's prefix as the script's, not under the agent's label."""
    script = tmp_path / "logs.py"
    script.write_text(SCRIPT_WITH_LOGGING)
    done = subprocess.run(
        [
            *AGENT,
            "--standalone",
            "--nproc-per-node=2",
            f"--start-method={start_method}",
            str(script),
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for rank in range(NPROC):
        assert f"[n0 r{rank}] INFO __main__: the script's own INFO line" in done.stderr
        assert f"[n0 r{rank}] INFO lightning.pytorch.utilities.rank_zero: GPU available: False" in (
            done.stderr
        )
        assert f"[n0 r{rank}] {script}:6: UserWarning: a warning the script gives" in done.stderr
    assert "[torchx-elastic INFO]" not in done.stderr + done.stdout
