"""The size of the terminal a launcher draws on, for the workers' pseudo-terminals.

Under torchrun a worker inherits the terminal: ``isatty()`` is true and it reads the
terminal's size. Through ``torchx run -s local_cwd`` on a terminal the agents' output goes to
files, so local_cwd names a file in :data:`TERMINAL_SIZE_ENV` and keeps in it the size of the
terminal it draws on (``COLUMNS LINES``; ``0 0`` for a terminal that reports none), rewritten
when the terminal is resized; the agents give their workers pseudo-terminals of that size
(``agent/console/output/terminal.py``).

Standard library only.
"""

from __future__ import annotations

import os

# the file (``COLUMNS LINES``) local_cwd keeps the size of its terminal in
TERMINAL_SIZE_ENV = "TORCHX_ELASTIC_TERMINAL_SIZE_FILE"


def write_size(path: str, columns: int, lines: int) -> None:
    """Replace ``path`` with the size at once (a reader never sees half of it)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as file:
        file.write(f"{columns} {lines}\n")
    os.replace(temporary, path)


def read_size(path: str) -> tuple[int, int] | None:
    """The size in ``path``; None when it does not exist (yet) or is not ours."""
    try:
        with open(path, encoding="ascii") as file:
            columns, lines = file.read().split()
        return max(0, int(columns)), max(0, int(lines))
    except (OSError, ValueError):
        return None
