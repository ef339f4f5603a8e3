"""A step's inputs in an app: a marker in its arguments, replaced when the step runs.

``pipeline_input("lr")`` is the text ``{{pipeline_input:lr}}``; the step is given each
input's value (``--input lr 0.01``: a pipeline engine puts its own placeholder there) and
replaces the markers: in the roles' arguments with ``$`` doubled, as our components double
it in the arguments they are given (torchx's macros read a single ``$``); in the roles'
environment and the outputs' values as they are.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping, Set

from torchx.specs import AppDef

_MARKER = re.compile(r"\{\{pipeline_input:([A-Za-z_][A-Za-z0-9_]*)\}\}")


def pipeline_input(name: str) -> str:
    """The text that stands for the step's input ``name`` in an app's arguments."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"input {name!r} is not a Python identifier (KFP names them so)")
    return f"{{{{pipeline_input:{name}}}}}"


def used_inputs(texts: Iterable[str]) -> Set[str]:
    """The inputs named in ``texts``."""
    return {match.group(1) for text in texts for match in _MARKER.finditer(text)}


def app_texts(app: AppDef) -> Iterable[str]:
    """Where an app may use inputs: its roles' arguments and environment values."""
    for role in app.roles:
        yield from role.args
        yield from role.env.values()


def replace_inputs(text: str, values: Mapping[str, str], escape_dollar: bool = False) -> str:
    """``text`` with each input's marker replaced by its value."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"the app uses the input {name!r}, which the step was not given")
        found = values[name]
        return found.replace("$", "$$") if escape_dollar else found

    return _MARKER.sub(value, text)


def apply_inputs(app: AppDef, values: Mapping[str, str]) -> AppDef:
    """``app`` with the inputs' values in its roles' arguments and environment."""
    roles = [
        dataclasses.replace(
            role,
            args=[replace_inputs(a, values, escape_dollar=True) for a in role.args],
            env={k: replace_inputs(v, values) for k, v in role.env.items()},
        )
        for role in app.roles
    ]
    return dataclasses.replace(app, roles=roles)
