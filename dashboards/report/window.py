"""The report's window: an ISO week (Monday 00:00 to Monday 00:00 in the report's time zone) or an
explicit [from, to), its previous window ("last week"), and its calendar days for the trend chart.

All times handed to analytics are naive UTC (gpufleet.analytics.params). A week in a zone with daylight
saving time is 167 or 169 hours long once a year; "last week" is then the previous calendar
week, not the 168 hours before.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from gpufleet.config import ConfigError
from gpufleet.times import local_midnight, parse_week, week_span  # noqa: F401 - parse_week: the report's name too

MAX_DAYS = 92  # a longer window gets no daily chart (its bars would be too thin to read)


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
    start, end = week_span(year, week, tz)
    prev = date.fromisocalendar(year, week, 1) - timedelta(days=7)
    return Window(label=f"{year}-W{week:02d}", start=start, end=end, prev_start=local_midnight(prev, ZoneInfo(tz)), prev_end=start,
                  tz=tz, week=(year, week))


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
