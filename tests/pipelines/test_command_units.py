"""The step's command line: the app as JSON and back, inputs, and what a wrong one says."""

from __future__ import annotations

import pytest
from torchx.specs import AppDef, BindMount, DeviceMount, Resource, RetryPolicy, Role, VolumeMount

from torchx_elastic.components.dist import ddp
from torchx_elastic.pipelines.__main__ import main
from torchx_elastic.pipelines.app_json import app_from_json, app_to_json
from torchx_elastic.pipelines.command import step_command
from torchx_elastic.pipelines.inputs import apply_inputs, pipeline_input


def _app() -> AppDef:
    trainer = Role(
        name="trainer",
        image="img:1",
        entrypoint="python3",
        args=["-m", "train", "--data", "$${x}"],
        env={"A": "1"},
        num_replicas=4,
        min_replicas=2,
        max_retries=3,
        retry_policy=RetryPolicy.REPLICA,
        resource=Resource(cpu=1.5, gpu=2, memMB=4096, capabilities={"k": "v"}, devices={"d": 1}),
        port_map={"c10d": 29500},
        metadata={"m": {"n": [1]}},
        mounts=[
            BindMount("/src", "/dst", read_only=True),
            VolumeMount("pvc", "/data"),
            DeviceMount("/dev/fuse", "/dev/fuse", permissions="rw"),
        ],
    )
    reader = Role(name="reader", image="img:2", entrypoint="sh", args=["-c", "true"])
    return AppDef("job", roles=[trainer, reader], metadata={"team": "ml"})


def test_an_app_survives_its_json_and_its_arguments() -> None:
    app = _app()
    command = step_command(app)
    assert command[:4] == ["python", "-m", "torchx_elastic.pipelines", "--app-json"]
    rest = command[command.index("--") + 1 :]
    assert rest == ["-m", "train", "--data", "$${x}", "-c", "true"]
    assert app_from_json(command[4], rest) == app
    with pytest.raises(ValueError) as e:
        app_from_json(app_to_json(app), rest[:-1])
    assert str(e.value) == "the app's roles take 6 arguments, 5 were given"


def test_inputs_replace_their_markers_with_dollar_kept_through_torchx_macros() -> None:
    data = pipeline_input("data")
    app = ddp("--data", data, script="train.py", env={"D": data})
    given = apply_inputs(app, {"data": "/d/$x"})
    assert given.roles[0].args[-2:] == ["--data", "/d/$$x"]  # torchx's macros read "$$" as "$"
    assert given.roles[0].env["D"] == "/d/$x"  # environment values are not escaped by ddp
    with pytest.raises(ValueError) as e:
        apply_inputs(app, {})
    assert str(e.value) == "the app uses the input 'data', which the step was not given"
    with pytest.raises(ValueError) as e:
        pipeline_input("data-dir")
    assert str(e.value) == "input 'data-dir' is not a Python identifier (KFP names them so)"


@pytest.mark.parametrize(
    "argv, error",
    [
        ([], "name a component (e.g. dist.ddp) or give --app-json"),
        (["--app-json", app_to_json(_app()), "--", "x"], "--app-json: the app's roles take 6"),
        (
            ["--input", "a", "1", "dist.ddp", "--script", "t.py", "--", pipeline_input("b")],
            "the app uses the input 'b', which the step was not given",
        ),
        (
            ["--output", "/o", pipeline_input("b"), "dist.ddp", "--script", "t.py"],
            "the app uses the input 'b', which the step was not given",
        ),
    ],
)
def test_a_wrong_command_line_says_why(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert f"python -m torchx_elastic.pipelines: error: {error}" in capsys.readouterr().err
