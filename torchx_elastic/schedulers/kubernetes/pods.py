"""The pod template of one role: container, resources, volumes, env, placement.

Plain dicts in the Kubernetes API's own (camelCase) form: they print as the YAML that
``kubectl apply -f`` takes and are sent to the API server as they are.

Kubernetes expands ``$(VAR)`` in a container's command, args and env values and turns
``$$`` into ``$``; every ``$`` that reaches this module is meant literally (torchx's
macros are already applied), so it is escaped as ``$$``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from torchx.specs import BindMount, DeviceMount, Resource, Role, VolumeMount

from torchx_elastic.schedulers.kubernetes.options import (
    RESERVED_MEMMB,
    RESERVED_MILLICPU,
    KubernetesOptions,
    parse_secret_ref,
    parse_toleration,
)
from torchx_elastic.schedulers.kubernetes.security import device_mount_refused, security_context
from torchx_elastic.schedulers.names import dns_label

Manifest = Dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
EFA_DEVICE = "vpc.amazonaws.com/efa"
SHM_VOLUME = "dshm"
ANNOTATION_ISTIO_SIDECAR = "sidecar.istio.io/inject"
# torchx's capability for an instance type, honoured as a node selector
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
# capabilities of a named resource that place its pods
CAPABILITY_NODE_SELECTOR = "torchx-elastic/node-selector"
CAPABILITY_TOLERATIONS = "torchx-elastic/tolerations"
_PORT_NAME_MAX = 15


def k8s_literal(text: str) -> str:
    """``text`` as a command, arg or env value that Kubernetes passes on unchanged."""
    return text.replace("$", "$$")


def resources(
    resource: Resource,
    reserved_millicpu: int = RESERVED_MILLICPU,
    reserved_memmb: int = RESERVED_MEMMB,
    efa_device_count: Optional[int] = None,
) -> Manifest:
    """Limits and requests as torchx's kubernetes scheduler sizes them.

    Limits are the resource (cpu in millicores, memory in ``M`` as torchx writes memMB);
    requests, what the scheduler places the pod by, are the limits less the reservation
    for the node's own daemons. GPUs are requested as they are limited; other devices
    (e.g. EFA) are limits, which Kubernetes also requests; ``efa_device_count`` replaces
    the resource's EFA count (0: none).
    """
    limits: Dict[str, str] = {}
    requests: Dict[str, str] = {}
    if resource.cpu > 0:
        millicpu = int(resource.cpu * 1000)
        limits["cpu"] = f"{millicpu}m"
        requests["cpu"] = f"{max(millicpu - reserved_millicpu, 0)}m"
    if resource.memMB > 0:
        limits["memory"] = f"{int(resource.memMB)}M"
        requests["memory"] = f"{max(int(resource.memMB) - reserved_memmb, 0)}M"
    if resource.gpu > 0:
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(resource.gpu)
    for device, count in resource.devices.items():
        limits[device] = str(count)
    if efa_device_count == 0:
        limits.pop(EFA_DEVICE, None)
    elif efa_device_count is not None:
        limits[EFA_DEVICE] = str(efa_device_count)
    return {"limits": limits, "requests": requests}


def _placement(resource: Resource, options: KubernetesOptions) -> Manifest:
    node_selector: Dict[str, str] = {}
    if LABEL_INSTANCE_TYPE in resource.capabilities:
        node_selector[LABEL_INSTANCE_TYPE] = str(resource.capabilities[LABEL_INSTANCE_TYPE])
    node_selector.update(resource.capabilities.get(CAPABILITY_NODE_SELECTOR, {}))
    node_selector.update(options.node_selector)
    toleration_texts = [
        *resource.capabilities.get(CAPABILITY_TOLERATIONS, []),
        *options.tolerations,
    ]
    placement: Manifest = {}
    if node_selector:
        placement["nodeSelector"] = node_selector
    if toleration_texts:
        placement["tolerations"] = [parse_toleration(t) for t in toleration_texts]
    return placement


class _Volumes:
    """Volumes and the container's mounts of them, named in order."""

    def __init__(self) -> None:
        self.volumes: List[Manifest] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]
        self.mounts: List[Manifest] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
        self.devices: List[str] = []

    def add(self, name: str, source: Manifest, mount_path: str, read_only: bool) -> None:
        self.volumes.append({"name": name, **source})
        mount: Manifest = {"name": name, "mountPath": mount_path}
        if read_only:
            mount["readOnly"] = True
        self.mounts.append(mount)

    def add_role_mounts(self, role: Role) -> None:
        for i, mount in enumerate(role.mounts):
            name = f"mount-{i}"
            if isinstance(mount, BindMount):
                self.add(
                    name, {"hostPath": {"path": mount.src_path}}, mount.dst_path, mount.read_only
                )
            elif isinstance(mount, VolumeMount):
                claim: Manifest = {"claimName": mount.src}
                if mount.read_only:
                    claim["readOnly"] = True
                self.add(name, {"persistentVolumeClaim": claim}, mount.dst_path, mount.read_only)
            elif isinstance(mount, DeviceMount):
                # Kubernetes has no --device: a host device needs a privileged container
                read_only = "w" not in mount.permissions and "m" not in mount.permissions
                self.add(name, {"hostPath": {"path": mount.src_path}}, mount.dst_path, read_only)
                self.devices.append(mount.src_path)
            else:
                raise TypeError(f"unsupported mount type for kubernetes: {mount!r}")

    def add_option_mounts(self, options: KubernetesOptions) -> None:
        for i, (secret, path) in enumerate(options.secret_mounts.items()):
            self.add(f"secret-{i}", {"secret": {"secretName": secret}}, path, read_only=True)
        for i, (config_map, path) in enumerate(options.configmap_mounts.items()):
            source = {"configMap": {"name": config_map}}
            self.add(f"configmap-{i}", source, path, read_only=True)


