"""Time, said once. Inside the product every time is a naive datetime in UTC (what the store holds);
offsets are applied at the edges, when text comes in."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from gpufleet.config import ConfigError

HOUR = timedelta(hours=1)  # the grain of the store's summaries and of its sample files


def epoch_us(t: datetime) -> int:
    """A naive UTC datetime as epoch microseconds (DuckDB's epoch_us)."""
    return (t - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def from_epoch_us(us: int) -> datetime:
    """Epoch microseconds as a naive UTC datetime (epoch_us's inverse)."""
    return datetime(1970, 1, 1) + timedelta(microseconds=int(us))


def floor_time(t: datetime, step: timedelta) -> datetime:
    """t rounded down to a whole number of steps since the epoch (a 30-minute step: :00 or :30)."""
    return datetime(1970, 1, 1) + (t - datetime(1970, 1, 1)) // step * step


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


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, where: str = "duration") -> timedelta:
    """'90s', '30m', '1.5h', '2d' (one number, one unit) -> timedelta; anything else a ConfigError
    naming `where` and the value."""
    m = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ConfigError(f"{where} = {text!r}: expected a duration such as \"90s\", \"30m\", \"4h\" or \"2d\"")
    return timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
