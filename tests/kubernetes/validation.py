"""Strict validation of generated manifests: core objects with ``kubernetes-validate``
against the oldest and newest Kubernetes it ships, Volcano Jobs against Volcano's CRD."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Dict, List

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions, latest_version

from torchx_elastic.schedulers.kubernetes.manifests import for_server

REPO = Path(__file__).resolve().parents[2]
VOLCANO_CRD = REPO.parent / "shared/schemas/volcano/batch.volcano.sh_jobs.yaml"
OLDEST_VERSION = min(all_versions(), key=lambda v: tuple(int(x) for x in v.split(".")))
NEWEST_VERSION = latest_version()
VERSIONS = (OLDEST_VERSION, NEWEST_VERSION)

Obj = Dict[str, Any]


def validate_core(manifest: Obj) -> None:
    """Raises ``kubernetes_validate.ValidationError`` unless valid for every version in
    VERSIONS, unknown fields included; a Job's pod template is also checked as a Pod."""
    for version in VERSIONS:
        # what is sent to a server of that version (Jobs differ before 1.29)
        major, minor = (int(x) for x in version.split(".")[:2])
        kubernetes_validate.validate(for_server(manifest, (major, minor)), version, strict=True)
    if manifest["kind"] == "Job" and manifest["apiVersion"] == "batch/v1":
        validate_core(pod_of(manifest["spec"]["template"], manifest["metadata"]["name"]))


def pod_of(template: Obj, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": f"{name}-0"},
        "spec": template["spec"],
    }


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@functools.lru_cache(maxsize=1)
def volcano_validator() -> Any:
    """A validator of Volcano's v1alpha1 Job schema, made strict; built once."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is large
    crd = yaml.load(VOLCANO_CRD.read_text(), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    validator_class = jsonschema.validators.validator_for(schema)
    return validator_class(schema)


def validate_volcano(manifest: Obj) -> None:
    """Raises ``jsonschema.ValidationError`` unless valid against Volcano's CRD, strictly;
    each task's pod template is also checked as a core Pod."""
    volcano_validator().validate(manifest)
    for task in manifest["spec"]["tasks"]:
        validate_core(pod_of(task["template"], f"{manifest['metadata']['name']}-{task['name']}"))


def validate_all(manifests: List[Obj]) -> None:
    for manifest in manifests:
        if manifest["apiVersion"].startswith("batch.volcano.sh/"):
            validate_volcano(copy.deepcopy(manifest))
        else:
            validate_core(manifest)