def _env(role: Role, options: KubernetesOptions, first: List[Manifest]) -> List[Manifest]:
    env = list(first)
    env += [{"name": name, "value": value} for name, value in role.env.items()]
    for name, ref in options.secret_env.items():
        secret, key = parse_secret_ref(name, ref)
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def pod_template(
    role: Role,
    options: KubernetesOptions,
    labels: Dict[str, str],
    first_env: Optional[List[Manifest]] = None,
    placeholders: Optional[Dict[str, str]] = None,
) -> Manifest:
    """The pod template of ``role``, whose macros are applied.

    ``first_env`` comes before the role's env so that its variables can be referenced as
    ``$(NAME)``; ``placeholders`` maps markers left by the macro step to such references
    (inserted after escaping, so they stay live).
    """
    volumes = _Volumes()
    volumes.add_role_mounts(role)
    volumes.add_option_mounts(options)
    if volumes.devices and not options.privileged:
        raise device_mount_refused(volumes.devices[0])

    def literal(text: str) -> str:
        text = k8s_literal(text)
        for marker, reference in (placeholders or {}).items():
            text = text.replace(marker, reference)
        return text

    env = _env(role, options, first_env or [])
    for var in env:
        if "value" in var:
            var["value"] = literal(var["value"])
    container: Manifest = {
        "name": dns_label(role.name, fallback="worker"),
        "image": role.image,
        "imagePullPolicy": options.image_pull_policy,
        "command": [k8s_literal(role.entrypoint)],
        "args": [literal(arg) for arg in role.args],
        "env": env,
        "ports": [
            {"name": dns_label(name, _PORT_NAME_MAX, fallback="port"), "containerPort": port}
            for name, port in role.port_map.items()
        ],
        "resources": resources(
            role.resource,
            options.reserved_millicpu,
            options.reserved_memmb,
            options.efa_device_count,
        ),
        "volumeMounts": volumes.mounts,
        # a failed container's last log lines (the agent's root-cause report) are kept in
        # the pod's status, where `torchx status` reads them
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security_context(options),
    }
    spec: Manifest = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes.volumes,
        **_placement(role.resource, options),
    }
    if options.service_account:
        spec["serviceAccountName"] = options.service_account
    else:
        # a training pod needs no API credentials unless it is given an account
        spec["automountServiceAccountToken"] = False
    if options.priority_class:
        spec["priorityClassName"] = options.priority_class
    if options.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in options.image_pull_secrets]
    return {
        "metadata": {
            "labels": labels,
            # the istio sidecar would keep a finished pod running
            "annotations": {ANNOTATION_ISTIO_SIDECAR: "false"},
        },
        "spec": spec,
    }
