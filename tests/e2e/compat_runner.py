"""Run one torchrun command-line form through a launcher and collect what its workers saw.

A launcher is the real ``torchrun`` of this virtual environment or ``python -m
torchx_elastic.agent``. Each runs in a directory of its own (``work/`` holds the worker
scripts and is the working directory, ``logs/`` is the ``{log_dir}`` of the form,
``dumps/`` receives the workers' records), with the same environment, so that what differs
between the two can only come from the launcher.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import BIN, _env
from tests.e2e.agents import free_port

HERE = Path(__file__).resolve().parent
WORKER_PY = HERE / "compat_worker.py"
WORKER_SH = """#!/bin/sh
# compat_worker.sh: a non-Python entry point (torchrun --no-python) that records through
# compat_worker.py what it was given; $0 is kept for the record.
COMPAT_SHELL_ARGV0="$0" exec python3 "$(dirname "$0")/compat_worker.py" "$@"
"""
LAUNCH_TIMEOUT_S = 240.0
OMP_WARNING = "Setting OMP_NUM_THREADS environment variable for each process to be 1"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# digits only: torchrun's console can run two ranks' lines together ("attempt=0compat-...")
MARKER = re.compile(r"compat-(stdout|stderr) rank=(\d+) attempt=(\d+)")

# the two launchers, as the command that precedes the form's arguments
LAUNCHERS: dict[str, list[str]] = {
    "torchrun": [str(BIN / "torchrun")],
    "agent": [sys.executable, "-m", "torchx_elastic.agent"],
}


@dataclass(frozen=True)
class Node:
    """One launcher process of a form: its arguments and extra environment.

    ``{port}`` (a free port, the same for every node of one run), ``{cwd}`` (the absolute
    working directory) and ``{log_dir}`` are filled in per run, in arguments and values."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class Outcome:
    """What one launcher did with one form."""

    launcher: str
    root: Path
    port: int
    port_given: bool = False  # whether the form names ``{port}`` (else the launcher picks one)
    exit_codes: list[int] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    launch_env: dict[str, str] = field(default_factory=dict)
    records: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def workdir(self) -> Path:
        return self.root / "work"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def console_markers(self, stream: str) -> set[str]:
        """The workers' marker lines that reached the launcher's stdout or stderr."""
        texts = self.stdout if stream == "stdout" else self.stderr
        return {m.group(0) for text in texts for m in MARKER.finditer(text)}

    def marker_lines(self) -> dict[str, str]:
        """Each marker with the whole console line it is on (to compare line prefixes)."""
        lines: dict[str, str] = {}
        for text in self.stdout + self.stderr:
            for line in text.splitlines():
                found = MARKER.search(line)
                if found:
                    lines[found.group(0)] = line
        return lines

    def file_markers(self) -> set[str]:
        """The marker lines found in files under the log directory."""
        found: set[str] = set()
        if self.log_dir.exists():
            for path in self.log_dir.rglob("*"):
                if path.is_file():
                    text = path.read_text(errors="replace")
                    found |= {m.group(0) for m in MARKER.finditer(text)}
        return found

    def omp_warnings(self) -> list[int]:
        pairs = zip(self.stdout, self.stderr, strict=True)
        return [(out + err).count(OMP_WARNING) for out, err in pairs]

    def describe(self) -> str:
        parts = [f"--- {self.launcher} exit codes {self.exit_codes}"]
        for index, (out, err) in enumerate(zip(self.stdout, self.stderr, strict=True)):
            parts.append(f"--- {self.launcher} node {index} stdout:\n{out[-3000:]}")
            parts.append(f"--- {self.launcher} node {index} stderr:\n{err[-3000:]}")
        return "\n".join(parts)


def _fill(text: str, outcome: Outcome) -> str:
    return (
        text.replace("{port}", str(outcome.port))
        .replace("{cwd}", str(outcome.workdir))
        .replace("{log_dir}", str(outcome.log_dir))
    )


def prepare(launcher: str, root: Path) -> Outcome:
    outcome = Outcome(launcher=launcher, root=root, port=free_port())
    outcome.workdir.mkdir(parents=True)
    (root / "dumps").mkdir()
    shutil.copy(WORKER_PY, outcome.workdir / "compat_worker.py")
    script = outcome.workdir / "compat_worker.sh"
    script.write_text(WORKER_SH)
    script.chmod(0o755)
    return outcome


def start(outcome: Outcome, nodes: tuple[Node, ...]) -> list[subprocess.Popen[bytes]]:
    """Start every node of the form (each a launcher process) in the background."""
    base = {"COMPAT_DUMP_DIR": str(outcome.root / "dumps")}
    outcome.launch_env = _env(base)
    outcome.port_given = any(
        "{port}" in text for node in nodes for text in (*node.args, *(v for _, v in node.env))
    )
    processes = []
    for index, node in enumerate(nodes):
        env = _env({**base, **{key: _fill(value, outcome) for key, value in node.env}})
        if index == 0:
            outcome.launch_env = env
        args = [_fill(arg, outcome) for arg in node.args]
        with (
            open(outcome.root / f"node{index}.out", "wb") as out,
            open(outcome.root / f"node{index}.err", "wb") as err,
        ):
            processes.append(
                subprocess.Popen(
                    [*LAUNCHERS[outcome.launcher], *args],
                    cwd=outcome.workdir,
                    env=env,
                    stdout=out,
                    stderr=err,
                )
            )
    return processes


