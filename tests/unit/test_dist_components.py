import dataclasses
import inspect

import pytest
from torchx.specs import AppDef, macros

from torchx_elastic.components.dist import ddp, spmd, torchrun
from torchx_elastic.components.dist_app import DistApp
from torchx_elastic.components.ft import ddp as ft_ddp
from torchx_elastic.components.job_size import JobSizeError
from torchx_elastic.contract.agent_args import FORK_SERVER

HOSTILE_ARGS = (
    "a b",
    "$(touch /tmp/pwned)",
    "`id`",
    "; rm -rf /",
    "new\nline",
    "ünïcødé ✓",
    "'single' \"double\"",
    "${app_id}",
    "$$",
    "$HOME",
    "--nnodes=9",
    "",
)


def _apply(app: AppDef, replica_id: int = 0) -> list[str]:
    values = macros.Values(
        img_root="", app_id="app-123", replica_id=str(replica_id), rank0_env="RANK0_HOST"
    )
    return values.apply(app.roles[0]).args


def test_ddp_elastic_size_maps_to_replicas_and_agent_flags() -> None:
    app = ddp(script="main.py", j="2:4x8")
    role = app.roles[0]
    assert isinstance(app, AppDef)
    assert (role.min_replicas, role.num_replicas) == (2, 4)
    assert role.entrypoint == "python3"
    assert role.args[:2] == ["-m", "torchx_elastic.agent"]
    args = _apply(app)
    assert args[args.index("--nnodes") + 1] == "2:4"
    assert args[args.index("--nproc-per-node") + 1] == "8"
    assert args[args.index("--rdzv-endpoint") + 1] == "${RANK0_HOST:-localhost}:29500"
    assert args[args.index("--rdzv-id") + 1] == "app-123"
    assert role.port_map == {"c10d": 29500}
    assert role.name == "main"


def test_single_node_uses_a_free_port() -> None:
    args = _apply(ddp(script="main.py", j="1x2"))
    assert args[args.index("--rdzv-endpoint") + 1] == "localhost:0"


def test_user_arguments_survive_macro_substitution_byte_for_byte() -> None:
    args = _apply(ddp(*HOSTILE_ARGS, script="my script$.py", j="2x2"))
    assert args[-len(HOSTILE_ARGS) - 1 :] == ["my script$.py", *HOSTILE_ARGS]


def test_rdzv_conf_reaches_the_agent_as_written() -> None:
    args = _apply(ddp(script="main.py", j="2x2", rdzv_conf="x=${app_id},join_timeout=60"))
    assert args[args.index("--rdzv-conf") + 1] == "x=${app_id},join_timeout=60"


def test_module_form() -> None:
    app = ddp("--lr", "0.1", m="pkg.train", j="2")
    args = _apply(app)
    assert args[-4:] == ["-m", "pkg.train", "--lr", "0.1"]
    assert app.roles[0].name == "train"
    assert app.name == "train"


def test_max_retries_become_agent_restarts() -> None:
    app = ddp(script="main.py", max_retries=3)
    args = app.roles[0].args
    assert args[args.index("--max-restarts") + 1] == "3"
    assert app.roles[0].max_retries == 3


def test_env_debug_mounts_and_resources() -> None:
    app = ddp(
        script="main.py",
        env={"FOO": "bar"},
        debug=True,
        cpu=4,
        memMB=2048,
        mounts=["type=bind", "src=/data", "dst=/data", "readonly"],
    )
    role = app.roles[0]
    assert role.env["FOO"] == "bar"
    assert role.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert (role.resource.cpu, role.resource.memMB) == (4, 2048)
    assert role.mounts[0].src_path == "/data"  # type: ignore[union-attr]


def test_exactly_one_of_script_and_module() -> None:
    message = (
        "exactly one of --script and -m must be given (e.g. --script train.py or -m my_pkg.train)"
    )
    with pytest.raises(ValueError) as err:
        ddp(j="1x1")
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        ddp(script="a.py", m="b", j="1x1")
    assert str(err.value) == message


def test_bad_j_is_rejected_by_the_component() -> None:
    with pytest.raises(JobSizeError, match=r"^invalid -j '2x': not of the form"):
        ddp(script="main.py", j="2x")


def test_spmd_infers_procs_from_named_resource_gpus() -> None:
    app = spmd(script="train.py", j="2", h="aws_p4d.24xlarge")
    role = app.roles[0]
    assert role.num_replicas == 2
    assert role.args[role.args.index("--nproc-per-node") + 1] == "8"
    assert role.resource.gpu == 8


def test_spmd_elastic_nodes_on_gpu_host() -> None:
    role = spmd(script="train.py", j="1:3", h="aws_p4d.24xlarge").roles[0]
    assert (role.min_replicas, role.num_replicas) == (1, 3)


def test_hang_timeout_and_start_method_reach_the_agent() -> None:
    args = ddp(script="main.py", hang_timeout_s=600, start_method=FORK_SERVER).roles[0].args
    assert args[args.index("--hang-timeout-s") + 1] == "600"
    assert args[args.index("--start-method") + 1] == FORK_SERVER


