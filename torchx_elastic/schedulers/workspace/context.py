"""The build context of a workspace: its files, minus ``.dockerignore``, as a tar and a digest.

The tar is deterministic (sorted entries, owner root, mtime 0, permission bits kept), so
the same tree always gives the same bytes and its sha256 names the built image: a second
run of an unchanged workspace finds the image by name and builds nothing. ``.dockerignore``
is read with docker-py's own matcher, a port of the Docker CLI's, so a pattern excludes
here what it excludes in ``docker build``.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Iterable, List, Mapping, Tuple

import fsspec
from docker.utils.build import PatternMatcher
from fsspec.implementations.local import LocalFileSystem
from torchx.workspace.docker_workspace import DEFAULT_DOCKERFILE, TORCHX_DOCKERFILE

DOCKERIGNORE = ".dockerignore"
_COPY_CHUNK_BYTES = 1 << 20


class WorkspaceNotFoundError(ValueError):
    """The workspace is not a directory."""

    def __init__(self, workspace: str) -> None:
        super().__init__(
            f"workspace {workspace} is not a directory; pass --workspace DIR (default: the"
            " current directory), or --workspace '' to run the role's image as it is"
        )


@dataclass(frozen=True)
class WorkspaceContext:
    """A build context written to ``file``; ``digest`` is the sha256 of its bytes."""

    file: IO[bytes]
    digest: str
    files: int
    size_bytes: int
    dockerfile: str  # "Dockerfile.torchx" of the workspace, or torchx's default

    def close(self) -> None:
        self.file.close()


def ignore_patterns(text: str) -> List[str]:
    """The patterns of a ``.dockerignore`` (blank lines and ``#`` comments dropped)."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _local_entries(root: str, patterns: List[str]) -> List[Tuple[str, os.stat_result]]:
    """(relative path, lstat) of what the Docker CLI would send, pruning ignored dirs."""
    matcher = PatternMatcher(patterns)
    entries = []
    for rel in matcher.walk(root):
        rel_posix = rel.replace(os.sep, "/")
        entries.append((rel_posix, os.lstat(os.path.join(root, rel))))
    return entries


def _fs_files(fs: Any, root: str, patterns: List[str]) -> List[Tuple[str, Mapping[str, Any]]]:
    """(relative path, info) of the files of a non-local fsspec workspace."""
    matcher = PatternMatcher(patterns)
    found: Mapping[str, Mapping[str, Any]] = fs.find(root, withdirs=False, detail=True)
    root = root.rstrip("/")
    files = []
    for name, info in found.items():
        rel = posixpath.relpath(name, root)
        if not matcher.matches(rel):
            files.append((rel, info))
    return files


def _add(
    tar: tarfile.TarFile,
    name: str,
    mode: int,
    data: IO[bytes] | None = None,
    size: int = 0,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size if kind == tarfile.REGTYPE else 0
    info.linkname = link
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, data)


class _HashingWriter(io.RawIOBase):
    """A file that hashes what is written through it."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size_bytes = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size_bytes

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.target.write(view)
        self.size_bytes += len(view)
        return len(view)


def build_context(workspace: str) -> WorkspaceContext:
    """The context of ``workspace`` (a directory or an fsspec URL such as ``file:///x``).

    Without a ``Dockerfile.torchx`` the context gets torchx's default one
    (``FROM $IMAGE`` then ``COPY . .``).
    """
    fs, root = fsspec.core.url_to_fs(workspace)
    if not fs.isdir(root):
        raise WorkspaceNotFoundError(workspace)
    ignore_path = posixpath.join(root, DOCKERIGNORE)
    patterns: List[str] = []
    if fs.isfile(ignore_path):
        with fs.open(ignore_path, "rt") as f:
            patterns = ignore_patterns(f.read())
    patterns.append(f"!{TORCHX_DOCKERFILE}")  # always sent, as docker build sends its Dockerfile

    # closed by WorkspaceContext.close() once built (or found built). A file with no name:
    # its space goes back when the process ends, however it ends (a killed `torchx run` left
    # named ones of several GB in the temp directory).
    out: IO[bytes] = tempfile.TemporaryFile(prefix="torchx-workspace-", suffix=".tar")  # noqa: SIM115
    writer = _HashingWriter(out)
    files = 0
    has_dockerfile = False
    with tarfile.open(fileobj=writer, mode="w") as tar:
        if isinstance(fs, LocalFileSystem):
            entries: Iterable[Tuple[str, Any]] = sorted(_local_entries(root, patterns))
            for rel, st in entries:
                full = os.path.join(root, rel)
                mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISLNK(st.st_mode):
                    _add(tar, rel, mode, kind=tarfile.SYMTYPE, link=os.readlink(full))
                elif stat.S_ISDIR(st.st_mode):
                    _add(tar, rel, mode, kind=tarfile.DIRTYPE)
                elif stat.S_ISREG(st.st_mode):
                    with open(full, "rb") as data:
                        _add(tar, rel, mode, data, st.st_size)
                    files += 1
                    has_dockerfile |= rel == TORCHX_DOCKERFILE
        else:
            for rel, info in sorted(_fs_files(fs, root, patterns), key=lambda e: e[0]):
                mode = stat.S_IMODE(int(info["mode"])) if "mode" in info else 0o644
                with fs.open(info["name"], "rb") as data:
                    _add(tar, rel, mode, data, int(info["size"]))
                files += 1
                has_dockerfile |= rel == TORCHX_DOCKERFILE
        if not has_dockerfile:
            _add(
                tar,
                TORCHX_DOCKERFILE,
                0o644,
                io.BytesIO(DEFAULT_DOCKERFILE),
                len(DEFAULT_DOCKERFILE),
            )
    out.flush()
    out.seek(0)
    return WorkspaceContext(
        file=out,
        digest=writer.sha256.hexdigest(),
        files=files,
        size_bytes=writer.size_bytes,
        dockerfile=TORCHX_DOCKERFILE if has_dockerfile else "torchx default (COPY . .)",
    )
