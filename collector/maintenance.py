"""Store upkeep run by the collector: compaction, facts, settling, retention.

- Compaction: a closed hour's small per-round files merged into one sorted by GPU and time (what makes a field-sample
  cost a few bytes); late data is merged on the next pass. Superseded files are retired, not deleted: readers of an
  older manifest still read them for the grace period.
- Facts (gpufleet.collector.facts): each pass builds those whose inputs changed (build_facts), at most
  FACTS_HOURS_PER_PASS hours, or all at once with `gpufleet collect --rebuild-facts`.
- Settling: jobs and allocations settled SETTLE_AFTER ago are written once into immutable segments, merged so they
  stay few (StoreWriter.settle); a publish writes only the open rest of those tables.
- Retention: sample files older than `raw_days`, job report rows older than `facts_days`, facts as retire_facts has
  them. The ledger keeps the batch keys, so re-ingesting an expired window stays a no-op.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpufleet.collector import facts
from gpufleet.collector.store import SAMPLE_FILE_SPANS, StoreWriter, _sql_list, facts_key, fsync_dir, sample_source, write_parquet
from gpufleet.collector.tasks import TaskRunner
from gpufleet.times import epoch_us, from_epoch_us

log = logging.getLogger(__name__)

SETTLE = timedelta(minutes=5)  # how long after an hour ends before it is considered closed

# Hours of 5-minute facts an upkeep pass builds at most (build_facts), newest first, as it holds the writer's lock: the
# rest follow at the next passes (read raw until then). A day's hour and day facts wait for all its hours.
FACTS_HOURS_PER_PASS = 24


def compact(w: StoreWriter, now: datetime, params: facts.FactParams | None = None, tasks: TaskRunner | None = None,
            facts_hours: int | None = FACTS_HOURS_PER_PASS) -> int:
    """compact_hours, then build_facts (`params` None: the defaults; at most `facts_hours` hours, None: all; on `tasks`)
    and publish what changed; returns hours compacted."""
    done = compact_hours(w, now)
    made = build_facts(w, epoch_us(now), params or facts.FactParams(), limit=facts_hours, tasks=tasks)
    if done or made["hours"] or made["days"]:
        w.publish()
    return done


def compact_hours(w: StoreWriter, now: datetime) -> int:
    """compact's first step alone: each closed hour's files merged into one sorted by host, GPU and time (nothing is
    published); returns hours compacted."""
    groups = w.db.execute(
        """SELECT date_trunc('hour', min_ts) AS hour, list(DISTINCT file ORDER BY file) AS files
           FROM batches WHERE file <> '' AND min_ts IS NOT NULL GROUP BY 1 ORDER BY 1"""
    ).fetchall()
    groups = [(hour, files) for hour, files in groups
              if hour + timedelta(hours=1) + SETTLE < now and (len(files) > 1 or "/compact-" not in files[0])]
    with w.parallel():
        for hour, files in groups:
            _compact_hour(w, hour, files, now)
    if groups:
        w.invalidate()
    return len(groups)


# Fewer hours to build than this stay in the collector even with a Dask scheduler set: only a rebuild is worth the
# round trip, and upkeep must not depend on a cluster being up
DASK_MIN_HOURS = 6


def task_runner(tasks: TaskRunner | None, hours: int) -> TaskRunner:
    """Where a build of `hours` hours runs: on `tasks`' Dask scheduler from DASK_MIN_HOURS on, else in this process."""
    return tasks if tasks is not None and tasks.scheduler and hours >= DASK_MIN_HOURS else TaskRunner(name="facts")


COMPACT_ORDER = ("host", "gpu_uuid", "gpu_instance", "ts")  # a compacted hour's rows (NULLs last, as DuckDB's ORDER BY)


