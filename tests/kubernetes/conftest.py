from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.kubernetes.fake_api import FakeCluster
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler

SUFFIX = "bcdfghjk"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    """A running fake cluster; KUBECONFIG points at it (current namespace: default)."""
    cluster = FakeCluster()
    cluster.start()
    monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield cluster
    cluster.stop()


@pytest.fixture
def scheduler(fake: FakeCluster) -> KubernetesScheduler:
    """A scheduler talking to the fake cluster through the kubeconfig, without sleeping."""
    return KubernetesScheduler("test", suffix=lambda: SUFFIX, sleep=lambda seconds: None)
