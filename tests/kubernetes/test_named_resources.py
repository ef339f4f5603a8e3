"""Pods of named resources are sized as torchx sizes them, so they fit the named node.

For every named resource torchx registers (each family: AWS p3/p3dn/p4d/p4de/p5/g4dn/g5/
trn1/m5/t3 and the generic cpu.*/gpu.*), our pod's limits and requests are torchx's own
``role_to_pod`` ones: limits the whole host, requests less torchx's reservation for the
node's daemons (100 millicpu, 1024 MB), in torchx's units.
"""

from __future__ import annotations

import re
from typing import Dict, List

import pytest
from torchx import specs
from torchx.schedulers.kubernetes_scheduler import role_to_pod
from torchx.specs.named_resources_aws import NAMED_RESOURCES as AWS
from torchx.specs.named_resources_generic import NAMED_RESOURCES as GENERIC

from torchx_elastic.components.dist import spmd
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions
from torchx_elastic.schedulers.kubernetes.pods import resources
from torchx_elastic.schedulers.kubernetes.scheduler import build_request

NAMED = sorted({*AWS, *GENERIC})


def _family(name: str) -> str:
    return re.sub(r"[._](\d*x?large|medium|small|micro|nano|metal|xlarge|\d+xlarge)$", "", name)


FAMILIES: Dict[str, List[str]] = {}
for _name in NAMED:
    FAMILIES.setdefault(_family(_name), []).append(_name)


def _torchx_resources(resource: specs.Resource) -> Dict[str, Dict[str, str]]:
    role = specs.Role(name="r", image="i", entrypoint="e", resource=resource)
    pod = role_to_pod("p", role, None)
    requirements = pod.spec.containers[0].resources
    return {"limits": requirements.limits, "requests": requirements.requests}


def test_every_family_is_covered() -> None:
    assert {"aws_p4d", "aws_p5", "aws_g5", "aws_trn1", "aws_t3", "cpu", "gpu"} <= set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_named_resources_of_a_family_are_sized_as_torchx(family: str) -> None:
    for name in FAMILIES[family]:
        resource = specs.resource(h=name)
        ours = resources(resource)
        assert ours == _torchx_resources(resource), name
        # the pod asks for less than the host has: it fits the node the resource names
        cpu_m = int(resource.cpu * 1000)
        assert ours["requests"]["cpu"] == f"{max(cpu_m - 100, 0)}m"
        assert ours["requests"]["memory"] == f"{max(resource.memMB - 1024, 0)}M"


def test_spmd_on_p4d_fits_a_p4d_node() -> None:
    app = spmd(script="train.py", j="2", h="aws_p4d.24xlarge")
    job = build_request(app, KubernetesOptions(), "bcdfghjk").manifests[0]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"] == {
        "limits": {
            "cpu": "96000m",
            "memory": "1132416M",
            "nvidia.com/gpu": "8",
            "vpc.amazonaws.com/efa": "4",
        },
        "requests": {"cpu": "95900m", "memory": "1131392M", "nvidia.com/gpu": "8"},
    }
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}


def test_reservation_and_efa_are_run_options() -> None:
    resource = specs.resource(h="aws_p4d.24xlarge")
    opts = KubernetesOptions.runopts()
    options = KubernetesOptions.from_cfg(
        opts.resolve(opts.cfg_from_str("reserved_millicpu=0,reserved_memmb=0,efa_device_count=0"))
    )
    sized = resources(
        resource, options.reserved_millicpu, options.reserved_memmb, options.efa_device_count
    )
    assert sized["requests"] == {"cpu": "96000m", "memory": "1132416M", "nvidia.com/gpu": "8"}
    assert "vpc.amazonaws.com/efa" not in sized["limits"]
    assert resources(resource, efa_device_count=2)["limits"]["vpc.amazonaws.com/efa"] == "2"


def test_small_resources_never_request_below_zero() -> None:
    sized = resources(specs.Resource(cpu=0.05, gpu=0, memMB=512))
    assert sized["requests"] == {"cpu": "0m", "memory": "0M"}
    assert sized["limits"] == {"cpu": "50m", "memory": "512M"}
