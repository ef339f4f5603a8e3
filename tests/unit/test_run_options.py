"""The one declaration of run options: runopts, parsing and errors come from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional, Tuple

import pytest

from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.kubernetes.options import KubernetesOptions
from torchx_elastic.schedulers.local_cwd import LocalCwdOptions
from torchx_elastic.schedulers.options import RunOptionError, RunOptions, option


@dataclass(frozen=True)
class SampleOptions(RunOptions):
    SCHEDULER: ClassVar[str] = "sample"

    mode: str = option("fast", type_=str, choices=("fast", "slow"), help="how to go")
    workers: int = option(1, type_=int, minimum=1, help="how many")
    tags: Optional[Tuple[str, ...]] = option(None, type_=List[str], help="labels")
    remote: Optional[str] = option(None, type_=str, unsupported="no remote here", help="where")


def test_runopts_carry_type_default_and_help_with_choices() -> None:
    opts = SampleOptions.runopts()
    assert [name for name, _ in opts] == ["mode", "workers", "tags", "remote"]
    mode = opts.get("mode")
    assert mode is not None and mode.default == "fast" and mode.opt_type is str
    assert mode.help == "how to go (one of: fast, slow)"
    remote = opts.get("remote")
    assert remote is not None and remote.help == "where [not supported: no remote here]"


def test_from_a_cfg_string_through_torchx_parsing() -> None:
    opts = SampleOptions.runopts()
    options = SampleOptions.from_cfg(opts.resolve(opts.cfg_from_str("mode=slow,tags=a;b")))
    assert options == SampleOptions(mode="slow", tags=("a", "b"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"mode": "warp"},
            "invalid sample run option mode='warp'; accepted: fast, slow (default: fast)",
        ),
        (
            {"workers": 0},
            "invalid sample run option workers=0; accepted: a number >= 1 (default: 1)",
        ),
        (
            {"remote": "x"},
            "invalid sample run option remote='x'; torchx-elastic's sample scheduler does not"
            " support it: no remote here",
        ),
    ],
)
def test_errors_name_scheduler_option_value_and_what_is_accepted(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(RunOptionError) as error:
        SampleOptions.from_cfg(values)  # type: ignore[arg-type]
    assert str(error.value) == message
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("options", [DockerOptions, KubernetesOptions, LocalCwdOptions])
def test_every_scheduler_declares_through_the_one_mechanism(options: type[RunOptions]) -> None:
    assert issubclass(options, RunOptions)
    assert options.from_cfg({}) == options()
    assert len(list(options.runopts())) >= 3
