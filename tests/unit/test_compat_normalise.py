"""The torchrun compatibility harness makes uniform only what legitimately differs per run."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.compat_runner import Outcome, normalised_record, record_differences
from torchx_elastic.contract import CHANNEL_ENV


def _outcome(root: Path, port: int, launch_env: dict[str, str], port_given: bool = True) -> Outcome:
    """A run of a form that names ``{port}`` (``port``), unless not ``port_given``."""
    return Outcome(launcher="x", root=root, port=port, launch_env=launch_env, port_given=port_given)


def _record(root: Path, env: dict[str, str], argv: list[str]) -> dict[str, object]:
    return {
        "env": env,
        "argv": argv,
        "file": str(root / "work" / argv[0]),
        "cwd": str(root / "work"),
        "executable": "/usr/bin/python3",
        "stdout_write_through": True,
    }


def test_ports_run_ids_paths_and_our_variables_are_made_uniform(tmp_path: Path) -> None:
    launch = {"PATH": "/bin", "HOME": "/root", "KEEP": "1"}
    outcome = _outcome(tmp_path, 29555, launch)
    env = {
        "PATH": "/bin",
        "KEEP": "1",
        "MASTER_PORT": "29555",
        "TORCHELASTIC_RUN_ID": "0b4c7e2a-1f0d-4c5e-9a57-2b1f7c3d9e10",
        "TORCHELASTIC_ERROR_FILE": f"{tmp_path}/logs/job_x/attempt_0/0/error.json",
        CHANNEL_ENV: "/tmp/sock",
        "RANK": "0",
    }
    record = _record(tmp_path, env, ["compat_worker.py", f"--out={tmp_path}/work/a"])
    assert normalised_record(record, outcome) == {
        "env_set_by_launcher": {
            "MASTER_PORT": "<the form's {port}>",
            "TORCHELASTIC_RUN_ID": "<a uuid>",
            "TORCHELASTIC_ERROR_FILE": "<a file under --log-dir>",
            "RANK": "0",
        },
        "env_removed_by_launcher": ["HOME"],
        "argv": ["compat_worker.py", "--out=<cwd>/a"],
        "file": "<cwd>/compat_worker.py",
        "cwd": "<cwd>",
        "executable": "/usr/bin/python3",
        "stdout_write_through": True,
    }


def test_a_value_the_user_chose_is_compared_as_is(tmp_path: Path) -> None:
    reference = _outcome(tmp_path / "a", 1000, {})
    ours = _outcome(tmp_path / "b", 2000, {})
    reference.records["rank0-attempt0"] = _record(
        reference.root, {"TORCHELASTIC_RUN_ID": "job42", "MASTER_PORT": "1000"}, ["w.py"]
    )
    ours.records["rank0-attempt0"] = _record(
        ours.root, {"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "1234"}, ["w.py"]
    )
    assert record_differences(reference, ours) == [
        'rank0-attempt0 env_set_by_launcher[MASTER_PORT]: torchrun "<the form\'s {port}>",'
        " ours '<another port>'",
        "rank0-attempt0 env_set_by_launcher[TORCHELASTIC_RUN_ID]: torchrun 'job42', ours 'none'",
    ]


def test_a_port_the_launchers_picked_themselves_is_not_the_forms(tmp_path: Path) -> None:
    """A form without ``{port}``: the port the harness held for it and let go may be the
    very one a launcher's store then gets from the kernel; neither is the form's."""
    reference = _outcome(tmp_path / "a", 1000, {}, port_given=False)
    ours = _outcome(tmp_path / "b", 2000, {}, port_given=False)
    reference.records["rank0-attempt0"] = _record(reference.root, {"MASTER_PORT": "1000"}, ["w.py"])
    ours.records["rank0-attempt0"] = _record(ours.root, {"MASTER_PORT": "41234"}, ["w.py"])
    assert record_differences(reference, ours) == []
    port = normalised_record(ours.records["rank0-attempt0"], ours)["env_set_by_launcher"]
    assert port == {"MASTER_PORT": "<a port of the launcher's>"}
