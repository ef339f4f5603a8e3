"""A Kubeflow Pipelines (v2 SDK) step from an ``AppDef``: ``pip install torchx-elastic[kfp]``.

    from kfp import dsl
    from torchx_elastic.components.dist import ddp
    from torchx_elastic.pipelines.kfp import component_from_app, pipeline_input

    app = ddp("--lr", pipeline_input("lr"), script="train.py", j="1:2x2", image=IMAGE)
    train = component_from_app(app, inputs={"lr": float},
                               outputs={"checkpoint": "/data/ckpt.pt"})

    @dsl.pipeline
    def pipeline(lr: float = 0.01) -> str:
        return train(lr=lr).outputs["checkpoint"]

The component is a container component whose container (the app's image by default, which
has this package) runs ``python -m torchx_elastic.pipelines`` (``step.py``): it submits the
app to the cluster the pipeline runs in with the pod's service account, streams every
node's lines into the step's log, and exits with the job. ``kfp`` is imported only here,
and only when these functions are called.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, List, Mapping, Optional

from torchx.specs import AppDef

from torchx_elastic.pipelines.command import step_command
from torchx_elastic.pipelines.inputs import app_texts, pipeline_input, used_inputs

__all__ = ["component_from_app", "container_spec", "pipeline_input"]

_EXPANDED = re.compile(r"\$(?=[$(])")


def kubernetes_literal(arg: str) -> str:
    """``arg`` as a pod's command must say it for the container to get ``arg``: Kubernetes
    reads ``$(VAR)`` and ``$$`` in a command; KFP's placeholders (``{{$.inputs...}}``) stay."""
    return _EXPANDED.sub("$$", arg)


def container_spec(
    app: AppDef,
    cfg: str = "",
    inputs: Mapping[str, Any] = {},
    outputs: Mapping[str, str] = {},
    output_paths: Mapping[str, Any] = {},
    image: Optional[str] = None,
) -> Any:
    """The ``dsl.ContainerSpec`` of the step that submits ``app`` and waits for it.

    ``cfg``: run options of the kubernetes scheduler (torchx's ``-cfg`` text); ``inputs``:
    each input's value (KFP's placeholder); ``outputs``: output name to the value the step
    hands on once the job SUCCEEDED (it may use ``pipeline_input``), written to
    ``output_paths[name]`` (KFP's placeholder); ``image``: the step's image (default: the
    first role's, which has this package).
    """
    from kfp import dsl

    missing = sorted(set(outputs) - set(output_paths))
    if missing:
        raise ValueError(f"no output path for the outputs {missing}")
    command = step_command(
        app,
        cfg,
        inputs=[(name, str(value)) for name, value in inputs.items()],
        outputs=[(str(output_paths[name]), value) for name, value in outputs.items()],
    )
    return dsl.ContainerSpec(
        image=image or app.roles[0].image, command=[kubernetes_literal(a) for a in command]
    )


def _check(app: AppDef, inputs: Mapping[str, type], outputs: Mapping[str, str]) -> None:
    for name in [*inputs, *outputs]:
        pipeline_input(name)  # a Python identifier
    clash = sorted(set(inputs) & set(outputs))
    if clash:
        raise ValueError(f"{clash} named both an input and an output")
    unknown = sorted(used_inputs([*app_texts(app), *outputs.values()]) - set(inputs))
    if unknown:
        raise ValueError(
            f"the app or its outputs use the inputs {unknown}: declare them in inputs="
            " with their types"
        )


def component_from_app(
    app: AppDef,
    inputs: Mapping[str, type] = {},
    outputs: Mapping[str, str] = {},
    cfg: str = "",
    image: Optional[str] = None,
    name: Optional[str] = None,
) -> Any:
    """A KFP v2 container component that runs ``app`` as one step (``container_spec``).

    ``inputs``: the step's inputs and their types (``str``, ``int``, ``float``, ``bool``),
    used in the app through ``pipeline_input(name)``; ``outputs``: the step's string
    outputs and their values; ``name``: the component's (default: the app's).
    """
    from kfp import dsl

    _check(app, inputs, outputs)

    def step(*placeholders: Any) -> Any:
        given = dict(zip([*inputs, *outputs], placeholders, strict=True))
        return container_spec(
            app,
            cfg,
            inputs={n: given[n] for n in inputs},
            outputs=outputs,
            output_paths={n: given[n] for n in outputs},
            image=image,
        )

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters: List[inspect.Parameter] = [
        *(inspect.Parameter(n, kind, annotation=t) for n, t in inputs.items()),
        *(inspect.Parameter(n, kind, annotation=dsl.OutputPath(str)) for n in outputs),
    ]
    step.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    step.__name__ = (name or app.name).replace("-", "_")
    step.__doc__ = f"Runs the torchx app {app.name} on Kubernetes and waits for it."
    return dsl.container_component(step)
