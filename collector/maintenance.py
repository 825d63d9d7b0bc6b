"""Store upkeep run by the collector: compaction, 5-minute rollups, retention.

- Compaction: once an hour is closed, its many small per-round files are merged into one file
  sorted by GPU and time (which is what makes a field-sample cost a few bytes), and the hour's
  5-minute rollup is (re)computed from it. Late data for a compacted hour is merged on the next
  pass. Superseded files are retired, not deleted, so readers holding an older manifest still
  read them for the grace period.
- Settling: jobs and allocations settled SETTLE_AFTER ago are written once into immutable
  segments, which are merged so they stay few (StoreWriter.settle); each publish then writes
  only the open rest of those tables.
- Retention: sample files older than `raw_days` are retired; rollups and job-reported
  throughput rows older than `rollup_days` too. The ledger keeps the batch keys, so re-ingesting an expired window stays a no-op.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict
from datetime import datetime, timedelta

from gpufleet.collector import summaries
from gpufleet.collector.schema import ROLLUP_SQL, SUMMARY_SAMPLES
from gpufleet.collector.store import StoreWriter, _sql_list, write_parquet

log = logging.getLogger(__name__)

SETTLE = timedelta(minutes=5)  # how long after an hour ends before it is considered closed


def compact(w: StoreWriter, now: datetime, params: summaries.SummaryParams | None = None) -> int:
    """Merge each closed hour's files into one and roll it up, then bring the per-GPU summaries
    up to date (summarize, with `params`: the defaults if None); returns hours compacted."""
    rolled = {r[0] for r in w.db.execute("SELECT hour FROM rollups").fetchall()}
    groups = w.db.execute(
        """SELECT date_trunc('hour', min_ts) AS hour, list(DISTINCT file ORDER BY file) AS files
           FROM batches WHERE file <> '' AND min_ts IS NOT NULL GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    groups = [
        (hour, files) for hour, files in groups
        if hour + timedelta(hours=1) + SETTLE < now
        and (len(files) > 1 or "/compact-" not in files[0] or hour not in rolled)
    ]
    done = 0
    with w.parallel():
        for hour, files in groups:
            _compact_hour(w, hour, files, now)
            done += 1
    if done:
        w.invalidate()
    built = summarize(w, now, params or summaries.SummaryParams())
    if done or built:
        w.publish()
    return done


def summarize(w: StoreWriter, now: datetime, p: summaries.SummaryParams) -> int:
    """Build the summaries of every closed hour that has none, or one over other sample files
    (compaction, late data, a re-ingest) or other parameters; retire those whose samples are gone.
    Returns the hours (re)built; the caller publishes."""
    gap = timedelta(microseconds=p.gap_us)
    files = w.db.execute(
        """SELECT file, min(min_ts), max(max_ts) FROM batches WHERE file <> '' AND min_ts IS NOT NULL GROUP BY file ORDER BY file"""
    ).fetchall()
    hours: dict[datetime, list[str]] = {}
    for f, lo, hi in files:
        h = (lo - gap).replace(minute=0, second=0, microsecond=0)
        while h <= hi + gap:
            if lo < h + timedelta(hours=1) + gap and hi >= h - gap:
                hours.setdefault(h, []).append(f)
            h += timedelta(hours=1)
    tag = p.tag()
    built = 0
    with w.parallel():
        for hour in sorted(hours):
            if hour + timedelta(hours=1) + SETTLE >= now:
                continue
            sources = sorted(hours[hour])
            old = w.summaries.get(hour.isoformat())
            if old is not None and old.get("tag") == tag and old["sources"] == sources:
                continue
            _summarize_hour(w, hour, sources, p, tag)
            built += 1
    for key in [k for k, e in w.summaries.items() if datetime.fromisoformat(k) not in hours]:
        w.retire_summary(key)  # its samples were retired
    return built


