"""Time, said once. Inside the product every time is a naive datetime in UTC (what the store holds);
offsets are applied at the edges, when text comes in."""

from __future__ import annotations

import argparse
import re
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

from gpufleet.config import ConfigError

HOUR = timedelta(hours=1)  # the grain of the store's sample files and of its hour facts


# A time chart's bucket by the window's length (the timelines', the reliability page's cause mix)
TIMELINE_BUCKETS = (
    (timedelta(hours=3), timedelta(minutes=5)),
    (timedelta(hours=12), timedelta(minutes=15)),
    (timedelta(days=2), timedelta(hours=1)),
    (timedelta(days=15), timedelta(hours=3)),
    (timedelta(days=62), timedelta(hours=12)),
)


def default_bucket(length: timedelta) -> timedelta:
    """A bucket giving 30-200 points over a window of this length."""
    for upto, bucket in TIMELINE_BUCKETS:
        if length <= upto:
            return bucket
    return timedelta(days=1)


def epoch_us(t: datetime) -> int:
    """A naive UTC datetime as epoch microseconds (DuckDB's epoch_us)."""
    return (t - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def from_epoch_us(us: int) -> datetime:
    """Epoch microseconds as a naive UTC datetime (epoch_us's inverse)."""
    return datetime(1970, 1, 1) + timedelta(microseconds=int(us))


def floor_time(t: datetime, step: timedelta) -> datetime:
    """t rounded down to a whole number of steps since the epoch (a 30-minute step: :00 or :30)."""
    return datetime(1970, 1, 1) + (t - datetime(1970, 1, 1)) // step * step


def ceil_time(t: datetime, step: timedelta) -> datetime:
    """t rounded up to a whole number of steps since the epoch (floor_time's other side)."""
    down = floor_time(t, step)
    return down if down == t else down + step


def utcnow() -> datetime:
    """Now, as the store and the analytics hold times: naive UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def to_utc(t: datetime) -> datetime:
    """Aware -> naive UTC; naive is taken as UTC already."""
    return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t


def local_midnight(d: date, tz: ZoneInfo) -> datetime:
    """Naive UTC of 00:00 on `d` in `tz`."""
    return to_utc(datetime.combine(d, time(0), tzinfo=tz))


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


_WEEK = re.compile(r"^(\d{4})-?W(\d{2})$")


def parse_week(text: str) -> tuple[int, int]:
    """'2026-W46' (or '2026W46') -> (ISO year, ISO week); anything else, or a week the year does
    not have, a ConfigError saying what was expected."""
    m = _WEEK.match(text.strip())
    if not m:
        raise ConfigError(f"--week {text!r}: expected an ISO week YYYY-Www, e.g. 2026-W46")
    year, week = int(m.group(1)), int(m.group(2))
    try:
        date.fromisocalendar(year, week, 1)
    except ValueError:
        raise ConfigError(f"--week {text!r}: {year} has no week {week:02d}: expected an ISO week YYYY-Www, e.g. 2026-W46") from None
    return year, week


def week_span(year: int, week: int, tz: str = "UTC") -> tuple[datetime, datetime]:
    """ISO week `week` of `year`: Monday 00:00 to the next Monday 00:00 in zone `tz`, naive UTC."""
    zone = ZoneInfo(tz)
    monday = date.fromisocalendar(year, week, 1)
    return local_midnight(monday, zone), local_midnight(monday + timedelta(days=7), zone)


def add_window_arguments(p: argparse.ArgumentParser, week_zone: str) -> None:
    """The window flags every command that reads a window takes, named once: --week, --last, or
    --from with --to (window_from_arguments reads them). `week_zone` says in the help where a
    week's Mondays are."""
    p.add_argument("--week", help=f"ISO week YYYY-Www, e.g. 2026-W48 (Monday 00:00 to Monday 00:00, {week_zone})")
    p.add_argument("--last", metavar="DURATION", help="the window ending now, e.g. 7d, 24h, 30m")
    p.add_argument("--from", dest="start", help="window start, ISO 8601 (UTC unless an offset is given)")
    p.add_argument("--to", dest="end", help="window end, ISO 8601, exclusive")


def window_from_arguments(args: argparse.Namespace, tz: str = "UTC",
                          now: datetime | None = None) -> tuple[datetime, datetime, tuple[int, int] | None]:
    """The window add_window_arguments' flags name: (start, end) naive UTC, and (ISO year, week)
    for --week (its Mondays in zone `tz`), else None. A ConfigError says what was expected when
    none, or more than one, of them is given."""
    given = [flag for flag, v in (("--week", args.week), ("--last", args.last), ("--from/--to", args.start or args.end)) if v]
    if len(given) != 1:
        what = "given " + " and ".join(given) if given else "none given"
        raise ConfigError(f"the window: {what}: expected one of --week YYYY-Www, --last DURATION (e.g. 7d), or both --from and --to")
    if args.week:
        week = parse_week(args.week)
        return (*week_span(*week, tz), week)
    if args.last:
        length = parse_duration(args.last, "--last")
        if length <= timedelta(0):
            raise ConfigError(f"--last {args.last!r}: expected a duration above zero, e.g. 7d")
        end = (now or utcnow()).replace(microsecond=0)
        return end - length, end, None
    if not (args.start and args.end):
        raise ConfigError(f"--from/--to: only {'--from' if args.start else '--to'} given: expected both --from and --to")
    start, end = parse_time(args.start), parse_time(args.end)
    if end <= start:
        raise ConfigError(f"--from {start.isoformat()} --to {end.isoformat()}: expected --from before --to")
    return start, end, None