def _in_compact_order(path: Path) -> bool:
    """Whether the file's rows are already in COMPACT_ORDER as the compaction's ORDER BY puts them (a backfill's hour
    written as one sorted batch); a NULL host, UUID or time: no."""
    t = pq.read_table(path, columns=list(COMPACT_ORDER))
    if t.num_rows < 2:
        return True
    if t["host"].null_count or t["gpu_uuid"].null_count or t["ts"].null_count:
        return False
    cols = [t["host"], t["gpu_uuid"], pc.fill_null(pc.cast(t["gpu_instance"], pa.int32()), 2**31 - 1), t["ts"]]  # (NULL: above every instance)
    prev = [c.slice(0, t.num_rows - 1) for c in cols]
    this = [c.slice(1) for c in cols]
    ok = pc.less_equal(prev[-1], this[-1])  # from the last key up: earlier keys decide where they differ
    for a, b in zip(reversed(prev[:-1]), reversed(this[:-1])):
        ok = pc.or_(pc.less(a, b), pc.and_(pc.equal(a, b), ok))
    return bool(pc.all(ok).as_py())


def _adopt(src: Path, target: Path) -> bool:
    """The compacted file as a hard link to `src`, whose own name is retired like any compacted file's (an older
    snapshot's reader still finds it); False where the file system has no hard links."""
    try:
        os.link(src, target)
    except OSError:
        return False
    fsync_dir(target.parent)
    return True


def _compact_hour(w: StoreWriter, hour: datetime, files: list[str], now: datetime) -> None:
    """The hour's files merged into one in COMPACT_ORDER; a single file already in that order (a backfill's or bench's
    hour-long batch) is adopted, not written again (store.write_parquet wrote it: the same rows, order and layout)."""
    paths = [str(w.root / f) for f in files]
    tag = hashlib.blake2b("\n".join(files).encode(), digest_size=6).hexdigest()
    target = f"samples/date={hour:%Y-%m-%d}/compact-{hour:%H}-{tag}.parquet"
    (w.root / target).parent.mkdir(parents=True, exist_ok=True)
    if not (len(paths) == 1 and _in_compact_order(Path(paths[0])) and _adopt(Path(paths[0]), w.root / target)):
        table = w.db.sql(f"SELECT * FROM {sample_source(w.db, paths)} ORDER BY {', '.join(COMPACT_ORDER)}").to_arrow_table()
        write_parquet(table, w.root / target)
    w.db.execute("BEGIN")
    try:
        for f in files:
            w.db.execute("UPDATE batches SET file = ? WHERE file = ?", [target, f])
            w.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
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


def apply_retention(w: StoreWriter, now: datetime, raw_days: int, facts_5m_days: int = 35, facts_days: int = 400) -> int:
    """Retire sample files wholly older than `raw_days` and facts as retire_facts has them; delete job throughput,
    checkpoint and GPU share rows older than `facts_days` (kept like hour facts). Returns files retired + rows deleted."""
    facts_gone = retire_facts(w, now, raw_days, facts_5m_days, facts_days)
    cutoff = now - timedelta(days=raw_days)
    old = [r[0] for r in w.db.execute(
        "SELECT file FROM batches WHERE file <> '' GROUP BY file HAVING max(max_ts) < ?", [cutoff]).fetchall()]
    reports_cutoff = now - timedelta(days=facts_days)
    hourly = {"job_throughput": "ts", "gpu_job_shares": "ts", "job_checkpoints": "saved_at"}
    old_hourly = {t: w.db.execute(f"SELECT count(*) FROM {t} WHERE {c} < ?", [reports_cutoff]).fetchone()[0] for t, c in hourly.items()}
    old_reports = sum(old_hourly.values())
    if not old and not old_reports:
        if facts_gone:
            w.publish()
        return facts_gone
    w.db.execute("BEGIN")
    for t, c in hourly.items():
        if old_hourly[t]:
            w.db.execute(f"DELETE FROM {t} WHERE {c} < ?", [reports_cutoff])
            w._dirty_tables.add(t)
    for f in old:
        w.db.execute("UPDATE batches SET file = '' WHERE file = ?", [f])
        w.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
    w.db.execute("COMMIT")
    w.invalidate()
    w.publish()
    log.info("retention: retired %d sample files and %d facts files, deleted %d job throughput, checkpoint and GPU share rows",
             len(old), facts_gone, old_reports)
    return len(old) + facts_gone + old_reports


