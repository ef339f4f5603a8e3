# Adapted from PyTorch's test/distributed/launcher/test_run.py and its worker scripts
# (test/distributed/launcher/bin/*), which carry this notice:
#
#   Copyright (c) Facebook, Inc. and its affiliates.
#   All rights reserved.
#
#   This source code is licensed under the BSD-style license found in the
#   LICENSE file in the root directory of this source tree.
"""torch's own launcher tests, run against ``python -m torchx_elastic.agent``.

Each test keeps torch's command line; where torch calls ``launch.main(args)`` in its own
process, the agent runs as a subprocess, and an exception torch expects is the agent's exit 1
with its message. The worker scripts are torch's ``bin/`` scripts, written into the test's
directory (they are not in the wheel); both spellings of their flags are accepted, as
torch's test passes ``--touch-file-dir`` to a script that declares ``--touch_file_dir``.

Not adapted, because they patch torch's launcher in the test's own process (the agent is
another program): ``test_nproc_gpu_launch_configurations`` and
``test_nproc_xpu_launch_configurations`` (mocked device counts; the stub-driver tests count
devices for real), ``test_launch_elastic_agent_raise_exception`` (a mocked
``LocalElasticAgent.run``), ``test_launch_shutdown`` (a mocked rendezvous handler), and
``test_virtual_local_rank`` (two GPUs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from tests.conftest import _env
from tests.e2e.agents import free_port
from torchx_elastic.contract.agent_args import parse_node_range

pytestmark = [pytest.mark.slow, pytest.mark.torch_lines]

TEST_SCRIPT = """\
import argparse
import os
from pathlib import Path


def parse_args():
    parser = argparse.ArgumentParser(description="test script")
    parser.add_argument("--fail", default=False, action="store_true")
    parser.add_argument("--touch-file-dir", "--touch_file_dir", type=str)
    return parser.parse_args()


def main():
    args = parse_args()
    env_vars = [
        "LOCAL_RANK",
        "RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "OMP_NUM_THREADS",
        "TEST_SENTINEL_PARENT",
        "TORCHELASTIC_ERROR_FILE",
    ]
    print("Distributed env vars set by agent:")
    for env_var in env_vars:
        value = os.environ[env_var]
        print(f"{env_var} = {value}")
    if args.fail:
        raise RuntimeError("raising exception since --fail flag was set")
    else:
        file = os.path.join(args.touch_file_dir, os.environ["RANK"])
        Path(file).touch()
        print(f"Success, created {file}")


if __name__ == "__main__":
    main()
"""

TEST_SCRIPT_SH = """\
#!/bin/bash
FILE="$1/$RANK"
echo "creating $FILE"
touch "$FILE"
"""

IS_TORCHELASTIC_LAUNCHED = """\
import argparse

import torch.distributed as dist


def parse_args():
    parser = argparse.ArgumentParser(description="test script")
    parser.add_argument("--out-file", "--out_file")
    return parser.parse_args()


def main():
    args = parse_args()
    with open(args.out_file, "w") as out:
        out.write(f"{dist.is_torchelastic_launched()}")


if __name__ == "__main__":
    main()
"""

INIT_METHOD = """\
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args():
    parser = argparse.ArgumentParser(description="test script")
    parser.add_argument("--init-method", "--init_method", type=str, required=True)
    parser.add_argument("--world-size", "--world_size", type=int,
                        default=os.getenv("WORLD_SIZE", -1))
    parser.add_argument("--rank", type=int, default=os.getenv("RANK", -1))
    return parser.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(
        backend="gloo", init_method=args.init_method, world_size=args.world_size, rank=args.rank
    )
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    t = F.one_hot(torch.tensor(rank), num_classes=world_size)
    dist.all_reduce(t)
    derived_world_size = torch.sum(t).item()
    if derived_world_size != world_size:
        raise RuntimeError(
            f"Wrong world size derived. Expected: {world_size}, Got: {derived_world_size}"
        )
    print("Done")


