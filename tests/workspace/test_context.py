"""The workspace's build context: what .dockerignore leaves out, and a digest of content only."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Dict

import fsspec
import pytest

from torchx_elastic.schedulers.workspace.context import (
    WorkspaceNotFoundError,
    build_context,
    ignore_patterns,
)


def _tree(root: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _members(workspace: str) -> Dict[str, tarfile.TarInfo]:
    context = build_context(workspace)
    try:
        with tarfile.open(fileobj=context.file) as tar:
            return {m.name: m for m in tar.getmembers()}
    finally:
        context.close()


def _files(workspace: str) -> set[str]:
    return {name for name, m in _members(workspace).items() if m.isfile()}


def test_without_dockerfile_the_context_gets_torchx_default(tmp_path: Path) -> None:
    _tree(tmp_path, {"train.py": "print(1)\n", "lib/util.py": ""})
    context = build_context(str(tmp_path))
    try:
        assert context.dockerfile == "torchx default (COPY . .)"
        assert context.files == 2
        with tarfile.open(fileobj=context.file) as tar:
            dockerfile = tar.extractfile("Dockerfile.torchx")
            assert dockerfile is not None
            assert b"FROM $IMAGE" in dockerfile.read()
            assert {"train.py", "lib", "lib/util.py", "Dockerfile.torchx"} == set(tar.getnames())
    finally:
        context.close()


def test_the_workspace_dockerfile_is_used_and_always_sent(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "Dockerfile.torchx": "ARG IMAGE\nFROM $IMAGE\nCOPY train.py .\n",
            "train.py": "",
            ".dockerignore": "*\n",
        },
    )
    context = build_context(f"file://{tmp_path}")
    try:
        assert context.dockerfile == "Dockerfile.torchx"
    finally:
        context.close()
    # "*" ignores everything but the Dockerfile and .dockerignore, as docker build does
    assert _files(str(tmp_path)) == {"Dockerfile.torchx", ".dockerignore"}


def test_dockerignore_follows_docker_rules(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            ".dockerignore": "# data stays home\n\ndata/\n**/*.pyc\n/secrets.env\n"
            "*.log\n!keep.log\n",
            "train.py": "",
            "data/big.bin": "x",
            "data/sub/more.bin": "x",
            "pkg/mod.py": "",
            "pkg/__pycache__/mod.cpython-311.pyc": "",
            "secrets.env": "TOKEN=1",
            "run.log": "",
            "keep.log": "",
            "pkg/deep.log": "",  # "*.log" does not cross "/", as in Docker
        },
    )
    assert _files(str(tmp_path)) == {
        ".dockerignore",
        "train.py",
        "pkg/mod.py",
        "keep.log",
        "pkg/deep.log",
        "Dockerfile.torchx",
    }


def test_ignore_patterns_drop_comments_and_blank_lines() -> None:
    assert ignore_patterns("# c\n\n  a/b  \n!c\n") == ["a/b", "!c"]


def test_same_content_same_digest_whatever_the_mtime_and_path(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one", {"train.py": "print(1)\n", "a/b.txt": "b"})
    two = _tree(tmp_path / "two", {"a/b.txt": "b", "train.py": "print(1)\n"})
    os.utime(two / "train.py", (1, 1))
    first, second = build_context(str(one)), build_context(str(two))
    assert first.digest == second.digest
    first.close()
    second.close()


def test_a_change_of_content_or_mode_changes_the_digest(tmp_path: Path) -> None:
    _tree(tmp_path, {"train.py": "print(1)\n"})

    def digest() -> str:
        context = build_context(str(tmp_path))
        context.close()
        return context.digest

    before = digest()
    (tmp_path / "train.py").write_text("print(2)\n")
    edited = digest()
    (tmp_path / "train.py").chmod(0o755)
    executable = digest()
    assert len({before, edited, executable}) == 3
    members = _members(str(tmp_path))
    assert members["train.py"].mode == 0o755
    assert members["train.py"].mtime == 0 and members["train.py"].uid == 0


def test_a_memory_workspace_as_torchx_tests_use() -> None:
    fs = fsspec.filesystem("memory")
    fs.mkdirs("ws_test/bar", exist_ok=True)
    with fs.open("ws_test/bar/foo.sh", "w") as f:
        f.write("exit 0")
    with fs.open("ws_test/.dockerignore", "w") as f:
        f.write("*.tmp\n")
    with fs.open("ws_test/x.tmp", "w") as f:
        f.write("")
    assert _files("memory://ws_test") == {"bar/foo.sh", ".dockerignore", "Dockerfile.torchx"}


def test_a_missing_workspace_says_how_to_do_without(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceNotFoundError) as error:
        build_context(str(tmp_path / "nope"))
    assert str(error.value) == (
        f"workspace {tmp_path / 'nope'} is not a directory; pass --workspace DIR (default: the"
        " current directory), or --workspace '' to run the role's image as it is"
    )


def test_the_checkout_context_leaves_out_every_venv_and_leaves_no_file(tmp_path: Path) -> None:
    """The checkout is the default workspace of `torchx run -s docker`; `make` puts a venv per
    torch line beside the code (several GB each), and none of them may reach the image."""
    checkout = Path(__file__).resolve().parents[2]
    _tree(
        tmp_path,
        {
            ".dockerignore": (checkout / ".dockerignore").read_text(),
            "main.py": "",
            ".venv/bin/python": "",
            ".venv-torch2.15.0/lib/torch.so": "",
            ".venv-torchx-nightly/bin/torchx": "",
        },
    )
    temp_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    before = set(temp_dir.glob("torchx-workspace-*"))
    assert _files(str(tmp_path)) == {".dockerignore", "main.py", "Dockerfile.torchx"}
    assert set(temp_dir.glob("torchx-workspace-*")) == before
