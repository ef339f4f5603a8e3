"""Every run option of the torchx scheduler we replace, with the same meaning.

Runs with whichever torchx line is installed: torchx's own schedulers are created and
their ``runopts`` compared with ours, name by name (type and default); the few that
differ on purpose are listed with the reason, and those we cannot honour give an error
that says why.
"""

from __future__ import annotations

import importlib
import typing
from typing import Any, Callable, Dict, Tuple

import pytest
from torchx.specs import runopts

from torchx_elastic.schedulers import docker, kubernetes, local_cwd
from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions
from torchx_elastic.schedulers.options import RunOptions

# ours -> (torchx's module, our factory, our options)
REPLACED: Dict[str, Tuple[str, Callable[..., Any], type[RunOptions]]] = {
    "local_cwd": (
        "torchx.schedulers.local_scheduler",
        local_cwd.create_scheduler,
        local_cwd.LocalCwdOptions,
    ),
    "docker": ("torchx.schedulers.docker_scheduler", docker.create_scheduler, DockerOptions),
    "kubernetes": (
        "torchx.schedulers.kubernetes_scheduler",
        kubernetes.create_scheduler,
        KubernetesOptions,
    ),
}
# (scheduler, option): why its default differs from torchx's
DIFFERENT_DEFAULT = {
    ("local_cwd", "log_dir"): "ours keeps the logs in ./torchx_logs; torchx's temp dir is deleted",
    ("kubernetes", "queue"): "the default backend (Indexed Job) needs no Volcano queue",
}


def _torchx_opts(name: str) -> runopts:
    module = importlib.import_module(REPLACED[name][0])
    return module.create_scheduler("compat").run_opts()


def _bare(type_: Any) -> Any:
    """``Optional[X]`` / ``X | None`` as ``X``; ``List[str]`` and ``list[str]`` alike."""
    args = [a for a in typing.get_args(type_) if a is not type(None)]
    if type(None) in typing.get_args(type_) and len(args) == 1:
        type_ = args[0]
    return (typing.get_origin(type_) or type_, typing.get_args(type_))


@pytest.mark.parametrize("name", sorted(REPLACED))
def test_every_torchx_runopt_is_ours_with_its_type_and_default(name: str) -> None:
    ours = REPLACED[name][1]("compat").run_opts()
    for option, theirs in _torchx_opts(name):
        mine = ours.get(option)
        assert mine is not None, f"{name}: torchx's run option {option} is missing"
        assert _bare(mine.opt_type) == _bare(theirs.opt_type), (name, option)
        if (name, option) in DIFFERENT_DEFAULT:
            continue
        assert mine.default == theirs.default, (name, option)
        assert mine.is_required == theirs.is_required, (name, option)


@pytest.mark.parametrize(("name", "option"), sorted(DIFFERENT_DEFAULT))
def test_the_different_defaults_are_torchx_options(name: str, option: str) -> None:
    assert _torchx_opts(name).get(option) is not None


@pytest.mark.parametrize("options", [DockerOptions, KubernetesOptions])
def test_image_repo_and_quiet_are_workspace_options(options: type[RunOptions]) -> None:
    parsed = options.from_cfg({"image_repo": "registry.example/team", "quiet": True})
    assert (parsed.image_repo, parsed.quiet) == ("registry.example/team", True)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("local_cwd", {"cache_size": 5, "extra_paths": ["/opt/bin"]}),
        ("docker", {"client": None}),
        ("kubernetes", {"client": None, "docker_client": None}),
    ],
)
def test_create_scheduler_takes_torchx_s_arguments(name: str, kwargs: Dict[str, Any]) -> None:
    scheduler = REPLACED[name][1]("compat", **kwargs)
    assert scheduler.session_name == "compat"


def test_local_cwd_keeps_extra_paths_and_image_provider() -> None:
    from torchx.schedulers.local_scheduler import CWDImageProvider

    class Provider(CWDImageProvider):
        pass

    scheduler = local_cwd.create_scheduler(
        "compat", extra_paths=["/opt/tools"], image_provider_class=Provider
    )
    assert scheduler._extra_paths == ["/opt/tools"]
    assert scheduler._image_provider_class is Provider
