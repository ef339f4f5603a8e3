"""Request building: golden YAML per backend, strict schema validation, names, escaping."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import kubernetes_validate
import pytest
import yaml
from torchx import specs

from tests.kubernetes.validation import (
    NEWEST_VERSION,
    OLDEST_VERSION,
    validate_all,
    validate_core,
    validate_volcano,
)
from torchx_elastic.components.dist import ddp
from torchx_elastic.contract import ERROR_FILE_ENV, RANK0_ENV
from torchx_elastic.schedulers.errors import UserError
from torchx_elastic.schedulers.kubernetes.manifests import for_server
from torchx_elastic.schedulers.kubernetes.names import JobNames, new_suffix, parse_app_id
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler, build_request
from torchx_elastic.schedulers.names import DNS_LABEL_MAX, dns_label, is_dns_label

GOLDEN = Path(__file__).parent / "golden"
SUFFIX = "bcdfghjk"
Obj = Dict[str, Any]


def _dryrun_yaml(app: specs.AppDef, **cfg: Any) -> str:
    scheduler = KubernetesScheduler("test", suffix=lambda: SUFFIX)
    return str(scheduler.submit_dryrun(app, cfg).request)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; regenerate with UPDATE_GOLDEN=1 on purpose"


def _full_options() -> Obj:
    return {
        "namespace": "team-a",
        "queue": "team-a-queue",
        "priority_class": "high",
        "service_account": "trainer",
        "image_pull_secrets": ["registry"],
        "node_selector": {"cloud.example.com/accelerator": "h100"},
        "tolerations": ["nvidia.com/gpu:NoSchedule", "dedicated=ml"],
        "secret_env": {"HF_TOKEN": "hf/token"},
        "secret_mounts": {"ssh-keys": "/root/.ssh"},
        "configmap_mounts": {"train-config": "/etc/train"},
    }


def _ddp(**kwargs: Any) -> specs.AppDef:
    return ddp(script="main.py", j="2:4x8", h="gpu.small", **kwargs)


def test_golden_job_backend_2_4x8() -> None:
    _check_golden("job_2-4x8.yaml", _dryrun_yaml(_ddp()))


def test_golden_job_backend_all_options() -> None:
    app = _ddp(
        max_retries=2,
        env={"WANDB_MODE": "offline"},
        mounts=[
            *("type=bind", "src=/data", "dst=/data", "readonly"),
            *("type=volume", "src=ckpt", "dst=/ckpt"),
        ],
    )
    _check_golden("job_all_options.yaml", _dryrun_yaml(app, **_full_options()))


def test_golden_volcano_backend_2_4x8() -> None:
    _check_golden("volcano_2-4x8.yaml", _dryrun_yaml(_ddp(), backend="volcano"))


@pytest.mark.parametrize("name", ["job_2-4x8.yaml", "job_all_options.yaml", "volcano_2-4x8.yaml"])
def test_golden_files_pass_strict_validation(name: str) -> None:
    validate_all(list(yaml.safe_load_all((GOLDEN / name).read_text())))


def test_dryrun_2_4x8_names_pod_0_by_its_dns_name() -> None:
    job, service, _, _ = yaml.safe_load_all(_dryrun_yaml(_ddp()))
    name = f"main-{SUFFIX}"
    template = job["spec"]["template"]
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    assert env[RANK0_ENV]["value"] == f"{name}-0.{name}.default.svc"
    # the Job controller names pod i's host <job>-<i>; the subdomain is the Service
    assert template["spec"]["subdomain"] == service["metadata"]["name"] == name
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    args = template["spec"]["containers"][0]["args"]
    # Kubernetes turns $$ into $: the agent gets ${TORCHX_RANK0_HOST:-localhost}:29500
    assert args[args.index("--rdzv-endpoint") + 1] == f"$${{{RANK0_ENV}:-localhost}}:29500"
    assert args[args.index("--nnodes") + 1] == "2:4"


@pytest.mark.parametrize("backend", ["job", "volcano"])
@pytest.mark.parametrize(
    "app",
    [
        pytest.param(ddp(script="main.py", j="1x2"), id="single-node"),
        pytest.param(ddp(script="main.py", j="2x4", cpu=1, memMB=512, gpu=0), id="cpu-2x4"),
        pytest.param(
            ddp(
                script="t.py",
                j="3x1",
                mounts=["type=device", "src=/dev/fuse"],
                max_retries=1,
                name="Exp/My_Run.v2",
            ),
            id="device-retries",
        ),
    ],
)
def test_every_manifest_validates_strictly(backend: str, app: specs.AppDef) -> None:
    privileged = any(isinstance(m, specs.DeviceMount) for m in app.roles[0].mounts)
    options = KubernetesOptions(backend=backend, privileged=privileged, **_full_options())
    request = build_request(app, options, SUFFIX)
    validate_all(request.manifests)


def test_validation_rejects_an_unknown_field() -> None:
    """The strict check can fail: a misspelt field is refused, oldest and newest alike."""
    job = build_request(_ddp(), KubernetesOptions(), SUFFIX).manifests[0]
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        validate_core(job)
    assert OLDEST_VERSION != NEWEST_VERSION


def test_volcano_validation_rejects_an_unknown_field() -> None:
    job = build_request(_ddp(), KubernetesOptions(backend="volcano"), SUFFIX).manifests[0]
    job["spec"]["tasks"][0]["replica"] = 1
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        validate_volcano(job)


def _container(manifest: Obj) -> Obj:
    container: Obj = manifest["spec"]["template"]["spec"]["containers"][0]
    return container


def test_user_arguments_and_env_reach_the_process_unchanged() -> None:
    """torchx restores ``$$`` to ``$``; Kubernetes would then expand ``$(X)`` and eat one
    ``$`` of ``$$``, so every literal ``$`` is doubled in the manifest."""
    app = ddp("--msg", "$(HOME) $$ ${x}", script="main.py", j="2x1", env={"A": "$(B)"})
    job = build_request(app, KubernetesOptions(), SUFFIX).manifests[0]
    assert _container(job)["args"][-2:] == ["--msg", "$$(HOME) $$$$ $${x}"]
    env = {e["name"]: e for e in _container(job)["env"]}
    assert env["A"]["value"] == "$$(B)"


def test_replica_id_macro_is_each_pods_completion_index() -> None:
    role = specs.Role(
        name="echo", image="alpine", entrypoint="echo", args=[f"replica={specs.macros.replica_id}"]
    )
    app = specs.AppDef(name="echo", roles=[role])
    job = build_request(app, KubernetesOptions(), SUFFIX).manifests[0]
    container = _container(job)
    assert container["args"] == ["replica=$(TORCHX_REPLICA_ID)"]
    assert container["env"][0] == {
        "name": "TORCHX_REPLICA_ID",
        "valueFrom": {
            "fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            }
        },
    }


RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "seccompProfile": {"type": "RuntimeDefault"},
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


def test_pods_pass_pod_security_restricted_and_get_no_token_by_default() -> None:
    job = build_request(_ddp(), KubernetesOptions(), SUFFIX).manifests[0]
    spec = job["spec"]["template"]["spec"]
    assert _container(job)["securityContext"] == RESTRICTED
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]


def test_run_as_root_is_an_explicit_option() -> None:
    job = build_request(_ddp(), KubernetesOptions(run_as_root=True), SUFFIX).manifests[0]
    assert _container(job)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 0,
    }
    validate_core(job)
    help_text = KubernetesOptions.runopts().get("run_as_root")
    assert help_text is not None and "fail Pod Security 'restricted'" in help_text.help


def test_a_device_mount_needs_the_privileged_option() -> None:
    app = ddp(script="main.py", j="2x1", mounts=["type=device", "src=/dev/fuse"])
    with pytest.raises(UserError) as error:  # said by the torchx CLI without a traceback
        build_request(app, KubernetesOptions(), SUFFIX)
    assert str(error.value) == (
        "device mount /dev/fuse needs a privileged container (Kubernetes has no --device):"
        " run with -cfg privileged=True (the pods then pass only Pod Security 'privileged')"
        " or use a device plugin"
    )
    job = build_request(app, KubernetesOptions(privileged=True), SUFFIX).manifests[0]
    assert _container(job)["securityContext"] == {"privileged": True}


def test_an_unknown_mount_type_is_refused() -> None:
    app = ddp(script="main.py", j="2x1")
    app.roles[0].mounts = ["/data:/data"]
    with pytest.raises(TypeError) as error:
        build_request(app, KubernetesOptions(), SUFFIX)
    assert str(error.value) == "unsupported mount type for kubernetes: '/data:/data'"


def test_secret_env_is_a_reference_never_a_value() -> None:
    options = KubernetesOptions(secret_env={"HF_TOKEN": "hf/token"})
    job = build_request(_ddp(), options, SUFFIX).manifests[0]
    (var,) = [e for e in _container(job)["env"] if e["name"] == "HF_TOKEN"]
    assert var == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }


def test_retries_are_attempts_of_the_job_counted_per_index() -> None:
    job = build_request(_ddp(max_retries=3), KubernetesOptions(), SUFFIX).manifests[0]
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 3 and "backoffLimit" not in spec
    assert "maxFailedIndexes" not in spec  # no pod is deleted while writing its report
    assert spec["podFailurePolicy"]["rules"] == [
        {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
        {
            "action": "Ignore",
            "onExitCodes": {"operator": "In", "values": [143]},
            "onPodConditions": [],
        },
    ]
    assert for_server(job, (1, 36)) is job and for_server(job, (1, 31)) is job
    assert for_server(job, (1, 29))["spec"]["backoffLimitPerIndex"] == 3


def test_an_elastic_job_succeeds_when_index_0_has_and_a_fixed_size_one_needs_no_rule() -> None:
    """Index 0 hosts the rendezvous, so it takes part in every round; its agent exits 0
    once the worker group has succeeded. Servers before 1.31 get no successPolicy."""
    job = build_request(_ddp(), KubernetesOptions(), SUFFIX).manifests[0]
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert for_server(job, (1, 31)) is job
    old = for_server(job, (1, 30))
    assert "successPolicy" not in old["spec"] and "successPolicy" in job["spec"]
    assert old["spec"]["backoffLimitPerIndex"] == job["spec"]["backoffLimitPerIndex"]
    validate_all([job, old])
    fixed = ddp(script="main.py", j="4x8", h="gpu.small")
    assert (
        "successPolicy"
        not in build_request(fixed, KubernetesOptions(), SUFFIX).manifests[0]["spec"]
    )


def test_servers_without_per_index_limits_get_a_pod_count_for_the_same_attempts() -> None:
    # 4 nodes, 3 retries: 4 attempts in which every node fails, less one failure
    job = build_request(_ddp(max_retries=3), KubernetesOptions(), SUFFIX).manifests[0]
    old = for_server(job, (1, 28))
    assert old["spec"]["backoffLimit"] == 4 * 4 - 1
    assert "backoffLimitPerIndex" not in old["spec"] and "backoffLimitPerIndex" in job["spec"]
    assert old["spec"]["podFailurePolicy"] == job["spec"]["podFailurePolicy"]
    validate_all([old])


def test_pull_policy_ttl_and_the_root_cause_in_the_termination_message() -> None:
    job = build_request(_ddp(), KubernetesOptions(), SUFFIX).manifests[0]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert job["spec"]["ttlSecondsAfterFinished"] == 7 * 24 * 3600
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": ERROR_FILE_ENV, "value": "/dev/termination-log"} in container["env"]
    options = KubernetesOptions(image_pull_policy="Never", ttl_seconds_after_finished=0)
    job = build_request(_ddp(), options, SUFFIX).manifests[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    assert job["spec"]["ttlSecondsAfterFinished"] == 0
    volcano = build_request(_ddp(), KubernetesOptions(backend="volcano"), SUFFIX).manifests[0]
    assert volcano["spec"]["ttlSecondsAfterFinished"] == 7 * 24 * 3600


def test_fractional_cpus_are_millicpus() -> None:
    app = ddp(script="main.py", j="2x1", cpu=0.5)
    job = build_request(app, KubernetesOptions(reserved_millicpu=0), SUFFIX).manifests[0]
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "500m"
    app = ddp(script="main.py", j="2x1", cpu=2)
    job = build_request(app, KubernetesOptions(reserved_millicpu=0), SUFFIX).manifests[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2000m"


def test_kueue_queue_label_and_partial_admission() -> None:
    job = build_request(_ddp(), KubernetesOptions(queue="lq"), SUFFIX).manifests[0]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
    assert job["metadata"]["annotations"] == {"kueue.x-k8s.io/job-min-parallelism": "2"}


def test_named_resource_capabilities_place_the_pods() -> None:
    resource = specs.Resource(
        cpu=4,
        gpu=1,
        memMB=1000,
        capabilities={
            "node.kubernetes.io/instance-type": "p4d.24xlarge",
            "torchx-elastic/node-selector": {"pool": "gpu"},
            "torchx-elastic/tolerations": ["gpu=yes:NoExecute"],
        },
    )
    role = specs.Role(name="t", image="i", entrypoint="python3", resource=resource)
    options = KubernetesOptions(node_selector={"zone": "a"})
    job = build_request(specs.AppDef("t", [role]), options, SUFFIX).manifests[0]
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p4d.24xlarge",
        "pool": "gpu",
        "zone": "a",
    }
    assert spec["tolerations"] == [
        {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoExecute"}
    ]
    validate_core(job)


def test_volcano_replicas_reach_the_store_by_its_dns_name() -> None:
    job = build_request(_ddp(), KubernetesOptions(backend="volcano"), SUFFIX).manifests[0]
    hosts = []
    for task in job["spec"]["tasks"]:
        env = {e["name"]: e.get("value") for e in _container({"spec": task})["env"]}
        hosts.append(env[RANK0_ENV])
    name = f"main-{SUFFIX}"
    # rank 0 too: its store listens on its pod address, where the others reach it
    assert hosts == [f"{name}-main-0-0.{name}.default.svc"] * 4
    assert [t.get("minAvailable") for t in job["spec"]["tasks"]] == [1, 1, 0, 0]
    assert job["spec"]["minAvailable"] == 2
    assert job["spec"]["queue"] == "default"


# -- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "app_name",
    ["main", "Exp_Run.v2", "123", "", "-x-", "a" * 200, "Ünïcode ünd spaces", "trainer--x"],
)
@pytest.mark.parametrize("backend", ["job", "volcano"])
def test_names_are_dns_labels_with_room_for_pod_hostnames(app_name: str, backend: str) -> None:
    role = specs.Role(name="Trainer_" * 8, image="i", entrypoint="e", num_replicas=1000)
    request = build_request(
        specs.AppDef(app_name, [role]), KubernetesOptions(backend=backend), SUFFIX
    )
    job = request.names.job
    assert is_dns_label(job) and job.endswith(f"-{SUFFIX}")
    if backend == "job":
        hostnames = [f"{job}-999"]
    else:
        hostnames = [f"{job}-{t['name']}-0" for t in request.manifests[0]["spec"]["tasks"]]
    assert all(is_dns_label(h) for h in hostnames), hostnames


def test_names_are_deterministic_and_unique_per_run() -> None:
    a = build_request(_ddp(), KubernetesOptions(), "bcdfghjk").to_yaml()
    assert a == build_request(_ddp(), KubernetesOptions(), "bcdfghjk").to_yaml()
    suffixes = {new_suffix() for _ in range(200)}
    assert len(suffixes) == 200
    assert all(re.fullmatch(r"[a-z][a-z0-9]{7}", s) for s in suffixes)


def test_dns_label() -> None:
    assert dns_label("My_App.v2") == "my-app-v2"
    assert dns_label("__a__--b") == "a-b"
    assert dns_label("7up") == "app-7up"
    assert dns_label("") == "app"
    assert len(dns_label("x" * 100)) == DNS_LABEL_MAX
    assert not is_dns_label("a" * 64)


def test_app_id() -> None:
    assert JobNames("j", "ns").app_id == "ns:j"
    assert parse_app_id("ns:j") == ("ns", "j")
    with pytest.raises(ValueError) as error:
        parse_app_id("j")
    assert str(error.value) == (
        "invalid kubernetes app id 'j': expected NAMESPACE:JOB (e.g. default:train-bcdfghjk),"
        " as printed by torchx run"
    )


# -- options --------------------------------------------------------------------------------


def test_runopts_come_from_the_options_dataclass() -> None:
    opts = KubernetesOptions.runopts()
    assert {name for name, _ in opts} == {
        "namespace",
        "backend",
        "network_policy",
        "queue",
        "priority_class",
        "service_account",
        "image_pull_policy",
        "ttl_seconds_after_finished",
        "reserved_millicpu",
        "reserved_memmb",
        "efa_device_count",
        "validate_spec",
        "image_repo",
        "quiet",
        "image_pull_secrets",
        "node_selector",
        "tolerations",
        "run_as_root",
        "privileged",
        "secret_env",
        "secret_mounts",
        "configmap_mounts",
    }
    assert opts.get("namespace").default == "default"
    cfg = opts.cfg_from_str("backend=volcano,tolerations=a:NoSchedule;b,node_selector=x/y:z")
    options = KubernetesOptions.from_cfg(opts.resolve(cfg))
    assert options.backend == "volcano"
    assert options.tolerations == ["a:NoSchedule", "b"]
    assert options.node_selector == {"x/y": "z"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"backend": "kueue"},
            "invalid kubernetes run option backend='kueue'; accepted: job, volcano (default: job)",
        ),
        (
            {"image_pull_policy": "Sometimes"},
            "invalid kubernetes run option image_pull_policy='Sometimes'; accepted:"
            " IfNotPresent, Always, Never (default: IfNotPresent)",
        ),
        (
            {"ttl_seconds_after_finished": -1},
            "invalid kubernetes run option ttl_seconds_after_finished=-1; accepted: a number"
            " >= 0 (default: 604800)",
        ),
        (
            {"tolerations": ["gpu:Sometimes"]},
            "invalid kubernetes run option tolerations='gpu:Sometimes'; expected"
            " key[=value][:Effect] with Effect one of NoSchedule, PreferNoSchedule, NoExecute"
            " (e.g. nvidia.com/gpu:NoSchedule)",
        ),
        (
            {"secret_env": {"TOKEN": "just-a-name"}},
            "invalid kubernetes run option secret_env='TOKEN:just-a-name'; expected"
            " NAME:secret/key (e.g. HF_TOKEN:hf/token)",
        ),
    ],
)
def test_invalid_options_say_what_is_valid(options: Obj, message: str) -> None:
    with pytest.raises(ValueError) as error:
        KubernetesOptions(**options)
    assert str(error.value) == message


def test_toleration_forms() -> None:
    from torchx_elastic.schedulers.kubernetes.options import parse_toleration

    assert parse_toleration("k") == {"key": "k", "operator": "Exists"}
    assert parse_toleration("k=v:NoSchedule") == {
        "key": "k",
        "operator": "Equal",
        "value": "v",
        "effect": "NoSchedule",
    }


def test_golden_dir_has_only_checked_files() -> None:
    checked: List[str] = ["job_2-4x8.yaml", "job_all_options.yaml", "volcano_2-4x8.yaml"]
    checked.append("job_ft_2_groups_2x1.yaml")  # test_role_jobs.py
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(checked)
