"""Run options of the kubernetes scheduler, declared once.

Each field of :class:`KubernetesOptions` carries its torchx type and help text; the
``runopts`` that ``torchx runopts kubernetes`` prints and the parsing of a resolved cfg
are both derived from the fields, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Type

from torchx.specs import CfgVal, runopts

BACKEND_JOB = "job"
BACKEND_VOLCANO = "volcano"
BACKENDS = (BACKEND_JOB, BACKEND_VOLCANO)

_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _opt(type_: Type[CfgVal], help_text: str) -> Dict[str, Any]:
    return {"torchx_type": type_, "help": help_text}


@dataclass(frozen=True)
class KubernetesOptions:
    """The scheduler's run options (``-cfg key=value,...`` or ``.torchxconfig``)."""

    namespace: str = field(
        default="default", metadata=_opt(str, "Kubernetes namespace to create the job in")
    )
    backend: str = field(
        default=BACKEND_JOB,
        metadata=_opt(
            str,
            "job: a batch/v1 Indexed Job plus a headless Service (no operator needed);"
            " volcano: a Volcano batch.volcano.sh/v1alpha1 Job (gang scheduling)",
        ),
    )
    queue: Optional[str] = field(
        default=None,
        metadata=_opt(
            str,
            "backend=job: Kueue LocalQueue name (set as the kueue.x-k8s.io/queue-name label);"
            " backend=volcano: Volcano queue (default: 'default')",
        ),
    )
    priority_class: Optional[str] = field(
        default=None, metadata=_opt(str, "PriorityClass name of the pods")
    )
    service_account: Optional[str] = field(
        default=None,
        metadata=_opt(
            str,
            "ServiceAccount of the pods; without one the pods get no API token mounted",
        ),
    )
    image_pull_secrets: List[str] = field(
        default_factory=list,
        metadata=_opt(List[str], "names of docker-registry Secrets to pull the image with"),
    )
    node_selector: Dict[str, str] = field(
        default_factory=dict,
        metadata=_opt(
            Dict[str, str],
            "node labels the pods must match, as label:value pairs"
            " (e.g. node_selector=cloud.google.com/gke-accelerator:nvidia-h100-80gb)",
        ),
    )
    tolerations: List[str] = field(
        default_factory=list,
        metadata=_opt(
            List[str],
            "taints the pods tolerate, as key[=value][:Effect]"
            " (e.g. tolerations=nvidia.com/gpu:NoSchedule)",
        ),
    )
    secret_env: Dict[str, str] = field(
        default_factory=dict,
        metadata=_opt(
            Dict[str, str],
            "env vars read from Secrets, as NAME:secret/key (e.g. HF_TOKEN:hf/token);"
            " the values never appear in the manifest",
        ),
    )
    secret_mounts: Dict[str, str] = field(
        default_factory=dict,
        metadata=_opt(
            Dict[str, str], "Secrets mounted read-only as volumes, as secret:/mount/path"
        ),
    )
    configmap_mounts: Dict[str, str] = field(
        default_factory=dict,
        metadata=_opt(
            Dict[str, str], "ConfigMaps mounted read-only as volumes, as configmap:/mount/path"
        ),
    )

    image_repo: Optional[str] = field(
        default=None,
        metadata=_opt(
            str,
            "registry repository the workspace image is pushed to, tagged by its content"
            " digest (e.g. registry.example/me/train); needs push access (docker login) and,"
            " for a private registry, image_pull_secrets. Required with a workspace"
            " (torchx run --workspace, default: the current directory)",
        ),
    )
    quiet: bool = field(
        default=False,
        metadata=_opt(bool, "do not print the output of the workspace image build and push"),
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"invalid kubernetes run option backend={self.backend!r};"
                f" valid values: {', '.join(BACKENDS)} (default: {BACKEND_JOB})"
            )
        for toleration in self.tolerations:
            parse_toleration(toleration)
        for name, ref in self.secret_env.items():
            parse_secret_ref(name, ref)

    @classmethod
    def runopts(cls) -> runopts:
        opts = runopts()
        for f in dataclasses.fields(cls):
            default: CfgVal = None
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            opts.add(
                f.name, type_=f.metadata["torchx_type"], help=f.metadata["help"], default=default
            )
        return opts

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, CfgVal]) -> KubernetesOptions:
        """The options of a cfg resolved by torchx (unknown keys are ignored, like torchx)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in cfg.items() if k in names and v is not None}
        return cls(**values)


def parse_toleration(text: str) -> Dict[str, str]:
    """``key[=value][:Effect]`` (kubectl taint syntax) as a Kubernetes toleration."""
    key_value, _, effect = text.partition(":")
    key, has_value, value = key_value.partition("=")
    if not key or (effect and effect not in _TOLERATION_EFFECTS):
        raise ValueError(
            f"invalid toleration {text!r}: expected key[=value][:Effect]"
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
        raise ValueError(
            f"invalid secret_env entry {env_name}:{ref}: expected NAME:secret/key"
            " (e.g. HF_TOKEN:hf/token)"
        )
    return secret, key
