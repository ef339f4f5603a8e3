"""The agent's in-process tests call torch's store from threads: each ends its threads."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _threads_of_each_test_ended(threads_ended: None) -> None:
    """See ``tests/conftest.py``'s ``threads_ended``."""