def finish(outcome: Outcome, processes: list[subprocess.Popen[bytes]], deadline: float) -> Outcome:
    """Wait for every node (killing what outlives the deadline) and read the records."""
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for index, process in enumerate(processes):
        outcome.exit_codes.append(process.returncode)
        outcome.stdout.append((outcome.root / f"node{index}.out").read_text(errors="replace"))
        outcome.stderr.append((outcome.root / f"node{index}.err").read_text(errors="replace"))
    for path in sorted((outcome.root / "dumps").glob("*.json")):
        outcome.records[path.stem] = json.loads(path.read_text())
    return outcome


def run_both(nodes: tuple[Node, ...], root: Path, together: bool = True) -> tuple[Outcome, Outcome]:
    """The form through torchrun and through our agent: side by side (each on its own
    free port) or, for forms on a fixed port, one after the other."""
    reference = prepare("torchrun", root / "torchrun")
    ours = prepare("agent", root / "agent")
    if together:
        started = [start(reference, nodes), start(ours, nodes)]
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        return finish(reference, started[0], deadline), finish(ours, started[1], deadline)
    finish(reference, start(reference, nodes), time.monotonic() + LAUNCH_TIMEOUT_S / 2)
    finish(ours, start(ours, nodes), time.monotonic() + LAUNCH_TIMEOUT_S / 2)
    return reference, ours


# what ours sets and torchrun does not, on purpose: a single-host job's gloo listens on
# loopback only (docs/security.md)
DELIBERATE_ENV = {("GLOO_SOCKET_IFNAME", "lo")}


def normalised_record(record: dict[str, object], outcome: Outcome) -> dict[str, object]:
    """What a worker saw, with what legitimately differs between two runs made uniform:
    the run's own directories, free ports, generated run ids, temporary file names and our
    own ``TORCHX_ELASTIC_*`` variables. Environment is kept as the change the launcher made
    to the environment it was started with (variables added, changed or removed)."""
    env = record["env"]
    assert isinstance(env, dict)
    launch_env = outcome.launch_env
    changed = {
        key: _normalised_value(key, str(value), outcome)
        for key, value in env.items()
        if launch_env.get(key) != value
        and not key.startswith("TORCHX_ELASTIC_")
        and (key, value) not in DELIBERATE_ENV
    }
    removed = sorted(key for key in launch_env if key not in env)
    argv = record["argv"]
    assert isinstance(argv, list)
    return {
        "env_set_by_launcher": changed,
        "env_removed_by_launcher": removed,
        "argv": [_paths(str(arg), outcome) for arg in argv],
        "file": _paths(str(record["file"]), outcome),
        "cwd": _paths(str(record["cwd"]), outcome),
        "executable": record["executable"],
        "stdout_write_through": record["stdout_write_through"],
    }


def _paths(text: str, outcome: Outcome) -> str:
    return text.replace(str(outcome.log_dir), "<log_dir>").replace(str(outcome.workdir), "<cwd>")


def _normalised_value(key: str, value: str, outcome: Outcome) -> str:
    if key == "MASTER_PORT":
        if not outcome.port_given:  # a free port of the launcher's, which may be the one
            return "<a port of the launcher's>"  # that the run held for {port} and let go
        return "<the form's {port}>" if value == str(outcome.port) else "<another port>"
    if key == "TORCHELASTIC_RUN_ID" and UUID.match(value):
        return "<a uuid>"
    if key in ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_TIMER_FILE"):
        inside = value.startswith(str(outcome.log_dir) + "/")
        return "<a file under --log-dir>" if inside else "<a file>"
    return _paths(value, outcome)


def shared_values(outcome: Outcome, key: str) -> dict[str, int]:
    """Per attempt, how many distinct values of ``key`` the workers saw (1: all agree)."""
    seen: dict[str, set[str]] = {}
    for name, record in outcome.records.items():
        env = record["env"]
        assert isinstance(env, dict)
        attempt = name.rsplit("attempt", 1)[1]
        seen.setdefault(attempt, set()).add(str(env.get(key)))
    return {attempt: len(values) for attempt, values in sorted(seen.items())}


def record_differences(torchrun: Outcome, ours: Outcome) -> list[str]:
    """Readable differences between the normalised records of the two launchers."""
    found = []
    for name in sorted(set(torchrun.records) | set(ours.records)):
        if name not in ours.records or name not in torchrun.records:
            found.append(f"{name}: only under {'torchrun' if name in torchrun.records else 'ours'}")
            continue
        expected = normalised_record(torchrun.records[name], torchrun)
        got = normalised_record(ours.records[name], ours)
        for field_name in expected:
            want, have = expected[field_name], got[field_name]
            if isinstance(want, dict) and isinstance(have, dict):
                for key in sorted(set(want) | set(have)):
                    if want.get(key) != have.get(key):
                        found.append(
                            f"{name} {field_name}[{key}]: torchrun {want.get(key, '<unset>')!r},"
                            f" ours {have.get(key, '<unset>')!r}"
                        )
            elif want != have:
                found.append(f"{name} {field_name}: torchrun {want!r}, ours {have!r}")
    return found