if __name__ == "__main__":
    main()
"""


class Launcher:
    """torch's ``ElasticLaunchTest`` fixture: a touch-file directory, the ``bin/`` scripts,
    no ``PET_*`` variables and the ``TEST_SENTINEL_PARENT`` the workers check."""

    def __init__(self, root: Path) -> None:
        self.test_dir = root / "touched"
        self.test_dir.mkdir()
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, text in (
            ("test_script.py", TEST_SCRIPT),
            ("test_script.sh", TEST_SCRIPT_SH),
            ("test_script_is_torchelastic_launched.py", IS_TORCHELASTIC_LAUNCHED),
            ("test_script_init_method.py", INIT_METHOD),
        ):
            (self.bin / name).write_text(text)
        (self.bin / "test_script.sh").chmod(0o755)
        self.env = {k: v for k, v in _env().items() if not k.startswith("PET_")}
        self.env["TEST_SENTINEL_PARENT"] = "FOOBAR"

    def path(self, script: str) -> str:
        return str(self.bin.parent / script)

    def start(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "torchx_elastic.agent", *args],
            cwd=self.bin.parent,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def main(
        self, args: list[str], env: dict[str, str] | None = None, returncode: int = 0
    ) -> subprocess.CompletedProcess[str]:
        """torch's ``launch.main(args)``: the agent, which must exit with ``returncode``."""
        proc = self.start(args, env)
        try:
            out, err = proc.communicate(timeout=240)
        finally:
            proc.kill()
        assert proc.returncode == returncode, f"stdout:\n{out}\nstderr:\n{err}"
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def touched(self) -> set[str]:
        return set(os.listdir(self.test_dir))


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    return Launcher(tmp_path)


def ranks(world_size: int) -> set[str]:
    return {str(i) for i in range(world_size)}


def test_launch_user_script_python(launcher: Launcher) -> None:
    run_id = str(uuid.uuid4().int)
    nnodes = 1
    nproc_per_node = 4
    args = [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        f"--rdzv-id={run_id}",
        "--monitor-interval=1",
        "--start-method=spawn",
        launcher.path("bin/test_script.py"),
        f"--touch-file-dir={launcher.test_dir}",
    ]
    launcher.main(args)
    assert launcher.touched() == ranks(nnodes * nproc_per_node)


def test_launch_user_script_python_caffe2_bc(launcher: Launcher) -> None:
    nnodes = 1
    nproc_per_node = 4
    args = [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--monitor-interval=1",
        "--start-method=spawn",
        "--master-addr=localhost",
        f"--master-port={free_port()}",
        "--node-rank=0",
        launcher.path("bin/test_script.py"),
        f"--touch-file-dir={launcher.test_dir}",
    ]
    launcher.main(args)
    assert launcher.touched() == ranks(nnodes * nproc_per_node)


NO_PYTHON_WITH_MODULE = "--no-python and -m cannot be used together"


@pytest.mark.parametrize("nproc", [4, None], ids=["bash", "default_nproc"])
def test_launch_user_script_bash(launcher: Launcher, nproc: int | None) -> None:
    run_id = str(uuid.uuid4().int)
    args = [
        "--nnodes=1",
        *([f"--nproc-per-node={nproc}"] if nproc else []),
        f"--rdzv-id={run_id}",
        "--monitor-interval=1",
        "--start-method=spawn",
        "--no-python",
    ]
    script_args = [launcher.path("bin/test_script.sh"), str(launcher.test_dir)]
    # --no-python cannot be used with --module (torch: ValueError)
    refused = launcher.main([*args, "--module", *script_args], returncode=1)
    assert NO_PYTHON_WITH_MODULE in refused.stderr
    launcher.main(args + script_args)
    assert launcher.touched() == ranks(nproc or 1)


