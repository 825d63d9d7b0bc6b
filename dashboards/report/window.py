"""The report's window: an ISO week (Monday 00:00 to Monday 00:00 in the report's time zone) or an
explicit [from, to), its previous window ("last week"), and its calendar days for the trend chart.

All times handed to analytics are naive UTC (gpufleet.analytics.params). A week in a zone with daylight
saving time is 167 or 169 hours long once a year; "last week" is then the previous calendar
week, not the 168 hours before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

from gpufleet.config import ConfigError

_WEEK = re.compile(r"^(\d{4})-?W(\d{2})$")

MAX_DAYS = 92  # a longer window gets no daily chart (one analysis per day)


def to_utc(t: datetime) -> datetime:
    """Aware -> naive UTC; naive is taken as UTC already."""
    return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t


def local_midnight(d: date, tz: ZoneInfo) -> datetime:
    """Naive UTC of 00:00 on `d` in `tz`."""
    return to_utc(datetime.combine(d, time(0), tzinfo=tz))


def parse_week(text: str) -> tuple[int, int]:
    m = _WEEK.match(text.strip())
    if not m:
        raise ConfigError(f"--week {text!r}: expected an ISO week YYYY-Www, e.g. 2026-W46")
    year, week = int(m.group(1)), int(m.group(2))
    try:
        date.fromisocalendar(year, week, 1)
    except ValueError:
        raise ConfigError(f"--week {text!r}: {year} has no week {week:02d}: expected an ISO week YYYY-Www, e.g. 2026-W46") from None
    return year, week


@dataclass(frozen=True)
class Window:
    label: str  # "2026-W46", or "2026-11-09 00:00 .. 2026-11-16 00:00 UTC"
    start: datetime  # naive UTC, inclusive
    end: datetime  # naive UTC, exclusive
    prev_start: datetime
    prev_end: datetime
    tz: str
    week: tuple[int, int] | None = None  # (ISO year, ISO week) for a week window

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def local(self, t: datetime) -> datetime:
        return t.replace(tzinfo=timezone.utc).astimezone(self.zone)

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    @property
    def previous_label(self) -> str:
        if self.week:
            y, w, _ = (date.fromisocalendar(*self.week, 1) - timedelta(days=7)).isocalendar()
            return f"{y}-W{w:02d}"
        return f"{self._fmt(self.prev_start)} .. {self._fmt(self.prev_end)}"

    def _fmt(self, t: datetime) -> str:
        return self.local(t).strftime("%Y-%m-%d %H:%M")

    @property
    def span(self) -> str:
        """Human text of the window in its zone: 'Mon 2026-11-09 00:00 to Mon 2026-11-16 00:00 (Europe/Berlin)'."""
        a, b = self.local(self.start), self.local(self.end)
        return f"{a:%a %Y-%m-%d %H:%M} to {b:%a %Y-%m-%d %H:%M} ({self.tz})"

    def days(self) -> list[tuple[date, datetime, datetime]]:
        """(local date, start, end) per calendar day in the zone, clipped to the window; [] if too long."""
        first = self.local(self.start).date()
        last = self.local(self.end - timedelta(microseconds=1)).date()
        if (last - first).days + 1 > MAX_DAYS:
            return []
        out = []
        d = first
        while d <= last:
            s, e = max(self.start, local_midnight(d, self.zone)), min(self.end, local_midnight(d + timedelta(days=1), self.zone))
            if e > s:
                out.append((d, s, e))
            d += timedelta(days=1)
        return out


def week_window(year: int, week: int, tz: str = "UTC") -> Window:
    zone = ZoneInfo(tz)
    monday = date.fromisocalendar(year, week, 1)
    prev = monday - timedelta(days=7)
    return Window(
        label=f"{year}-W{week:02d}", start=local_midnight(monday, zone), end=local_midnight(monday + timedelta(days=7), zone),
        prev_start=local_midnight(prev, zone), prev_end=local_midnight(monday, zone), tz=tz, week=(year, week),
    )


def span_window(start: datetime, end: datetime, tz: str = "UTC") -> Window:
    """An explicit window (naive UTC); last week = the same length just before it."""
    if end <= start:
        raise ConfigError(f"--from {start.isoformat()} --to {end.isoformat()}: expected --from before --to")
    length = end - start
    w = Window(label="", start=start, end=end, prev_start=start - length, prev_end=start, tz=tz)
    return Window(**{**w.__dict__, "label": f"{w._fmt(start)} .. {w._fmt(end)} {tz}"})


def last_complete_week(now: datetime, tz: str = "UTC") -> tuple[int, int]:
    """The ISO week before the one `now` (aware, or naive UTC) falls in, in zone `tz`."""
    local = (now if now.tzinfo else now.replace(tzinfo=timezone.utc)).astimezone(ZoneInfo(tz))
    y, w, _ = (local.date() - timedelta(days=7)).isocalendar()
    return y, w
