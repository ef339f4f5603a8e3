"""The command line of a pipeline step, and its parser (``python -m torchx_elastic.pipelines``).

Two forms, the same step (``step.py``):

    python -m torchx_elastic.pipelines [-cfg K=V,...] [--input NAME VALUE]... \
        [--output PATH VALUE]... COMPONENT ARGS...
    python -m torchx_elastic.pipelines [-cfg ...] [--input ...] [--output ...] \
        --app-json JSON -- ARGS...

The first is ``torchx run -s kubernetes COMPONENT ARGS...`` that waits (for Airflow, Argo
Workflows, a CI job, a shell); the second carries an ``AppDef`` built in Python, its roles'
arguments one per command-line argument (what ``pipelines.kfp`` generates). ``--input``
gives the value of a ``pipeline_input`` marker (``inputs.py``) in the app's arguments, its
environment and the outputs' values.
"""

from __future__ import annotations

import argparse
from typing import List, Sequence, Tuple

from torchx.specs import AppDef, materialize_appdef
from torchx.specs.finder import get_component

from torchx_elastic.pipelines.app_json import all_args, app_from_json, app_to_json
from torchx_elastic.pipelines.inputs import apply_inputs, replace_inputs

PYTHON = "python"
MODULE = "torchx_elastic.pipelines"


def step_command(
    app: AppDef,
    cfg: str = "",
    inputs: Sequence[Tuple[str, str]] = (),
    outputs: Sequence[Tuple[str, str]] = (),
) -> List[str]:
    """The command of a step that submits ``app``, given each (name, value) of ``inputs``;
    each (path, value) of ``outputs`` is written once the job SUCCEEDED."""
    command = [PYTHON, "-m", MODULE, "--app-json", app_to_json(app)]
    if cfg:
        command += ["-cfg", cfg]
    for name, value in inputs:
        command += ["--input", name, value]
    for path, value in outputs:
        command += ["--output", path, value]
    return [*command, "--", *all_args(app)]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description=(
            "Submit a torchx app to Kubernetes and wait for it: every node's lines as they"
            " come, exit status 0 when it SUCCEEDED, 1 when it did not (with the root cause),"
            " and the job cancelled on SIGTERM."
        ),
    )
    p.add_argument(
        "-cfg", "--cfg", default="", help="run options of the kubernetes scheduler, as torchx run's"
    )
    p.add_argument(
        "--input",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="the value of the input NAME (pipeline_input) in the app and the outputs",
    )
    p.add_argument(
        "--output",
        nargs=2,
        action="append",
        default=[],
        metavar=("PATH", "VALUE"),
        help="write VALUE to PATH once the job SUCCEEDED (a step's output)",
    )
    p.add_argument("--app-json", help="the app, as pipelines.kfp writes it (arguments after --)")
    p.add_argument(
        "component_args",
        nargs=argparse.REMAINDER,
        help="COMPONENT ARGS... (e.g. dist.ddp -j 2x1 --script main.py), or the arguments"
        " of --app-json's roles after --",
    )
    return p


def parse_app(args: argparse.Namespace, p: argparse.ArgumentParser) -> AppDef:
    """The app a parsed command line names, its inputs' values in it."""
    try:
        return apply_inputs(_app(args, p), dict(args.input))
    except ValueError as e:
        p.error(str(e))


def parse_outputs(args: argparse.Namespace, p: argparse.ArgumentParser) -> List[Tuple[str, str]]:
    """(path, value) of each output, its inputs' values in it."""
    try:
        return [(path, replace_inputs(value, dict(args.input))) for path, value in args.output]
    except ValueError as e:
        p.error(str(e))


def _app(args: argparse.Namespace, p: argparse.ArgumentParser) -> AppDef:
    rest: List[str] = list(args.component_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.app_json:
        try:
            return app_from_json(args.app_json, rest)
        except (ValueError, KeyError, TypeError) as e:
            p.error(f"--app-json: {e}")
    if not rest:
        p.error("name a component (e.g. dist.ddp) or give --app-json")
    component = get_component(rest[0])
    return materialize_appdef(component.fn, rest[1:])
