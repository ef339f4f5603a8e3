"""Our dist components against torchx's own, on the command lines of torchx's own docs.

Runs with whichever torchx line is installed (0.7 or the development line): the samples
are read from that torchx's sources (every ``torchx run ... dist.<component> ...`` command
line and the ``-j`` values of its docstrings), parsed by torchx's own component argument
parser for its component and for ours, and the AppDef fields that carry meaning are
compared. Entrypoint and args differ by design: ours runs the bundled agent directly.
"""

from __future__ import annotations

import inspect
import re
import shlex
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torchx
import torchx.components.dist as torchx_dist
from torchx.specs import AppDef
from torchx.specs.builders import materialize_appdef

from torchx_elastic.components import dist as our_dist
from torchx_elastic.components.job_size import parse_nnodes

COMPONENTS = [name for name in ("ddp", "spmd", "torchrun") if hasattr(torchx_dist, name)]
TORCHX_DIR = Path(torchx.__file__).parent
_COMMAND = re.compile(r"torchx run (?:.*? )?(?:dist\.)?(ddp|spmd|torchrun)\b(.*)")
# every parameter of the dist components of both torchx lines, each in some combination
EVERY_PARAMETER: List[List[str]] = [
    ["--script", "main.py", "--image", "my/image:1", "--name", "exp/run", "--cpu", "4"],
    ["--script", "main.py", "--gpu", "2", "--memMB", "4096", "-j", "2x2", "--tee", "1"],
    ["-m", "pkg.train", "--env", "A=1,B=2", "--max_retries", "3", "-j", "0:1x2"],
    ["--script", "t.py", "--rdzv_port", "29501", "--rdzv_backend", "c10d", "-j", "1:3x2"],
    ["--script", "t.py", "--mounts", "type=bind,src=/data,dst=/data,readonly", "--debug", "True"],
    ["--script", "t.py", "-h", "aws_p4d.24xlarge", "-j", "2x8", "--", "--lr", "0.1"],
    ["--script", "t.py", "-h", "gpu.small", "-j", "1", "--name", "exp/"],
    ["--script", "t.py", "-h", "aws_trn1.32xlarge", "-j", "2x16", "--name", "/run"],
]
DEV_LINE_PARAMETERS: List[List[str]] = [
    ["--script", "t.py", "--metadata", "k1=v1,k2=v2", "--rdzv_conf", "join_timeout=600"],
]


def _doc_commands() -> List[List[str]]:
    """The component arguments of every ``torchx run ... dist.X ...`` line in torchx's sources."""
    found: List[List[str]] = []
    for path in sorted(TORCHX_DIR.rglob("*.py")):
        text = path.read_text(encoding="utf-8").replace("\\\\\n", " ").replace("\\\n", " ")
        for line in text.splitlines():
            match = _COMMAND.search(line)
            if not match:
                continue
            try:
                tokens = shlex.split(match.group(2))
            except ValueError:
                continue
            tokens = [t for t in tokens if t not in ("...", "\\")]
            if any(t.startswith("[") for t in tokens):
                continue  # a usage synopsis ("[-h] --image IMAGE ..."), not a command line
            if tokens and tokens not in found:
                found.append(tokens)
    return found


def _doc_j_samples() -> List[Tuple[Optional[str], str]]:
    """``(host, j)`` of torchx's dist docstrings: ``-j`` values and ``parse_from`` doctests."""
    source = inspect.getsource(torchx_dist) + inspect.getsource(
        __import__("torchx.components.structured_arg", fromlist=["x"])
    )
    samples: List[Tuple[Optional[str], str]] = [
        (None, j) for j in re.findall(r"-j (\d[\d:x]*)", source)
    ]
    samples += re.findall(r'parse_from\(h="([^"]+)", j="([^"]+)"\)', source)
    unique: List[Tuple[Optional[str], str]] = []
    for sample in samples:
        if sample not in unique:
            unique.append(sample)
    return unique


DOC_COMMANDS = _doc_commands()
SAMPLES = DOC_COMMANDS + EVERY_PARAMETER + (DEV_LINE_PARAMETERS if "torchrun" in COMPONENTS else [])


