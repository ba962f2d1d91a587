"""Times as Google's APIs print them."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def rfc3339(t: float | None = None) -> str:
    """Wall-clock time as Google prints it (UTC, milliseconds, Z)."""
    dt = datetime.fromtimestamp(time.time() if t is None else t, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