def test_launch_with_env_vars(launcher: Launcher) -> None:
    nnodes = 1
    nproc_per_node = 4
    env = {
        "PET_NNODES": str(nnodes),
        "PET_NPROC_PER_NODE": str(nproc_per_node),
        "PET_RDZV_ID": str(uuid.uuid4().int),
        "PET_MONITOR_INTERVAL": "1",
        "PET_START_METHOD": "spawn",
        "PET_NO_PYTHON": "1",
    }
    script_args = [launcher.path("bin/test_script.sh"), str(launcher.test_dir)]
    refused = launcher.main(script_args, env={**env, "PET_MODULE": "1"}, returncode=1)
    assert NO_PYTHON_WITH_MODULE in refused.stderr
    launcher.main(script_args, env={**env, "PET_MODULE": "0"})
    assert launcher.touched() == ranks(nnodes * nproc_per_node)


def nproc_launch(launcher: Launcher, nproc_type: str, returncode: int = 0) -> str:
    args = [
        "--nnodes=1",
        f"--nproc-per-node={nproc_type}",
        f"--rdzv-id={uuid.uuid4().int}",
        "--monitor-interval=1",
        "--start-method=spawn",
        "--no-python",
    ]
    script_args = [launcher.path("bin/test_script.sh"), str(launcher.test_dir)]
    return launcher.main(args + script_args, returncode=returncode).stderr


def test_nproc_launch_auto_configurations(launcher: Launcher) -> None:
    # torch patches torch.accelerator.is_available to False: this machine has no GPU
    assert not torch.cuda.is_available()
    expected = len(os.sched_getaffinity(0))  # torchrun's count: the CPUs this process may use
    nproc_launch(launcher, "auto")
    assert launcher.touched() == ranks(expected)


def test_nproc_launch_number_configurations(launcher: Launcher) -> None:
    nproc_launch(launcher, "4")
    assert launcher.touched() == ranks(4)


def test_nproc_launch_unknown_configurations(launcher: Launcher) -> None:
    # torch: ValueError
    assert "--nproc-per-node 'unknown'" in nproc_launch(launcher, "unknown", returncode=1)


def elastic_args(rdzv_conf: str, *more: str) -> list[str]:
    return [
        "--nnodes=1:2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=localhost:{free_port()}",
        rdzv_conf,
        f"--rdzv-id={uuid.uuid4().int}",
        "--monitor-interval=1",
        *more,
        "--start-method=spawn",
    ]


QUOTED_CONF = "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'"
QUOTED_CONF_WARNING = (
    "[torchx-elastic WARNING] --rdzv-conf \"'join_timeout\", 'timeout': the c10d rendezvous"
    " does not read these settings, so they are ignored (as torchrun ignores them)"
)


def test_launch_elastic(launcher: Launcher) -> None:
    # one node of 1:2, with torch's --rdzv-conf: one argv element, its quotes included
    args = elastic_args(QUOTED_CONF)
    args += [launcher.path("bin/test_script.py"), f"--touch-file-dir={launcher.test_dir}"]
    result = launcher.main(args)
    assert launcher.touched() == ranks(4)
    assert result.stderr.count(QUOTED_CONF_WARNING) == 1


def test_launch_elastic_worker_raise_exception(launcher: Launcher) -> None:
    # torch: ChildFailedError, and one event recorded (here: by the console event handler)
    args = elastic_args(QUOTED_CONF, "--max-restarts=0", "--event-log-handler=console")
    args += [launcher.path("bin/test_script.py"), "--fail"]
    result = launcher.main(args, returncode=1)
    output = result.stdout + result.stderr
    assert "RuntimeError: raising exception since --fail flag was set" in output
    # as torch's launch_agent: the agent's run succeeded, its workers did not
    events = [line for line in output.splitlines() if "torchelastic.worker.status." in line]
    assert len(events) == 1 and "torchelastic.worker.status.SUCCEEDED" in events[0], output


