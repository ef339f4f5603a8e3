"""The dry-run request: the manifests to create, printed as ``kubectl apply -f`` YAML."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import yaml

from torchx_elastic.schedulers.credentials import MASK, looks_like_credential
from torchx_elastic.schedulers.kubernetes.names import JobNames
from torchx_elastic.schedulers.kubernetes.pods import Manifest
from torchx_elastic.schedulers.workspace import WorkspaceBuild


@dataclass
class KubernetesRequest:
    backend: str
    names: JobNames
    manifests: List[Manifest]
    # the workspace images built (when not built yet) and pushed before the job is created
    workspace_builds: Tuple[WorkspaceBuild, ...] = ()
    images_to_push: Dict[str, Tuple[str, str]] = field(default_factory=dict)

    def to_yaml(self) -> str:
        return yaml.safe_dump_all(self.manifests, sort_keys=False, width=100)

    def masked_yaml(self) -> str:
        """The YAML with the values of credential-looking env vars masked."""
        manifests = copy.deepcopy(self.manifests)
        for manifest in manifests:
            for template in _pod_templates(manifest):
                for container in template.get("spec", {}).get("containers", []):
                    for var in container.get("env", []):
                        if "value" in var and looks_like_credential(var["name"]):
                            var["value"] = MASK
        return yaml.safe_dump_all(manifests, sort_keys=False, width=100)

    def header(self) -> str:
        """YAML comments naming the images built and pushed first (empty without any)."""
        lines = []
        for build in self.workspace_builds:
            action = "on the engine already" if build.built else "to build"
            lines.append(
                f"# workspace image {build.image} ({action}): {build.workspace}"
                f" ({build.context_files} files, {build.dockerfile}) on {build.base_image}"
            )
        for local, (repo, tag) in self.images_to_push.items():
            source = "" if local == f"{repo}:{tag}" else f" (local {local})"
            lines.append(f"# push {repo}:{tag}{source} before creating the job")
        return "".join(line + "\n" for line in lines)

    def __str__(self) -> str:
        return self.header() + self.masked_yaml()


def _pod_templates(manifest: Manifest) -> List[Manifest]:
    spec = manifest.get("spec") or {}
    if "template" in spec:  # batch/v1 Job
        return [spec["template"]]
    return [task.get("template") or {} for task in spec.get("tasks") or []]  # Volcano Job
