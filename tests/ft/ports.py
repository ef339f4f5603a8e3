"""Free ports for the Lighthouse role, which binds two: its own and the registry's after it."""

from __future__ import annotations

import socket


def free_port_pair() -> int:
    """A port P with P and P + 1 free (the Lighthouse and the groups' registry)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")