def test_launch_standalone(launcher: Launcher) -> None:
    args = [
        "--nnodes=1",
        "--nproc-per-node=4",
        "--standalone",
        "--monitor-interval=1",
        "--start-method=spawn",
        launcher.path("bin/test_script.py"),
        f"--touch-file-dir={launcher.test_dir}",
    ]
    launcher.main(args)
    assert launcher.touched() == ranks(4)


def test_launch_run_path(launcher: Launcher) -> None:
    args = [
        "--run-path",
        "--nnodes=1",
        "--nproc-per-node=4",
        "--monitor-interval=1",
        "--start-method=spawn",
        launcher.path("bin/test_script.py"),
        f"--touch-file-dir={launcher.test_dir}",
    ]
    launcher.main(args)
    assert launcher.touched() == ranks(4)


def test_launch_elastic_multiple_agents(launcher: Launcher) -> None:
    args = elastic_args("--rdzv_conf=timeout=5")
    args += [launcher.path("bin/test_script.py"), f"--touch-file-dir={launcher.test_dir}"]
    other = launcher.start(args)
    try:
        launcher.main(args)
        out, err = other.communicate(timeout=240)
    finally:
        other.kill()
    assert other.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert launcher.touched() == ranks(8)


def test_min_max_nodes_parse() -> None:
    assert parse_node_range("1") == (1, 1)
    assert parse_node_range("2:20") == (2, 20)
    with pytest.raises(ValueError):  # torch: RuntimeError
        parse_node_range("2:20:30")


@pytest.mark.parametrize("logs_specs", [[], ["--logs_specs=default"]], ids=["plain", "logs_specs"])
def test_is_torchelastic_launched(launcher: Launcher, logs_specs: list[str]) -> None:
    out_file = launcher.test_dir / "out"
    args = ["--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1"]
    args += [*logs_specs, launcher.path("bin/test_script_is_torchelastic_launched.py")]
    launcher.main([*args, f"--out-file={out_file}"])
    assert out_file.read_text() == "True"


def test_logs_logs_spec_entrypoint_must_be_defined(launcher: Launcher) -> None:
    # torch: ValueError
    result = launcher.main(
        [
            "--run-path",
            "--nnodes=1",
            "--nproc-per-node=1",
            "--monitor-interval=1",
            "--logs_specs=DOESNOT_EXIST",
            launcher.path("bin/test_script_is_torchelastic_launched.py"),
        ],
        returncode=1,
    )
    assert "DOESNOT_EXIST" in result.stderr


def test_is_not_torchelastic_launched(launcher: Launcher) -> None:
    out_file = launcher.test_dir / "out"
    script = launcher.path("bin/test_script_is_torchelastic_launched.py")
    subprocess.run([sys.executable, script, f"--out-file={out_file}"], env=launcher.env, check=True)
    assert out_file.read_text() == "False"


@pytest.mark.parametrize("init_method", ["tcp", "env"])
def test_init_method_with_torchelastic(launcher: Launcher, init_method: str) -> None:
    port = free_port()
    url = f"tcp://localhost:{port}" if init_method == "tcp" else "env://"
    launcher.main(
        [
            "--run-path",
            "--nnodes=1",
            "--nproc-per-node=4",
            "--master-addr=localhost",
            f"--master-port={port}",
            "--monitor-interval=1",
            launcher.path("bin/test_script_init_method.py"),
            f"--init-method={url}",
        ]
    )
    # nothing to validate, just make sure it runs


def test_capture_logs_using_default_logs_specs(launcher: Launcher) -> None:
    nproc_per_node = 4
    args = [
        "--nnodes=1",
        f"--nproc-per-node={nproc_per_node}",
        f"--rdzv-id={uuid.uuid4().int}",
        "--redirect=3",
        "--tee=3",
        "--monitor-interval=1",
        "--start-method=spawn",
        "--no-python",
        launcher.path("bin/test_script.sh"),
        str(launcher.test_dir),
    ]
    result = launcher.main(args, env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "})
    for i in range(nproc_per_node):
        assert f"[rank{i}]: creating " in result.stdout
