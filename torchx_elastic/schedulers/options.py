"""Run options of every torchx-elastic scheduler, declared once per scheduler.

A scheduler's options are one frozen dataclass deriving from :class:`RunOptions`, each
field made with :func:`option` (its torchx type, help text and the values it accepts).
From that one declaration come:

- ``runopts()``: what ``torchx runopts <scheduler>`` prints and what torchx parses
  ``-cfg`` / ``.torchxconfig`` with;
- ``from_cfg(cfg)``: the typed options of a resolved cfg;
- the errors: a value outside ``choices`` or below ``minimum``, or a value for an option
  that does not apply (``unsupported``), raises :class:`RunOptionError` naming the
  scheduler, the option, the value and what is accepted.

Checks beyond choices and minimum go in the dataclass's ``check()``, raising the same error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar

from torchx.specs import CfgVal, runopts

from torchx_elastic.schedulers.errors import UserError

_META = "torchx_elastic.option"

OptionsT = TypeVar("OptionsT", bound="RunOptions")


@dataclass(frozen=True)
class OptionSpec:
    """What a run option is, beyond its name and default."""

    type_: Any  # the torchx cfg type: str, int, float, bool, List[str], Dict[str, str]
    help: str
    choices: Tuple[str, ...] = ()
    minimum: Optional[float] = None
    unsupported: str = ""  # why a value for this option cannot be honoured (empty: it can)
    required: bool = False

    def help_text(self, default: Any) -> str:
        text = self.help
        if self.choices:
            text += f" (one of: {', '.join(self.choices)})"
        if self.unsupported:
            text += f" [not supported: {self.unsupported}]"
        return text


def option(
    default: Any = None,
    *,
    type_: Any,
    help: str,
    choices: Tuple[str, ...] = (),
    minimum: Optional[float] = None,
    unsupported: str = "",
    required: bool = False,
) -> Any:
    """A dataclass field that is a run option; list and dict defaults are copied per use."""
    spec = OptionSpec(type_, help, choices, minimum, unsupported, required)
    if isinstance(default, (list, dict)):
        empty = type(default)
        return field(default_factory=lambda: empty(default), metadata={_META: spec})
    return field(default=default, metadata={_META: spec})


class RunOptionError(UserError, ValueError):
    """A run option value that the scheduler cannot use; says what is accepted."""

    def __init__(self, scheduler: str, name: str, value: object, accepted: str) -> None:
        self.scheduler = scheduler
        self.option = name
        super().__init__(f"invalid {scheduler} run option {name}={value!r}; {accepted}")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _spec(f: dataclasses.Field[Any]) -> OptionSpec:
    spec = f.metadata.get(_META)
    assert isinstance(spec, OptionSpec), f"{f.name} is not declared with option()"
    return spec


@dataclass(frozen=True)
class RunOptions:
    """Base of a scheduler's options dataclass; ``SCHEDULER`` names it in errors."""

    SCHEDULER: ClassVar[str] = "scheduler"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            self._check_field(f, _spec(f), getattr(self, f.name))
        self.check()

    def check(self) -> None:
        """Checks that need more than one field's declaration; raise :meth:`error`."""

    def error(self, name: str, value: object, accepted: str) -> RunOptionError:
        return RunOptionError(self.SCHEDULER, name, value, accepted)

    def _check_field(self, f: dataclasses.Field[Any], spec: OptionSpec, value: Any) -> None:
        default = _default(f)
        if spec.unsupported and value != default:
            raise self.error(
                f.name,
                value,
                f"torchx-elastic's {self.SCHEDULER} scheduler does not support it:"
                f" {spec.unsupported}",
            )
        if value is None:
            return
        if spec.choices and value not in spec.choices:
            raise self.error(
                f.name, value, f"accepted: {', '.join(spec.choices)} (default: {default})"
            )
        if spec.minimum is not None and value < spec.minimum:
            raise self.error(
                f.name, value, f"accepted: a number >= {spec.minimum:g} (default: {default})"
            )

    @classmethod
    def runopts(cls) -> runopts:
        """The options as torchx ``runopts``, in declaration order."""
        opts = runopts()
        for f in dataclasses.fields(cls):
            spec = _spec(f)
            default = _default(f)
            opts.add(
                f.name,
                type_=spec.type_,
                help=spec.help_text(default),
                default=None if spec.required else default,
                required=spec.required,
            )
        return opts

    @classmethod
    def from_cfg(cls: Type[OptionsT], cfg: Mapping[str, CfgVal]) -> OptionsT:
        """The options of a torchx cfg (resolved or not); keys it does not declare are ignored.

        A ``None`` value means "not set" (torchx's resolved cfg has one for every option
        without a default). A list becomes a tuple where the field is declared a tuple.
        """
        values: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = cfg.get(f.name)
            if value is None:
                continue
            if isinstance(value, list) and "Tuple" in str(f.type):
                value = tuple(value)
            values[f.name] = value
        return cls(**values)
