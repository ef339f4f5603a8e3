"""``--nproc-per-node cpu|gpu|auto`` as torchrun counts, in a child; the fork-hazard check."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterator

import pytest
import torch

from torchx_elastic.agent import compat
from torchx_elastic.agent.config import devices
from torchx_elastic.agent.config.launch import UsageError, local_world_size
from torchx_elastic.agent.function import launch as function_launch
from torchx_elastic.agent.workers import cuda_fork
from torchx_elastic.launcher import LaunchConfig

PARENT = os.getpid()


def test_cpu_counts_the_cpus_this_process_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert devices.cpu_count() == 1
    assert local_world_size("cpu") == 1


def test_auto_without_an_accelerator_counts_the_cpus_this_process_may_run_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(compat, "accelerator_count", lambda kind: 0)
    assert local_world_size("auto") == 1


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the agent before it forks its server (pytest may run threads of its own)."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)


@pytest.mark.usefixtures("one_thread")
def test_devices_are_counted_in_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "in_bad_cuda_fork", lambda: False)
    monkeypatch.setattr(compat, "accelerator_count", lambda kind: os.getpid())
    assert devices.accelerator_count("gpu") not in (None, PARENT)


@pytest.fixture
def other_thread() -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.mark.usefixtures("other_thread")
def test_with_other_threads_devices_are_counted_in_a_fresh_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a fork would return the patched count; the fresh interpreter asks its own torch
    monkeypatch.setattr(compat, "accelerator_count", lambda kind: 99)
    assert devices.accelerator_count("gpu") != 99  # (asking here would poison later forks)
    assert devices.accelerator_count("not-a-device") is None


@pytest.mark.usefixtures("one_thread")
def test_a_child_forked_in_a_bad_state_hands_over_to_a_fresh_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compat, "in_bad_cuda_fork", lambda: os.getpid() != PARENT)
    monkeypatch.setattr(compat, "accelerator_count", lambda kind: 99)
    assert devices.accelerator_count("not-a-device") is None


@pytest.mark.usefixtures("one_thread")
def test_a_count_that_fails_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(kind: str) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(compat, "accelerator_count", boom)
    monkeypatch.setattr(compat, "in_bad_cuda_fork", lambda: False)
    with pytest.raises(UsageError) as info:
        local_world_size("gpu")
    assert (
        str(info.value)
        == "--nproc-per-node gpu: the devices could not be counted: RuntimeError: boom"
    )


def test_launch_config_fields_of_a_release_that_lacks_them() -> None:
    from torch.distributed.launcher.api import LaunchConfig as TorchLaunchConfig

    if "shutdown_timeout" in {f.name for f in dataclasses.fields(TorchLaunchConfig)}:
        assert compat.launch_config_fields(shutdown_timeout=7) == {"shutdown_timeout": 7}
    else:  # torch 2.4: torch's default is left out, another value refused
        assert compat.launch_config_fields(shutdown_timeout=None) == {}
        with pytest.raises(ValueError) as info:
            compat.launch_config_fields(shutdown_timeout=7)
        assert (
            str(info.value)
            == "shutdown_timeout=7 needs a newer torch (this one has no such option)"
        )


def test_the_fork_hazards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "cuda_built", lambda: False)
    monkeypatch.setattr(compat, "in_bad_cuda_fork", lambda: True)
    assert cuda_fork.fork_hazard() is None  # the CPU build cannot poison a fork
    monkeypatch.setattr(compat, "cuda_built", lambda: True)
    assert cuda_fork.fork_hazard() == cuda_fork.BAD_FORK
    monkeypatch.setattr(compat, "in_bad_cuda_fork", lambda: os.getpid() != PARENT)
    assert cuda_fork.fork_hazard() == cuda_fork.POISONED  # the probe child is a bad fork
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cuda_fork.fork_hazard() == cuda_fork.INITIALIZED
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(compat, "in_bad_cuda_fork", lambda: False)
    assert cuda_fork.fork_hazard() is None


def test_a_function_launch_in_a_bad_state_starts_by_spawn_saying_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(function_launch, "fork_hazard", lambda: cuda_fork.POISONED)
    with caplog.at_level(logging.WARNING, logger=function_launch.__name__):
        assert function_launch.start_fork_server("forkserver") is None
    assert [r.getMessage() for r in caplog.records] == [
        f"starting workers by spawn (start_method='forkserver'): {cuda_fork.POISONED}"
    ]


def test_our_launch_config_asks_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    def asked() -> bool:
        raise AssertionError("a device query in the caller")

    monkeypatch.setattr(torch.cuda, "is_available", asked)
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        monkeypatch.setattr(accelerator, "is_available", asked)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2)
    assert getattr(config, "numa_options", None) is None
    assert config.rdzv_configs["timeout"] == 900  # what torch's __post_init__ sets
    if hasattr(config, "numa_options"):  # torch's own asks: the query this one leaves out
        from torch.distributed.launcher.api import LaunchConfig as TorchLaunchConfig

        with pytest.raises(AssertionError, match="a device query"):
            TorchLaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2)


def test_a_counting_child_without_an_answer_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "report", lambda kind: os._exit(3))
    assert devices._report_from_fork("gpu") == {
        "error": "the counting child ended without an answer (wait status 768)"
    }
    monkeypatch.setattr(devices, "_CHILD_CODE", "pass")
    assert devices._report_from_interpreter("gpu") == {
        "error": "the counting interpreter ended without an answer (exit 0)"
    }