def _summarize_hour(w: StoreWriter, hour: datetime, sources: list[str], p: summaries.SummaryParams, tag: str) -> None:
    gap = timedelta(microseconds=p.gap_us)
    lo, hi = hour - gap, hour + timedelta(hours=1) + gap
    q = SUMMARY_SAMPLES.format(files=_sql_list([str(w.root / f) for f in sources]))
    rows = w.db.sql(q, params={"lo": lo, "hi": hi}).to_arrow_table()
    h0 = (hour - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    table = summaries.summarize(rows, h0, h0 + 3_600_000_000, p)
    digest = hashlib.blake2b("\n".join(sources).encode(), digest_size=6).hexdigest()
    rel = f"summaries/date={hour:%Y-%m-%d}/sum-{hour:%H}-{tag}-{digest}.parquet"
    (w.root / rel).parent.mkdir(parents=True, exist_ok=True)
    write_parquet(table, w.root / rel)
    key = hour.isoformat()
    if key in w.summaries and w.summaries[key]["file"] != rel:
        w.retire_summary(key)
    w.summaries[key] = {"hour": key, "file": rel, "lo": lo.isoformat(), "hi": hi.isoformat(), "tag": tag,
                        "params": asdict(p), "sources": sources}


def _compact_hour(w: StoreWriter, hour: datetime, files: list[str], now: datetime) -> None:
    paths = [str(w.root / f) for f in files]
    date = hour.strftime("%Y-%m-%d")
    tag = hashlib.blake2b("\n".join(files).encode(), digest_size=6).hexdigest()
    target = f"samples/date={date}/compact-{hour:%H}-{tag}.parquet"
    rollup = f"rollup_5m/date={date}/hour-{hour:%H}-{tag}.parquet"
    if len(files) > 1 or "/compact-" not in files[0]:
        table = w.db.sql(f"SELECT * FROM read_parquet({_sql_list(paths)}) ORDER BY host, gpu_uuid, gpu_instance, ts").to_arrow_table()
        (w.root / target).parent.mkdir(parents=True, exist_ok=True)
        write_parquet(table, w.root / target)
    else:
        target = files[0]
    (w.root / rollup).parent.mkdir(parents=True, exist_ok=True)
    write_parquet(w.db.sql(ROLLUP_SQL.format(files=_sql_list([str(w.root / target)]))).to_arrow_table(), w.root / rollup)
    w.db.execute("BEGIN")
    try:
        for f in files:
            if f != target:
                w.db.execute("UPDATE batches SET file = ? WHERE file = ?", [target, f])
                w.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
        old = w.db.execute("SELECT file FROM rollups WHERE hour = ?", [hour]).fetchone()
        if old and old[0] != rollup:
            w.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [old[0], now])
        w.db.execute("INSERT OR REPLACE INTO rollups VALUES (?, ?)", [hour, rollup])
        w.db.execute("COMMIT")
    except Exception:
        w.db.execute("ROLLBACK")
        raise
    log.info("compacted %d files of %s into %s", len(files), hour.isoformat(), target)


def settle(w: StoreWriter, now: datetime) -> int:
    """Move settled jobs and allocations into segments and consolidate them, then publish;
    returns the rows written to segment files."""
    with w.parallel():
        rows = w.settle(now)
    if w._dirty_tables:
        w.publish()
    return rows


def apply_retention(w: StoreWriter, now: datetime, raw_days: int, rollup_days: int) -> int:
    """Retire sample files wholly older than `raw_days` and rollups older than `rollup_days`, and
    delete job throughput rows older than `rollup_days`; returns files retired + rows deleted."""
    cutoff = now - timedelta(days=raw_days)
    old = [r[0] for r in w.db.execute(
        "SELECT file FROM batches WHERE file <> '' GROUP BY file HAVING max(max_ts) < ?", [cutoff]).fetchall()]
    old_rollups = [r[0] for r in w.db.execute(
        "SELECT file FROM rollups WHERE hour < ?", [now - timedelta(days=rollup_days)]).fetchall()]
    reports_cutoff = now - timedelta(days=rollup_days)  # job-reported throughput is hourly: kept like rollups
    old_reports = w.db.execute("SELECT count(*) FROM job_throughput WHERE ts < ?", [reports_cutoff]).fetchone()[0]
    if not old and not old_rollups and not old_reports:
        return 0
    w.db.execute("BEGIN")
    if old_reports:
        w.db.execute("DELETE FROM job_throughput WHERE ts < ?", [reports_cutoff])
        w._dirty_tables.add("job_throughput")
    for f in old:
        w.db.execute("UPDATE batches SET file = '' WHERE file = ?", [f])
        w.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
    for f in old_rollups:
        w.db.execute("DELETE FROM rollups WHERE file = ?", [f])
        w.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
    w.db.execute("COMMIT")
    w.invalidate()
    w.publish()
    log.info("retention: retired %d sample files and %d rollup files, deleted %d job throughput rows", len(old), len(old_rollups), old_reports)
    return len(old) + len(old_rollups) + old_reports