def test_bad_start_method_and_hang_timeout_say_what_is_accepted() -> None:
    with pytest.raises(ValueError) as err:
        ddp(script="main.py", start_method="fork_server")
    assert str(err.value) == (
        "start_method 'fork_server' is not a start method: fork-server (ours, with a hyphen:"
        " workers forked from a process that imported torch once) or torchrun's spawn, fork,"
        " forkserver (as torchrun means them)"
    )
    with pytest.raises(ValueError) as err:
        ddp(script="main.py", hang_timeout_s=-1)
    assert str(err.value) == "invalid hang_timeout_s -1; accepted: 0 (off) or seconds > 0"


def test_console_choice_reaches_the_agent_and_auto_is_left_to_it() -> None:
    assert "--console" not in ddp(script="main.py").roles[0].args
    for component in (ddp, torchrun, spmd):
        args = component(script="main.py", console="plain").roles[0].args
        assert args[args.index("--console") + 1] == "plain"
    with pytest.raises(ValueError) as err:
        ddp(script="main.py", console="fancy")
    assert str(err.value) == "invalid console 'fancy'; accepted: auto, plain, live"


@pytest.mark.parametrize("j", ["2x2", "1x2"])
def test_static_rendezvous_gives_each_node_its_rank_and_a_fixed_port(j: str) -> None:
    app = ddp(script="main.py", j=j, rdzv_backend="static")
    for replica_id in (0, 1):
        args = _apply(app, replica_id)
        assert args[args.index("--rdzv-backend") + 1] == "static"
        assert args[args.index("--node-rank") + 1] == str(replica_id)
        assert args[args.index("--rdzv-endpoint") + 1].endswith(":29500")


def test_tee_keeps_the_other_streams_off_the_console() -> None:
    args = _apply(ddp(script="main.py", j="1x2", tee=2))
    assert args[args.index("--tee") + 1] == "2"
    assert args[args.index("--redirects") + 1] == "3"
    assert "--redirects" not in _apply(ddp(script="main.py", j="1x2"))


def test_workers_are_forked_from_the_fork_server_by_default_and_spawn_stays_an_option() -> None:
    for app in (ddp(script="main.py"), spmd(script="main.py")):
        args = app.roles[0].args
        assert args[args.index("--start-method") + 1] == FORK_SERVER
    args = ddp(script="main.py", start_method="spawn").roles[0].args
    assert args[args.index("--start-method") + 1] == "spawn"


# each component's parameters that are not DistApp fields: read by the component itself
_OWN_PARAMETERS = {
    "j",
    "script_args",
    "args",
    "replica_groups",
    "min_replica_groups",
    "lighthouse_port",
    "join_timeout_ms",
    "heartbeat_timeout_ms",
}


@pytest.mark.parametrize("component", [torchrun, ddp, spmd, ft_ddp])
def test_every_component_parameter_reaches_the_app_by_its_name(component) -> None:
    # DistApp.from_component takes a component's parameters by name: one renamed on only
    # one side would be dropped without a word
    fields = {f.name for f in dataclasses.fields(DistApp)}
    parameters = set(inspect.signature(component).parameters)
    assert parameters - fields - _OWN_PARAMETERS == set()


def test_spmd_and_ft_take_the_fields_they_do_not_name_from_dist_torchrun() -> None:
    # DistApp's defaults stand in for the parameters a component does not take
    torchrun_defaults = {
        name: {} if name in ("env", "metadata") else [] if name == "mounts" else p.default
        for name, p in inspect.signature(torchrun).parameters.items()
        if p.kind is not inspect.Parameter.VAR_POSITIONAL
    }
    for f in dataclasses.fields(DistApp):
        if f.default_factory is not dataclasses.MISSING:
            assert f.default_factory() == torchrun_defaults[f.name], f.name
        elif f.default is not dataclasses.MISSING and f.name in torchrun_defaults:
            assert f.default == torchrun_defaults[f.name], f.name


def test_the_health_check_reaches_the_agent_as_written() -> None:
    for component in (ddp, torchrun, spmd):
        check = 'nvidia-smi -q | grep -q "Retired Pages" && test "$HOME"'
        args = component(script="train.py", j="2x1", health_check=check).roles[0].args
        # torchx's macro substitution reads "$$" as "$": the agent gets the command as written
        assert args[args.index("--health-check") + 1] == check.replace("$", "$$")
        assert "--health-check" not in component(script="train.py", j="2x1").roles[0].args


def test_spares_are_replicas_beyond_the_size_that_share_its_rendezvous() -> None:
    for component in (ddp, torchrun, spmd):
        role = component(script="train.py", j="2x1", spares=1).roles[0]
        assert (role.min_replicas, role.num_replicas) == (2, 3)
        assert role.args[role.args.index("--nnodes") + 1] == "2"  # the job's size, not 3
        assert role.args[role.args.index("--spares") + 1] == "1"  # the agents know of them
        assert "--spares" not in component(script="train.py", j="2x1").roles[0].args
    # one node and a spare: the two meet at the rank-0 host, not each on its own free port
    args = ddp(script="train.py", j="1x2", spares=1).roles[0].args
    assert args[args.index("--rdzv-endpoint") + 1].endswith("-localhost}:29500")
    with pytest.raises(ValueError) as err:
        ddp(script="train.py", j="2x1", spares=-1)
    assert str(err.value) == "invalid spares -1; accepted: 0 (none) or more nodes standing by"
