"""The resource of one node, from the components' ``cpu``/``gpu``/``memMB``/``h``."""

from typing import Optional

import torchx.specs as specs

from torchx_elastic.components.errors import ComponentArgumentError


def node_resource(cpu: float, gpu: int, memMB: int, h: Optional[str]) -> specs.Resource:
    """torchx's ``specs.resource``, keeping a fraction of a CPU (``--cpu 0.5``).

    torchx types ``Resource.cpu`` as a whole number, but Kubernetes (``500m``) and Docker
    (``--cpus 0.5``) take fractions; a whole number stays an ``int``, as torchx makes it.
    """
    if cpu < 0:
        raise ComponentArgumentError(f"--cpu {cpu}: expected a number of CPUs >= 0, e.g. 2 or 0.5")
    resource = specs.resource(cpu=1, gpu=gpu, memMB=memMB, h=h)
    if h is None:
        resource.cpu = int(cpu) if float(cpu).is_integer() else cpu
    return resource