def retire_facts(w: StoreWriter, now: datetime, raw_days: int, facts_5m_days: int, facts_days: int) -> int:
    """Unlist the facts of days that ended more than `facts_5m_days` (a day's 5-minute facts) or `facts_days` (its hour
    and day facts) before `now`; returns how many files; the caller publishes. A grain outlives what upkeep builds it
    from (5-minute facts the raw samples, hour and day facts the 5-minute ones), so upkeep never rebuilds it from part."""
    keep_5m = max(facts_5m_days, raw_days)
    keep = {"5m": keep_5m, "day": max(facts_days, keep_5m)}
    gone = 0
    for key, e in list(w.facts.items()):
        day_end = datetime.fromisoformat(e["bucket"][:10]) + timedelta(days=1)
        if day_end <= now - timedelta(days=keep[e["grain"]]):
            w.retire_facts(key)
            gone += 1
    if gone:
        log.info("retention: retired %d facts files", gone)
    return gone


# --- facts (gpufleet.collector.facts): each settled hour's 5-minute parts, each closed day's hour and day parts ---

_SETTLE_US = round(SETTLE.total_seconds() * 1_000_000)


def _facts_digest(*parts: object) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def _overlaps(b: int, length: int, span: tuple[int, int] | None) -> bool:
    return span is None or (b < span[1] and b + length > span[0])


def rebuild_facts(w: StoreWriter, now: datetime, p: facts.FactParams, span: tuple[datetime, datetime] | None = None,
                  tasks: TaskRunner | None = None) -> dict[str, int]:
    """`gpufleet collect --rebuild-facts`: build the facts of the settled hours and closed days overlapping `span` (None:
    all) again, inputs changed or not (a file lost or damaged), then publish; returns build_facts' counts. An hour
    without samples left or whose head went, and a day without 5-minute facts left, keep theirs (build_facts)."""
    built = build_facts(w, epoch_us(now), p, None if span is None else (epoch_us(span[0]), epoch_us(span[1])), force=True, tasks=tasks)
    w.publish()
    return built


def _write_facts(root: Path, rel: str, parts: pa.Table, tag: str) -> None:
    table = parts.append_column("tag", pa.array([tag] * parts.num_rows, pa.string()))
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    write_parquet(table.cast(facts.FILE_SCHEMA), root / rel)


def _iso(us: int) -> str:
    return from_epoch_us(us).isoformat()


@dataclass
class FactsTask:
    """One settled hour's 5-minute facts (build_facts): from its sample files (`sources`, those of
    its head among them) and the allocations holding its GPUs in it (`hold`, set when its day's
    turn comes), to `rel`. Runs anywhere that sees the store's directory (a Dask worker)."""

    root: str
    hour_us: int
    sources: tuple[str, ...]
    head: tuple[str, ...]
    params: facts.FactParams
    tag: str
    inputs: str
    rel: str
    hold: pa.Table | None = None
    upto_us: int | None = None  # an open hour's: its 5-minute parts of [from_us, upto_us) alone, no hour parts
    from_us: int | None = None

    def label(self) -> str:
        return f"facts {_iso(self.hour_us)}" + ("" if self.upto_us is None else f" to {_iso(self.upto_us)[11:16]}")


_HOUR_DB: duckdb.DuckDBPyConnection | None = None  # (_hour_cursor's, made at its first call)
_HOUR_DB_LOCK = threading.Lock()


def _hour_cursor() -> duckdb.DuckDBPyConnection:
    """A cursor (the hour's own connection) of this process' one-thread in-memory DuckDB, for reading an hour's samples:
    a database per hour would start its threads each time; it holds nothing between hours."""
    global _HOUR_DB
    with _HOUR_DB_LOCK:
        if _HOUR_DB is None:
            _HOUR_DB = duckdb.connect(":memory:", config={"threads": 1})
        return _HOUR_DB.cursor()


