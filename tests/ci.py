"""Running in CI: what a test does when something it needs is missing.

``.ci/run`` sets ``CI=true``. There, a test whose engine, cluster or privilege is missing fails
(CI installs them all: a skip would hide that it never ran); elsewhere it skips and says why.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """Whether these tests run in CI (``CI`` set to 1, true or yes, in any case)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``; in CI, fail it (``CI=true and <reason>``)."""
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)
