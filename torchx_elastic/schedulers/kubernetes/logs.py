"""Pod log helpers (whole lines: ``schedulers/log_lines.py``)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Optional


def since_seconds(since: Optional[datetime], now: Optional[datetime] = None) -> Optional[int]:
    """The API's ``sinceSeconds`` (a whole number, at least 1) for a start time."""
    if since is None:
        return None
    now = now or datetime.now(since.tzinfo)
    return max(1, math.ceil((now - since).total_seconds()))