def build_fact_hour(task: FactsTask) -> str:
    """The hour's facts file, written atomically to task.rel; one DuckDB thread, as the writer's
    own connection: the same bytes wherever it runs. Module-level: Dask sends it by name."""
    h = task.hour_us
    lo, hi = (h, h + facts.HOUR_US) if task.upto_us is None else (task.from_us, task.upto_us)
    con = _hour_cursor()
    try:
        q = facts.samples_query(sample_source(con, [str(Path(task.root) / f) for f in task.sources]))
        samples = con.sql(q, params={"lo": lo, "hi": hi, "gap_us": task.params.gap_us}).to_arrow_table()
    finally:
        con.close()
    fine = facts.conform(facts.build_parts(samples, task.hold, lo, hi, task.params))
    if task.upto_us is not None:  # (an open hour's settled buckets: no hour part until the hour is whole)
        _write_facts(Path(task.root), task.rel, fine, task.tag)
        return task.rel
    # ... and its hour parts beside them: a window over a day not yet closed reads each hour as one part, as a day file's
    _write_facts(Path(task.root), task.rel, pa.concat_tables([fine, facts.join_parts(fine, facts.GRAIN_1H, task.params)]), task.tag)
    return task.rel


def _holds_in(hold: pa.Table, h: int) -> pa.Table:
    """The holds (facts.HOLDS' rows) overlapping the hour starting at h (epoch us)."""
    return hold.filter(pc.and_(pc.greater(hold["a1"], h), pc.less(hold["a0"], h + facts.HOUR_US)))


