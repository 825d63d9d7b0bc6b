"""Where the dashboards keep hour facts (gpufleet.analytics.hour_facts), and their upkeep.

One directory per store (named by a digest of the store's path) under `[dashboard] facts_dir`,
one Parquet file per hour named by the hour and by what its facts were computed from - so a
fact whose inputs changed is simply not found, and a file is written whole (a temporary name,
then a rename) or not at all -, and one per day whose hours all have current facts, their
roll-up (hour_facts.rollup, named by its hours' names). The served dashboard's warmer
(dashboards/figures.py) builds the facts of the closed hours of the last `[dashboard] facts_days`
days that lack them, up to a day's at a time, after the presets' figures, then the days'
roll-ups; the pages only read them. Not the store's files: the
collector owns those, and a dashboard may read a store it cannot write.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import duckdb

from gpufleet.analytics import hour_facts
from gpufleet.analytics.params import Filters, Params
from gpufleet.times import HOUR, floor_time


def default_dir() -> Path:
    """$XDG_CACHE_HOME/gpufleet/hour-facts, else ~/.cache/gpufleet/hour-facts."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpufleet" / "hour-facts"


@dataclass(frozen=True)
class FactsDir:
    """The hour facts of one store."""

    path: Path

    @classmethod
    def of(cls, base: str | Path, store: str | Path) -> "FactsDir":
        tag = hashlib.blake2b(str(Path(store).resolve()).encode(), digest_size=8).hexdigest()
        return cls(Path(base) / tag)

    # file names: "<HH>-<name>.parquet" an hour's facts, "span<HH>-<name>.parquet" the roll-up of
    # the span starting then (hour_facts.ROLLUP_HOURS), in the directory of its day
    HOUR, SPAN = "", "span"

    def _name(self, at: datetime, key: str, kind: str = HOUR) -> Path:
        return self.path / f"{at:%Y-%m-%d}" / f"{kind}{at:%H}-{key}.parquet"

    def file(self, at: datetime, key: str, kind: str = HOUR) -> str | None:
        """The hour's facts (or span's roll-up) of that name, if written."""
        p = self._name(at, key, kind)
        return str(p) if p.exists() else None

    def present(self, hour: datetime, kind: str = HOUR) -> tuple[str, str] | None:
        """(name, path) of the hour's facts (or span's roll-up) as written last (hour_facts.FactFiles); None: none."""
        for p in (self.path / f"{hour:%Y-%m-%d}").glob(f"{kind}{hour:%H}-*.parquet"):
            return p.stem.split("-", 1)[1], str(p)
        return None

    def present_span(self, start: datetime) -> tuple[str, str] | None:
        """(name, path) of the roll-up of the span starting at `start` (hour_facts.FactFiles)."""
        return self.present(start, self.SPAN)

    def write(self, at: datetime, key: str, rows, kind: str = HOUR) -> None:
        """The hour's facts (or span's roll-up: a polars frame of hour_facts.FACT_SCHEMA), replacing
        any older ones."""
        p = self._name(at, key, kind)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        rows.write_parquet(tmp)
        os.replace(tmp, p)
        self.keep_only(at, key, kind)

    def keep_only(self, at: datetime, key: str, kind: str = HOUR) -> None:
        """Remove the hour's facts (or span's roll-up) of other names (a pass that died between
        writing and removing, or another dashboard process): `present` must find the current one."""
        keep = self._name(at, key, kind)
        for old in keep.parent.glob(f"{kind}{at:%H}-*.parquet"):
            if old != keep:
                old.unlink(missing_ok=True)

    def prune(self, before: datetime) -> int:
        """Remove the days of facts wholly before `before`; returns how many days."""
        if not self.path.is_dir():
            return 0
        n = 0
        for day in self.path.iterdir():
            try:
                end = datetime.strptime(day.name, "%Y-%m-%d") + timedelta(days=1)
            except ValueError:
                continue
            if end <= before:
                for f in day.iterdir():
                    f.unlink(missing_ok=True)
                day.rmdir()
                n += 1
        return n


@dataclass
class Refreshed:
    """What one upkeep pass did."""

    hours_built: int
    hours_current: int
    hours_without_summary: int
    took_s: float
    days_rolled: int = 0  # roll-ups written (hour_facts.ROLLUP_HOURS spans)


def horizon(now: datetime, days: int) -> tuple[datetime, datetime]:
    """The hours facts are kept for: the last `days` days up to the current hour."""
    end = floor_time(now, HOUR)
    return end - timedelta(days=days), end


def refresh(con: duckdb.DuckDBPyConnection, facts: FactsDir, p: Params, now: datetime) -> Refreshed:
    """Build the facts of the closed hours of p's window (horizon; p: the analytics parameters,
    without filters) that have none of their current name, up to a day's hours by one analysis
    (fewer above 32,768 GPUs: hour_facts.build_hours); remove older days."""
    t0 = time.monotonic()
    if not p.summaries:  # (facts answer only windows the summaries path computes)
        return Refreshed(0, 0, 0, 0.0)
    p = replace(p, filters=Filters())
    keys = hour_facts.current_keys(con, p, now)
    todo = []
    for h, k in keys.items():
        if k is None:
            continue
        if facts.file(h, k) is None:
            todo.append(h)
        else:
            facts.keep_only(h, k)
    built = 0
    for lo, hi in _spans(todo, hour_facts.build_hours(con) * HOUR):
        for hour, (key, rows) in hour_facts.build(con, replace(p, start=lo, end=hi), now).items():
            facts.write(hour, key, rows)
            built += 1
    rolled = _roll_up(con, facts, p, keys)
    facts.prune(p.start)
    return Refreshed(hours_built=built, hours_current=sum(1 for k in keys.values() if k is not None),
                     hours_without_summary=sum(1 for k in keys.values() if k is None), took_s=time.monotonic() - t0,
                     days_rolled=rolled)


def _roll_up(con: duckdb.DuckDBPyConnection, facts: FactsDir, p: Params, keys: dict[datetime, str | None]) -> int:
    """Write the roll-up of each span of p's window whose hours all have current facts and that
    has none of their name; how many."""
    n = 0
    for start in hour_facts.rollup_spans(p):
        hours = hour_facts.span_hours(start)
        name = hour_facts.rollup_name([keys.get(h) for h in hours])
        if name is None or facts.file(start, name, facts.SPAN) is not None:
            continue
        files = [facts.file(h, keys[h]) for h in hours]  # type: ignore[arg-type]
        if any(f is None for f in files):
            continue
        facts.write(start, name, hour_facts.rollup(con, files), facts.SPAN)  # type: ignore[arg-type]
        n += 1
    return n


def _spans(hours: list[datetime], longest: timedelta) -> list[tuple[datetime, datetime]]:
    """Runs of consecutive hours, each cut to `longest` (hour_facts.build_hours: a day's up to
    32,768 GPUs), newest first (the likeliest asked)."""
    spans: list[tuple[datetime, datetime]] = []
    for h in sorted(hours):
        if spans and spans[-1][1] == h and h + HOUR - spans[-1][0] <= longest:
            spans[-1] = (spans[-1][0], h + HOUR)
        else:
            spans.append((h, h + HOUR))
    return spans[::-1]
