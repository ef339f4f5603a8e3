"""An ``AppDef`` as JSON and back: how a pipeline step carries the app it submits.

torchx has no serialised form of an ``AppDef``; this one is the dataclasses' fields, with
each mount tagged by its type. The roles' ``args`` travel apart from the JSON, one command-line
argument each (the JSON keeps how many each role has), so that a pipeline engine that
substitutes its inputs into the arguments never has to quote them inside JSON.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Sequence, Union

from torchx.specs import AppDef, BindMount, DeviceMount, Resource, RetryPolicy, Role, VolumeMount

Mount = Union[BindMount, VolumeMount, DeviceMount]
_MOUNTS: Dict[str, type] = {"bind": BindMount, "volume": VolumeMount, "device": DeviceMount}


def _mount_to_dict(mount: Mount) -> Dict[str, Any]:
    kind = next(name for name, cls in _MOUNTS.items() if isinstance(mount, cls))
    return {"type": kind, **dataclasses.asdict(mount)}


def _role_to_dict(role: Role) -> Dict[str, Any]:
    fields = {f.name: getattr(role, f.name) for f in dataclasses.fields(role)}
    fields["resource"] = dataclasses.asdict(role.resource)
    fields["retry_policy"] = role.retry_policy.value
    fields["mounts"] = [_mount_to_dict(m) for m in role.mounts]
    fields["nargs"] = len(fields.pop("args"))
    return fields


def app_to_json(app: AppDef) -> str:
    """``app`` without its roles' arguments (``all_args`` gives them), as compact JSON."""
    return json.dumps(
        {
            "name": app.name,
            "metadata": app.metadata,
            "roles": [_role_to_dict(r) for r in app.roles],
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def all_args(app: AppDef) -> List[str]:
    """The arguments of every role, one after the other."""
    return [arg for role in app.roles for arg in role.args]


def app_from_json(text: str, args: Sequence[str]) -> AppDef:
    """The app of ``app_to_json``, its roles' arguments taken in turn from ``args``."""
    data = json.loads(text)
    wanted = sum(fields["nargs"] for fields in data["roles"])
    if wanted != len(args):
        raise ValueError(f"the app's roles take {wanted} arguments, {len(args)} were given")
    roles: List[Role] = []
    rest = list(args)
    for fields in data["roles"]:
        fields = dict(fields)
        nargs = fields.pop("nargs")
        role_args, rest = rest[:nargs], rest[nargs:]
        fields["resource"] = Resource(**fields["resource"])
        fields["retry_policy"] = RetryPolicy(fields["retry_policy"])
        fields["mounts"] = [
            _MOUNTS[m.pop("type")](**m) for m in (dict(m) for m in fields["mounts"])
        ]
        roles.append(Role(**fields, args=list(role_args)))
    return AppDef(name=data["name"], roles=roles, metadata=data["metadata"])