def build_facts(w: StoreWriter, now_us: int, p: facts.FactParams, span: tuple[int, int] | None = None,
                force: bool = False, limit: int | None = None, tasks: TaskRunner | None = None) -> dict[str, int]:
    """Write the facts of every settled hour whose inputs (sample files, allocation edges in it, parameters, format)
    changed, and of every closed day whose hours' files changed; run twice, it writes nothing. Returns the hour and day
    files (re)written ("hours", "days") and those left for the next passes ("hours_left", "days_left"; also
    w.facts_backlog); the caller publishes. `span` (epoch us, [from, to)): only hours and days overlapping it; `force`:
    unchanged ones too; `limit`: at most that many hours, newest first, and no day until all its hours are current.
    The hours are FactsTasks, run where task_runner says: the same bytes.

    An hour is keyed on the files of its own samples; its "head" (files whose samples end within max_gap before it) is
    read too: a new head file (late data, compaction) rebuilds it, one that went (raw retention) does not, even with
    `force` (the hour would lose up to max_gap seconds at its start)."""
    tag = p.tag()
    gap = p.gap_us
    files = w.db.execute(SAMPLE_FILE_SPANS).fetchall()
    own: dict[int, list[str]] = {}
    head: dict[int, list[str]] = {}
    for f, lo, hi in files:
        h = (lo - (lo % facts.HOUR_US))
        while h <= hi + gap:
            if lo < h + facts.HOUR_US and hi >= h - gap:  # its samples in [h - max_gap, h + 1 h)
                (own if hi >= h else head).setdefault(h, []).append(f)
            h += facts.HOUR_US
    built = {"hours": 0, "days": 0, "hours_left": 0, "days_left": 0}
    settled = sorted((h for h in own.keys() | head.keys() if h + facts.HOUR_US + _SETTLE_US + gap <= now_us
                      and _overlaps(h, facts.HOUR_US, span)), reverse=True)
    if settled:
        hold = facts.holds(w.db, settled[-1], settled[0] + facts.HOUR_US, p)
    pending: set[int] = set()  # hours due and not built by this pass (limit)
    todo: dict[int, list[FactsTask]] = {}  # day -> its hours' tasks
    for h in settled:
        key = f"5m/{_iso(h)}"
        inputs = _facts_digest(sorted(own.get(h, [])), facts.holds_digest(hold, h, h + facts.HOUR_US), tag)
        before = sorted(head.get(h, []))
        old = w.facts.get(key)
        current = old is not None and old["inputs"] == inputs and old.get("format") == facts.FORMAT_VERSION
        if current and (not force or set(before) < set(old.get("head", []))) and set(before) <= set(old.get("head", [])):
            continue
        if limit is not None and built["hours"] >= limit:
            pending.add(h - h % facts.DAY_US)
            built["hours_left"] += 1
            continue
        rel = f"{facts.FACTS_DIR}/5m/date={_iso(h)[:10]}/hour-{_iso(h)[11:13]}-{_facts_digest(inputs, before)}.parquet"
        todo.setdefault(h - h % facts.DAY_US, []).append(
            FactsTask(str(w.root), h, tuple(sorted({*own.get(h, []), *before})), tuple(before), p, tag, inputs, rel))
        built["hours"] += 1
    opening = _open_hour_tasks(w, files, own, now_us, p, span, force, limit is not None and built["hours"] >= limit)
    built["open_hours"] = len(opening)
    runner = task_runner(tasks, built["hours"])
    for day, work in todo.items():  # a day's tasks at a time: each carries its hour's holds
        for task in work:
            task.hold = _holds_in(hold, task.hour_us)
        for task, rel in zip(work, runner.map(build_fact_hour, work, label=FactsTask.label)):
            # hour_parts: its file holds hour parts too (a file without is read as 5-minute parts: no rebuild needed)
            w.put_facts(f"5m/{_iso(task.hour_us)}", {"grain": "5m", "bucket": _iso(task.hour_us), "file": rel, "inputs": task.inputs, "hour_parts": True,
                                                     "head": list(task.head), "tag": tag, "format": facts.FORMAT_VERSION})
            task.hold = None  # (a rebuild of the whole store holds a day's at a time)
    for task, rel in zip(opening, task_runner(tasks, 0).map(build_fact_hour, opening, label=FactsTask.label)):
        entry = {"grain": "5m", "bucket": _iso(task.hour_us), "from": _iso(task.from_us), "upto": _iso(task.upto_us), "file": rel,
                 "inputs": task.inputs, "head": [], "tag": tag, "format": facts.OPEN_FORMAT}
        w.put_facts(facts_key(entry), entry)
    whole = {(e["bucket"], e["tag"]) for e in w.facts.values() if e["grain"] == "5m" and "upto" not in e}
    for key in [k for k, e in w.facts.items() if "upto" in e and (e["bucket"], e["tag"]) in whole]:
        w.retire_facts(key)  # (an open hour's buckets, now in the settled hour's own file)
    days: dict[int, list[str]] = {}
    whole_hours: dict[int, bool] = {}  # day -> do all its hours' files hold their hour parts?
    for key, e in w.facts.items():
        if e["grain"] == "5m" and e["tag"] == tag and "upto" not in e:
            h = epoch_us(datetime.fromisoformat(e["bucket"]))
            day = h - h % facts.DAY_US
            days.setdefault(day, []).append(e["file"])
            whole_hours[day] = whole_hours.get(day, True) and bool(e.get("hour_parts"))
    for d, fs in sorted(days.items()):
        if d + facts.DAY_US + _SETTLE_US + gap > now_us or not _overlaps(d, facts.DAY_US, span):
            continue
        key = f"day/{_iso(d)[:10]}"
        inputs = _facts_digest(sorted(fs), tag)
        old = w.facts.get(key)
        if not force and old is not None and old["inputs"] == inputs and old.get("format") == facts.FORMAT_VERSION:
            continue
        if d in pending:  # built from all its hours, once they are current
            built["days_left"] += 1
            continue
        files = _sql_list([str(w.root / f) for f in sorted(fs)])
        if whole_hours[d]:  # the hours' own hour parts, in join order: what joining their 5-minute parts gives
            hourly = facts.ordered_parts(w.db.sql(f"SELECT * EXCLUDE (tag) FROM read_parquet({files}, hive_partitioning = false) "
                                                  f"WHERE grain_s = {facts.GRAIN_1H}").to_arrow_table())
        else:  # (hour files without hour parts)
            fine = w.db.sql(f"SELECT * EXCLUDE (tag) FROM read_parquet({files}, hive_partitioning = false) "
                            f"WHERE grain_s = {facts.GRAIN_5M}").to_arrow_table()
            hourly = facts.join_parts(fine, facts.GRAIN_1H, p)  # (join_parts conforms its input to SCHEMA)
        daily = facts.join_parts(hourly, facts.GRAIN_1D, p)
        rel = f"{facts.FACTS_DIR}/day/date={_iso(d)[:10]}-{inputs}.parquet"
        _write_facts(w.root, rel, pa.concat_tables([hourly, daily]), tag)
        w.put_facts(key, {"grain": "day", "bucket": _iso(d), "file": rel, "inputs": inputs, "tag": tag, "format": facts.FORMAT_VERSION})
        built["days"] += 1
    w.facts_backlog = {"hours": built["hours_left"], "days": built["days_left"]}
    if built["hours"] or built["days"] or built["hours_left"]:
        log.info("facts: built %d hours of 5-minute facts and %d days of hour and day facts; %d hours and %d days left for the next passes",
                 built["hours"], built["days"], built["hours_left"], built["days_left"])
    return built


