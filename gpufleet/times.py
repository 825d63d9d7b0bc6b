"""Time, said once. Inside the product every time is a naive datetime in UTC (what the store holds);
offsets are applied at the edges, when text comes in."""

from __future__ import annotations

from datetime import datetime, timezone

from gpufleet.config import ConfigError


def utcnow() -> datetime:
    """Now, as the store and the analytics hold times: naive UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def parse_time(text: str) -> datetime:
    """ISO 8601 text -> naive UTC; a time without an offset is UTC (the command line's rule)."""
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"time {text!r}: expected ISO 8601, e.g. 2026-11-16T00:00:00Z") from None
    return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t
