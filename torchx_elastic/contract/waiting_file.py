"""The waiting state of a node's first rendezvous round, in a file for ``torchx status``.

While a node waits for the others, its agent keeps ``waiting_for_nodes.<host>.<pid>.json``
in its log directory up to date (the line it prints: ``waiting for nodes: 1 of 2 joined;
...``) and removes it once the round is complete. local_cwd's status reads it from the
job's log directory.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import time

from torchx_elastic.contract import WAITING_FILE_PREFIX as PREFIX

STALE_S = 120.0  # a file older than this belongs to an agent that died while waiting


def path_in(log_dir: str) -> str:
    return os.path.join(log_dir, f"{PREFIX}{socket.gethostname()}.{os.getpid()}.json")


def write(log_dir: str, line: str) -> None:
    path = path_in(log_dir)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"message": line, "time": time.time()}, f)
    os.replace(tmp, path)


def clear(log_dir: str) -> None:
    try:
        os.remove(path_in(log_dir))
    except OSError:
        pass


def newest_message(dirs: list[str], now: float | None = None) -> str | None:
    """The newest waiting line of the agents writing in ``dirs``; None: nobody waits."""
    now = time.time() if now is None else now
    newest: tuple[float, str] | None = None
    for log_dir in dirs:
        for path in glob.glob(os.path.join(log_dir, f"{PREFIX}*.json")):
            try:
                with open(path, encoding="utf-8") as f:
                    record = json.load(f)
                at, message = float(record["time"]), str(record["message"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if now - at <= STALE_S and (newest is None or at > newest[0]):
                newest = (at, message)
    return newest[1] if newest else None
