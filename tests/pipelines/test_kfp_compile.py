"""The two pipelines compiled by the real KFP SDK (``make test-kfp``, in ``.venv-kfp``):
the docs' two-step pipeline and the real-node test's step, each compared with its committed
compiled YAML (regenerate with UPDATE_GOLDEN=1), and the training step's spec checked."""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml
from kfp import compiler

from tests.pipelines import kfp_steps
from torchx_elastic.pipelines.app_json import app_from_json
from torchx_elastic.pipelines.inputs import pipeline_input
from torchx_elastic.pipelines.kfp import component_from_app

REPO = Path(__file__).resolve().parents[2]
DOCS_YAML = REPO / "docs" / "kfp_pipeline.yaml"
STEP_YAML = REPO / "tests" / "pipelines" / "golden" / "real_node_step.yaml"


def _compile(pipeline: Any, path: Path) -> str:
    compiler.Compiler().compile(pipeline, str(path))
    # the SDK's version is written in the file: not part of what is compared
    lines = path.read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("sdkVersion:"))


def _same_as_golden(text: str, golden: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} is stale: UPDATE_GOLDEN=1 make test-kfp"


def _executor(spec: Dict[str, Any], name: str) -> Dict[str, Any]:
    container: Dict[str, Any] = spec["deploymentSpec"]["executors"][f"exec-{name}"]["container"]
    return container


def test_the_docs_two_step_pipeline(tmp_path: Path) -> None:
    example = runpy.run_path(str(REPO / "examples" / "kfp_pipeline.py"))
    text = _compile(example["pipeline"], tmp_path / "pipeline.yaml")
    _same_as_golden(text, DOCS_YAML)
    spec = yaml.safe_load(text)
    train = spec["components"]["comp-train"]
    assert train["inputDefinitions"]["parameters"] == {
        "run_dir": {"parameterType": "STRING"},
        "steps": {"parameterType": "NUMBER_INTEGER"},
    }
    assert train["outputDefinitions"]["parameters"] == {"checkpoint": {"parameterType": "STRING"}}
    # the prepare step's output is the training step's input; its output the pipeline's
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["train"]["inputs"]["parameters"]["run_dir"] == {
        "taskOutputParameter": {"outputParameterKey": "run_dir", "producerTask": "prepare"}
    }
    assert tasks["train"]["dependentTasks"] == ["prepare"]
    assert spec["root"]["dag"]["outputs"]["parameters"]["Output"]["valueFromParameter"] == {
        "outputParameterKey": "checkpoint",
        "producerSubtask": "train",
    }
    container = _executor(spec, "train")
    assert container["image"] == "registry.example.com/team/torchx-elastic:v1"
    command = container["command"]
    assert command[:5] == ["python", "-m", "torchx_elastic.pipelines", "--app-json", command[4]]
    tail = command[command.index("--") + 1 :]
    app = app_from_json(command[4], tail)
    (role,) = app.roles
    assert (role.min_replicas, role.num_replicas, role.image) == (1, 2, container["image"])
    assert tail[tail.index("--nproc-per-node") + 1] == "2"
    assert role.mounts[0].src == "training-data"  # type: ignore[union-attr]
    assert tail[-4:] == [
        "--checkpoint", "{{pipeline_input:run_dir}}/model.pt",
        "--steps", "{{pipeline_input:steps}}",
    ]  # fmt: skip
    options = command[5 : command.index("--")]
    assert options == [
        "-cfg", "ttl_seconds_after_finished=3600",
        "--input", "run_dir", "{{$.inputs.parameters['run_dir']}}",
        "--input", "steps", "{{$.inputs.parameters['steps']}}",
        "--output", "{{$.outputs.parameters['checkpoint'].output_file}}",
        "{{pipeline_input:run_dir}}/model.pt",
    ]  # fmt: skip


def test_the_real_node_step(tmp_path: Path) -> None:
    text = _compile(kfp_steps.pipeline, tmp_path / "pipeline.yaml")
    _same_as_golden(text, STEP_YAML)
    container = _executor(yaml.safe_load(text), "train")
    assert container["image"] == kfp_steps.NODE_IMAGE
    command = container["command"]
    tail = command[command.index("--") + 1 :]
    (role,) = app_from_json(command[4], tail).roles
    assert (role.resource.cpu, role.num_replicas, role.min_replicas) == (0.5, 2, 2)
    # Kubernetes reads "$$" in a pod's command as "$": the step gets torchx's "$${...}"
    assert tail[tail.index("--rdzv-endpoint") + 1] == "$$${${rank0_env}:-localhost}:29500"
    assert tail[-4:] == [
        "--seconds", "{{pipeline_input:seconds}}", "--crash-rank", "{{pipeline_input:crash_rank}}",
    ]  # fmt: skip


def test_undeclared_inputs_and_bad_names_are_refused() -> None:
    from torchx_elastic.components.dist import ddp

    app = ddp("--lr", pipeline_input("lr"), script="train.py", j="2x1")
    with pytest.raises(ValueError) as e:
        component_from_app(app)
    assert str(e.value) == (
        "the app or its outputs use the inputs ['lr']: declare them in inputs= with their types"
    )
    with pytest.raises(ValueError) as e:
        component_from_app(app, inputs={"lr": float}, outputs={"lr": "x"})
    assert str(e.value) == "['lr'] named both an input and an output"
    with pytest.raises(ValueError) as e:
        component_from_app(app, inputs={"lr": float, "data-dir": str})
    assert str(e.value) == "input 'data-dir' is not a Python identifier (KFP names them so)"
