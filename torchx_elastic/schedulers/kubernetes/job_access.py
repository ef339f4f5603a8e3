"""Who may take part in a job: its Secret and its NetworkPolicy (docs/security.md).

- a Secret of the job's own holds the secret its agents sign the rendezvous with; every pod
  reads it into ``TORCHX_ELASTIC_RDZV_SECRET`` (``secretKeyRef``: the value is never in the
  manifest). The dry run shows a placeholder; :func:`with_fresh_secret` fills it when the job
  is submitted;
- a NetworkPolicy admits ingress to the job's pods only from the job's own pods (on by
  default; ``network_policy=False`` leaves it out). Where the cluster's network plugin does
  not enforce NetworkPolicies it is inert.

Both are created right after the Job, owned by it: they go when the Job goes.
"""

from __future__ import annotations

import copy
from typing import Dict, List

from torchx_elastic.contract import SECRET_ENV, new_secret
from torchx_elastic.schedulers.compat import torchx_kubernetes
from torchx_elastic.schedulers.kubernetes.names import JobNames
from torchx_elastic.schedulers.kubernetes.pods import Manifest

SECRET_KEY = "rdzv-secret"
SECRET_PLACEHOLDER = "(a fresh secret, made when the job is submitted)"


def secret_env(names: JobNames) -> Manifest:
    """The pods' variable that holds the job's secret."""
    return {
        "name": SECRET_ENV,
        "valueFrom": {"secretKeyRef": {"name": names.job, "key": SECRET_KEY}},
    }


def manifests(names: JobNames, labels: Dict[str, str], network_policy: bool) -> List[Manifest]:
    """The job's Secret and (unless turned off) its NetworkPolicy."""
    metadata = {"name": names.job, "namespace": names.namespace, "labels": dict(labels)}
    found: List[Manifest] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": copy.deepcopy(metadata),
            "type": "Opaque",
            "stringData": {SECRET_KEY: SECRET_PLACEHOLDER},
        }
    ]
    if network_policy:
        job_pods: Manifest = {"matchLabels": {torchx_kubernetes.LABEL_UNIQUE_NAME: names.job}}
        found.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": copy.deepcopy(metadata),
                "spec": {
                    "podSelector": job_pods,
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"podSelector": copy.deepcopy(job_pods)}]}],
                },
            }
        )
    return found


def with_fresh_secret(manifest: Manifest) -> Manifest:
    """``manifest`` as submitted: the job's Secret gets a new secret; others are unchanged."""
    if manifest.get("kind") != "Secret" or manifest.get("stringData") != {
        SECRET_KEY: SECRET_PLACEHOLDER
    }:
        return manifest
    return {**manifest, "stringData": {SECRET_KEY: new_secret()}}
