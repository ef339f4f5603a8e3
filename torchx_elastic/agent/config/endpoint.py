"""Rendezvous endpoints: ``${VAR:-default}`` expansion and host/port splitting."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

_VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-=])(?P<default>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def expand_variables(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Expand ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}`` like a shell.

    ``:=`` behaves as ``:-`` (nothing is assigned). No command substitution, no globbing.
    """
    env = os.environ if environ is None else environ

    def replace(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        value = env.get(name)
        op = match["op"]
        if op is None:
            return value or ""
        if op.startswith(":"):
            return value if value else match["default"]
        return value if value is not None else match["default"]

    return _VARIABLE.sub(replace, text)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, default_port: int = 29400) -> Endpoint:
        """``host``, ``host:port``, ``[v6addr]:port``; variables are expanded first.

        An empty text is ``localhost`` on ``default_port``, as torch's rendezvous reads it.
        """
        if not text.strip():
            return cls("localhost", default_port)
        expanded = expand_variables(text).strip()
        if not expanded:
            raise ValueError(
                f"rendezvous endpoint {text!r} is empty after expanding variables;"
                " expected HOST[:PORT], e.g. node0:29500"
            )
        host, port = expanded, default_port
        if expanded.startswith("["):
            closing = expanded.find("]")
            host = expanded[1:closing]
            rest = expanded[closing + 1 :]
            if rest.startswith(":"):
                port = cls._port(text, rest[1:])
        elif expanded.count(":") == 1:
            host, port_text = expanded.split(":")
            port = cls._port(text, port_text)
        if not host:
            raise ValueError(
                f"rendezvous endpoint {text!r} (expanded: {expanded!r}) has no host;"
                " expected HOST[:PORT], e.g. node0:29500"
            )
        return cls(host, port)

    @staticmethod
    def _port(text: str, port_text: str) -> int:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ValueError(
                f"rendezvous endpoint {text!r} has an invalid port {port_text!r};"
                " expected a number from 0 to 65535 (0 picks a free port, single node only)"
            )
        return int(port_text)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"
