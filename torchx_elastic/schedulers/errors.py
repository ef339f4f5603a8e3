"""The base of every error a user can cause and fix through this package's schedulers."""

from __future__ import annotations


class UserError(Exception):
    """A mistake or a missing piece on the user's side (an option, a cluster, an image):
    its message says what is wrong and what to do, and the torchx CLI prints it alone
    (``cli_commands.py``), without a traceback."""
