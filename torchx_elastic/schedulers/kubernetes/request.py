"""The dry-run request: the manifests to create, printed as ``kubectl apply -f`` YAML."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import yaml

from torchx_elastic.schedulers.kubernetes.names import JobNames
from torchx_elastic.schedulers.kubernetes.pods import Manifest


@dataclass
class KubernetesRequest:
    backend: str
    names: JobNames
    manifests: List[Manifest]

    def to_yaml(self) -> str:
        return yaml.safe_dump_all(self.manifests, sort_keys=False, width=100)

    def __str__(self) -> str:
        return self.to_yaml()
