"""Run options of the kubernetes scheduler, declared once.

Each field of :class:`KubernetesOptions` carries its torchx type and help text; the
``runopts`` that ``torchx runopts kubernetes`` prints and the parsing of a resolved cfg
are both derived from the fields, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional

from torchx_elastic.schedulers.options import RunOptions, option

BACKEND_JOB = "job"
BACKEND_VOLCANO = "volcano"
BACKENDS = (BACKEND_JOB, BACKEND_VOLCANO)

_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
IMAGE_PULL_POLICIES = ("IfNotPresent", "Always", "Never")
DEFAULT_IMAGE_PULL_POLICY = "IfNotPresent"
DEFAULT_TTL_SECONDS_AFTER_FINISHED = 7 * 24 * 3600
# torchx's reservation for the node's own daemons (kubelet, container runtime, ...): a pod
# of a named resource asks for the whole host less this, so it fits the node the resource names
RESERVED_MILLICPU = 100
RESERVED_MEMMB = 1024


@dataclass(frozen=True)
class KubernetesOptions(RunOptions):
    """The scheduler's run options (``-cfg key=value,...`` or ``.torchxconfig``)."""

    SCHEDULER: ClassVar[str] = "kubernetes"

    namespace: str = option("default", type_=str, help="Kubernetes namespace to create the job in")
    backend: str = option(
        BACKEND_JOB,
        type_=str,
        choices=BACKENDS,
        help="job: a batch/v1 Indexed Job plus a headless Service (no operator needed);"
        " volcano: a Volcano batch.volcano.sh/v1alpha1 Job (gang scheduling)",
    )
    queue: Optional[str] = option(
        None,
        type_=str,
        help="backend=job: Kueue LocalQueue name (set as the kueue.x-k8s.io/queue-name label);"
        " backend=volcano: Volcano queue (default: 'default')",
    )
    priority_class: Optional[str] = option(None, type_=str, help="PriorityClass name of the pods")
    service_account: Optional[str] = option(
        None,
        type_=str,
        help="ServiceAccount of the pods; without one the pods get no API token mounted",
    )
    image_pull_policy: str = option(
        DEFAULT_IMAGE_PULL_POLICY,
        type_=str,
        choices=IMAGE_PULL_POLICIES,
        help="when a node pulls the image: IfNotPresent (an image already on the node runs as"
        " it is, also a :latest tag), Always (look the tag up in the registry at every pod"
        " start) or Never (only images already on the node)",
    )
    ttl_seconds_after_finished: int = option(
        DEFAULT_TTL_SECONDS_AFTER_FINISHED,
        type_=int,
        minimum=0,
        help="seconds after the job ends before Kubernetes deletes it with its pods, logs and"
        " Service (default: 7 days; 0: at once)",
    )
    reserved_millicpu: int = option(
        RESERVED_MILLICPU,
        type_=int,
        minimum=0,
        help="millicores of each pod's cpu left to the node's own daemons: the pod requests"
        " its cpu less this (as torchx)",
    )
    reserved_memmb: int = option(
        RESERVED_MEMMB,
        type_=int,
        minimum=0,
        help="MB of each pod's memory left to the node's own daemons: the pod requests its"
        " memMB less this (as torchx)",
    )
    efa_device_count: Optional[int] = option(
        None,
        type_=int,
        minimum=0,
        help="EFA devices (vpc.amazonaws.com/efa) per pod: unset: the resource's own count,"
        " 0: none, N: N (as torchx)",
    )
    validate_spec: bool = option(
        True,
        type_=bool,
        help="torchx's dry-run check before submission: here the API server always checks the"
        " whole request when it is created, and an invalid one leaves nothing behind",
    )
    network_policy: bool = option(
        True,
        type_=bool,
        help="create a NetworkPolicy (deleted with the job) that admits ingress to the job's"
        " pods only from its own pods; False leaves it out",
    )
    image_repo: Optional[str] = option(
        None,
        type_=str,
        help="registry repository the workspace image is pushed to, tagged by its content"
        " digest (e.g. registry.example/me/train); needs push access (docker login) and,"
        " for a private registry, image_pull_secrets. Required with a workspace"
        " (torchx run --workspace, default: the current directory)",
    )
    quiet: bool = option(
        False, type_=bool, help="do not print the output of the workspace image build and push"
    )
    image_pull_secrets: List[str] = option(
        [], type_=List[str], help="names of docker-registry Secrets to pull the image with"
    )
    node_selector: Dict[str, str] = option(
        {},
        type_=Dict[str, str],
        help="node labels the pods must match, as label:value pairs"
        " (e.g. node_selector=cloud.google.com/gke-accelerator:nvidia-h100-80gb)",
    )
    tolerations: List[str] = option(
        [],
        type_=List[str],
        help="taints the pods tolerate, as key[=value][:Effect]"
        " (e.g. tolerations=nvidia.com/gpu:NoSchedule)",
    )
    run_as_root: bool = option(
        False,
        type_=bool,
        help="run the container as root (uid 0) with the runtime's default capabilities, for"
        " an image that needs root; its pods then fail Pod Security 'restricted' (default: the"
        " image's non-root user, every capability dropped, seccomp RuntimeDefault, no privilege"
        " escalation: the pods pass 'restricted')",
    )
    privileged: bool = option(
        False,
        type_=bool,
        help="run the container privileged, which host device mounts (--mounts type=device)"
        " need; its pods then pass only Pod Security 'privileged'",
    )
    secret_env: Dict[str, str] = option(
        {},
        type_=Dict[str, str],
        help="env vars read from Secrets, as NAME:secret/key (e.g. HF_TOKEN:hf/token);"
        " the values never appear in the manifest",
    )
    secret_mounts: Dict[str, str] = option(
        {}, type_=Dict[str, str], help="Secrets mounted read-only as volumes, as secret:/mount/path"
    )
    configmap_mounts: Dict[str, str] = option(
        {},
        type_=Dict[str, str],
        help="ConfigMaps mounted read-only as volumes, as configmap:/mount/path",
    )

    def check(self) -> None:
        for toleration in self.tolerations:
            try:
                parse_toleration(toleration)
            except ValueError as e:
                raise self.error("tolerations", toleration, str(e)) from None
        for name, ref in self.secret_env.items():
            try:
                parse_secret_ref(name, ref)
            except ValueError as e:
                raise self.error("secret_env", f"{name}:{ref}", str(e)) from None


def parse_toleration(text: str) -> Dict[str, str]:
    """``key[=value][:Effect]`` (kubectl taint syntax) as a Kubernetes toleration."""
    key_value, _, effect = text.partition(":")
    key, has_value, value = key_value.partition("=")
    if not key or (effect and effect not in _TOLERATION_EFFECTS):
        raise ValueError(
            "expected key[=value][:Effect]"
            f" with Effect one of {', '.join(_TOLERATION_EFFECTS)}"
            " (e.g. nvidia.com/gpu:NoSchedule)"
        )
    toleration = {"key": key, "operator": "Equal" if has_value else "Exists"}
    if has_value:
        toleration["value"] = value
    if effect:
        toleration["effect"] = effect
    return toleration


def parse_secret_ref(env_name: str, ref: str) -> tuple[str, str]:
    """``secret/key`` of a ``secret_env`` entry as (secret name, key)."""
    secret, _, key = ref.partition("/")
    if not secret or not key:
        raise ValueError("expected NAME:secret/key (e.g. HF_TOKEN:hf/token)")
    return secret, key
