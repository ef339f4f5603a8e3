"""The command that draws a job's timeline, as a scheduler names it to its user
(``torchx-elastic timeline <log dir | app handle>``, ``torchx_elastic/timeline/cli.py``).

Standard library only (the contract).
"""

from __future__ import annotations

PROGRAM = "torchx-elastic"  # the console script (pyproject.toml)
SUBCOMMAND = "timeline"
COMMAND = f"{PROGRAM} {SUBCOMMAND}"


def command_for(target: str) -> str:
    """The command a user types to draw ``target``'s timeline (a log directory or a handle)."""
    return f"{COMMAND} {target}"