_FIVE_US = facts.GRAIN_5M * 1_000_000


def _open_hour_tasks(w: StoreWriter, files: list[tuple[str, int, int]], own: dict[int, list[str]], now_us: int, p: facts.FactParams,
                     span: tuple[int, int] | None, force: bool, skip: bool) -> list[FactsTask]:
    """The tasks for the open hours' settled 5-minute buckets (settled SETTLE + max_gap after they end, as an hour), so
    a window ending now reads only its last minutes raw: each pass adds a file of those settled since the last (listed
    "5m/<hour>+<from>", with "from" and "upto"); changed inputs (late samples, a late-learnt allocation edge) build them
    again from the hour's start; the settled hour's own file replaces them (build_facts). `skip`: none this pass."""
    tag, gap = p.tag(), p.gap_us
    hours = sorted(h for h in own if h + facts.HOUR_US + _SETTLE_US + gap > now_us and _overlaps(h, facts.HOUR_US, span))
    if skip or not hours:
        return []
    hold = facts.holds(w.db, hours[0], hours[-1] + facts.HOUR_US, p)

    def sources(lo: int, hi: int) -> list[str]:
        return sorted(f for f, a, b in files if a < hi and b >= lo - gap)

    def inputs(lo: int, hi: int) -> str:
        return _facts_digest(sources(lo, hi), facts.holds_digest(hold, lo, hi), tag, "open")

    out = []
    for h in hours:
        upto = min(h + facts.HOUR_US, (now_us - _SETTLE_US - gap) // _FIVE_US * _FIVE_US)
        if upto <= h:
            continue
        mine = {k: e for k, e in w.facts.items() if "upto" in e and e["bucket"] == _iso(h) and e["tag"] == tag}
        spans = sorted(((epoch_us(datetime.fromisoformat(e["from"])), epoch_us(datetime.fromisoformat(e["upto"])), e) for e in mine.values()),
                       key=lambda s: s[0])
        covered = h
        for lo, hi, _ in spans:  # (they chain from the hour's start; one unlisted by late samples breaks the chain)
            covered = hi if lo == covered else -1
        if force or covered < 0 or any(e.get("format") != facts.OPEN_FORMAT or e["inputs"] != inputs(lo, hi) for lo, hi, e in spans):
            for k in mine:
                w.retire_facts(k)
            covered = h
        read = sources(covered, upto)
        if covered >= upto or not read:  # (no sample yet: nothing to build, read raw meanwhile)
            continue
        digest = inputs(covered, upto)
        rel = f"{facts.FACTS_DIR}/5m/date={_iso(h)[:10]}/hour-{_iso(h)[11:13]}-from-{_iso(covered)[14:16]}-{_facts_digest(digest, upto)}.parquet"
        out.append(FactsTask(str(w.root), h, tuple(read), (), p, tag, digest, rel, hold=_holds_in(hold, h),
                             upto_us=upto, from_us=covered))
    return out