def _materialize(fn: Callable[..., AppDef], args: List[str]) -> Tuple[Optional[AppDef], str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchx's deprecation and GPU-count warnings
        try:
            return materialize_appdef(fn, list(args)), ""
        except (ValueError, KeyError, SystemExit) as e:
            return None, f"{type(e).__name__}: {e}"


def _j(args: List[str]) -> str:
    return args[args.index("-j") + 1] if "-j" in args else ""


def _meaning(app: AppDef, extra_env: Dict[str, str], image_given: bool) -> Dict[str, Any]:
    """The fields that carry meaning; the default image is ours by design (torchx-elastic)."""
    (role,) = app.roles
    env = {k: v for k, v in role.env.items() if k not in extra_env}
    return {
        "name": app.name,
        "role": role.name,
        "image": role.image if image_given else "(default)",
        "replicas": (role.min_replicas, role.num_replicas),
        "resource": role.resource,
        "env": env,
        "ports": role.port_map,
        "retries": role.max_retries,
        "mounts": role.mounts,
        "metadata": getattr(app, "metadata", {}),
    }


def test_the_docs_give_samples_of_every_component() -> None:
    assert len(DOC_COMMANDS) >= 4, DOC_COMMANDS
    assert len(_doc_j_samples()) >= 6


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("args", SAMPLES, ids=[" ".join(s) for s in SAMPLES])
def test_same_job_as_torchx_component(component: str, args: List[str]) -> None:
    theirs, their_error = _materialize(getattr(torchx_dist, component), args)
    ours, our_error = _materialize(getattr(our_dist, component), args)
    if theirs is None:
        # what torchx refuses, ours refuses too; the one exception by design: spmd takes an
        # elastic -j (MIN:MAX nodes), which torchx's spmd cannot parse
        if component == "spmd" and ":" in _j(args) and "int()" in their_error:
            assert ours is not None, our_error
            assert ours.roles[0].min_replicas < ours.roles[0].num_replicas
            return
        assert ours is None, f"torchx's {component} refuses {args} ({their_error}); ours not"
        return
    assert ours is not None, f"ours refuses what torchx accepts: {our_error}"
    # torchx 0.7 does not set the run name the development line sets
    extra = {"TORCHX_TRACKING_RUN_NAME": ""}
    if "TORCHX_TRACKING_RUN_NAME" in theirs.roles[0].env:
        extra = {}
    image_given = "--image" in args
    assert _meaning(ours, extra, image_given) == _meaning(theirs, extra, image_given)
    # the agent gets the job size torchx gives torchrun
    (their_role,) = theirs.roles
    their_cmd = " ".join(their_role.args)
    nproc = re.search(r"--nproc_per_node (\d+)", their_cmd)
    assert nproc is not None
    our_args = ours.roles[0].args
    assert our_args[our_args.index("--nproc-per-node") + 1] == nproc.group(1)


@pytest.mark.parametrize(("host", "j"), _doc_j_samples())
def test_j_samples_parse_the_same(host: Optional[str], j: str) -> None:
    """torchx's own ``-j`` samples through torchx's parser and ours."""
    if host is None:
        assert parse_nnodes(j) == torchx_dist.parse_nnodes(j)
        return
    from torchx.components.structured_arg import StructuredJArgument

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            their = str(StructuredJArgument.parse_from(h=host, j=j))
        except ValueError:
            their = None
    role = _materialize(our_dist.spmd, ["--script", "t.py", "-h", host, "-j", j])[0]
    if their is None:
        assert role is None
        return
    assert role is not None
    (ours,) = role.roles
    nproc = ours.args[ours.args.index("--nproc-per-node") + 1]
    assert f"{ours.num_replicas}x{nproc}" == their


@pytest.mark.parametrize("j", ["4", "1x4", "2x4", "2:5x8", "1:2x4", "0:1x2", "01x4"])
def test_parse_nnodes_matches_torchx(j: str) -> None:
    assert parse_nnodes(j) == torchx_dist.parse_nnodes(j)
