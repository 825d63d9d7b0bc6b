"""Store upkeep run by the collector: compaction, summaries, facts, retention.

- Compaction: once an hour is closed, its many small per-round files are merged into one file
  sorted by GPU and time (which is what makes a field-sample cost a few bytes). Late data for a
  compacted hour is merged on the next pass. Superseded files are retired, not deleted, so
  readers holding an older manifest still read them for the grace period.
- Facts (gpufleet.collector.facts, the store's one derived tier): every pass writes the 5-minute
  facts of each settled hour whose inputs changed and the hour and day facts of each closed day
  whose hours changed (build_facts); a store without them gets them over its next passes
  (FACTS_HOURS_PER_PASS, newest first) or at once with `gpufleet collect --rebuild-facts`.
- Settling: jobs and allocations settled SETTLE_AFTER ago are written once into immutable
  segments, which are merged so they stay few (StoreWriter.settle); each publish then writes
  only the open rest of those tables.
- Retention: sample files older than `raw_days` are retired; job-reported throughput rows older
  than `facts_days`. The ledger keeps the batch keys, so re-ingesting an expired window stays a no-op.
  The per-GPU summaries of hours whose samples go are kept until `summary_days` (when longer):
  a long-term tier, as Prometheus-compatible stores keep downsampled data longer than raw. Such an
  hour's figures come from its summary alone - the same for every window whose edges fall on its
  buckets' edges; a bucket that would be read raw (a window edge inside it) has no data.
  Facts: a day's 5-minute facts go, all its hours at once, when the day is older than
  `facts_5m_days`; its hour and day facts when older than `facts_days` (retire_facts). Whole days
  only, and no grain before what upkeep builds it from (raw samples, 5-minute facts): upkeep never
  builds a day's facts again from part of its hours, nor an hour's that retention just retired.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpufleet.collector import facts, summaries
from gpufleet.collector.schema import (ALIGNED_DIGESTS, ALIGNED_EDGES, ALLOCATION_EDGES, CUT_DIGESTS, CUTS_BY_GPU, HEALTH_FILE, HEALTH_FORMAT_VERSION, NOW_FORMAT_VERSION,
                                      SUMMARY_HASHES, SUMMARY_SAMPLES)
from gpufleet.collector.summaries import PARTS_DIR
from gpufleet.collector.store import StoreWriter, _sql_list, raw_retired, sample_source, write_parquet
from gpufleet.collector.tasks import TaskRunner
from gpufleet.times import epoch_us, floor_time, from_epoch_us

log = logging.getLogger(__name__)

SETTLE = timedelta(minutes=5)  # how long after an hour ends before it is considered closed

# Hours' run facts files (Fleet now's) an upkeep pass builds at most: it holds the writer's commit lock, and a store
# summarised by an earlier version has a run facts file to build for every hour it keeps (35
# days: 840 hours, tens of minutes at 16,384 GPUs). The newest come first; the rest follow at the
# next passes (read raw until then), or all at once with `gpufleet collect --rebuild-summaries`.
HEALTH_HOURS_PER_PASS = 24
# Hours' joined segments an upkeep pass writes at most (add_coarse), newest first: a store summarised
# before them has every hour to do (~0.5 s an hour at 16,384 GPUs, under the writer's lock); the
# rest follow at the next passes (read from the 5-minute rows until then)
COARSE_HOURS_PER_PASS = 48
# Hours of 5-minute facts an upkeep pass builds at most (build_facts), newest first: a store from
# before the facts has every hour it keeps to build (~1.2 s of CPU an hour at 1,024 GPUs, under the
# writer's lock); the rest follow at the next passes (read raw until then), or all at once with
# `gpufleet collect --rebuild-facts`. A day's hour and day facts wait for all its hours.
FACTS_HOURS_PER_PASS = 24


def compact(w: StoreWriter, now: datetime, params: summaries.SummaryParams | None = None, tasks: TaskRunner | None = None,
            gpu_shards: int = 1, progress: Callable[[int, int], None] | None = None,
            health_hours: int | None = HEALTH_HOURS_PER_PASS, coarse_hours: int | None = COARSE_HOURS_PER_PASS,
            facts_hours: int | None = FACTS_HOURS_PER_PASS) -> int:
    """Merge each closed hour's files into one (compact_hours), then bring the per-GPU summaries
    up to date (summarize, with `params`: the defaults if None; `tasks`, `gpu_shards` and
    `progress` as there), the facts (build_facts, with the same parameters: at most
    `facts_hours` hours, None: all), their hours' joined segments (add_coarse, at most
    `coarse_hours` of them, None: all), their hourly run facts files (summarize_health, at most
    `health_hours` of them, None: all; `tasks` and `progress` as there: Fleet now's run facts)
    and a store's merged health day files of before retired (retire_health_days); returns hours
    compacted."""
    listed = {k: e["file"] for k, e in w.summaries.items()}
    done = compact_hours(w, now)
    sp = params or summaries.SummaryParams()
    built = summarize(w, now, sp, tasks, gpu_shards, progress)
    made = build_facts(w, epoch_us(now), fact_params(sp), limit=facts_hours, tasks=tasks)
    built += made["hours"] + made["days"]
    built += add_coarse(w, coarse_hours)
    built += summarize_health(w, health_hours, tasks, progress)
    built += retire_health_days(w)
    if done or built or listed != {k: e["file"] for k, e in w.summaries.items()}:  # (or summaries retired)
        w.publish()
    return done


def fact_params(sp: summaries.SummaryParams) -> facts.FactParams:
    """The facts' parameters from the summaries' ([analytics] max_gap, idle threshold, idle_min_duration)."""
    return facts.FactParams(max_gap_s=sp.max_gap_s, idle_threshold=sp.idle_threshold, idle_min_s=sp.keep_s)


def compact_hours(w: StoreWriter, now: datetime) -> int:
    """compact's first step alone: each closed hour's files merged into one sorted by host, GPU
    and time (the summaries and facts are left to their steps; nothing is published). Returns
    hours compacted."""
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


# Fewer hours to build than this (the hour or two each upkeep pass closes) stay in the collector
# even with a Dask scheduler set: only a rebuild is worth the round trip, and upkeep must not
# depend on a cluster being up
DASK_MIN_HOURS = 6
# The most samples of one hour a summary task reads at once: a task holds its hour's samples and
# a few dozen arrays over them (~1 KB a sample at the peak: an hour of 100,000 GPUs, 24M samples,
# did not fit 24 GiB in one task). A day whose hour holds more is cut into shards of its hosts -
# here as on Dask - each reading its hosts' row groups only (compaction sorts files by host).
# 4M: an hour of 16,384 GPUs at 15 s.
SUMMARY_TASK_SAMPLES = 4_000_000


def summary_runner(tasks: TaskRunner | None, hours: int) -> TaskRunner:
    """Where a build of `hours` hours runs: on the Dask scheduler of `tasks` for DASK_MIN_HOURS or
    more, else in this process."""
    return tasks if tasks is not None and tasks.scheduler and hours >= DASK_MIN_HOURS else TaskRunner(name="summaries")


@dataclass(frozen=True)
class SummaryTask:
    """One task of a summary build: the summaries of some hours of one day for one shard of the
    GPUs (those of the hosts in [host_lo, host_hi), None: open), from the sample files
    each hour lists. Runs anywhere that sees the store's directory (a Dask worker)."""

    root: str
    day: str
    # (hour, its sample files, where its summary ends: "" for the whole hour, else the end of the
    # last bucket of an open hour that is summarised - see summarize)
    hours: tuple[tuple[str, tuple[str, ...], str], ...]
    shard: int  # 0-based
    shards: int
    params: summaries.SummaryParams
    tag: str
    # the shard's hosts: a contiguous range of the day's hosts in sorted order, so a task reads
    # only the row groups of its hosts (compaction sorts the files by host, then GPU and time)
    host_lo: str | None = None
    host_hi: str | None = None
    # the allocations' starts and ends in the day's hours (schema.ALLOCATION_EDGES' rows), where
    # the buckets are cut into segments: the file the build wrote them to for its tasks (a task
    # names it rather than carrying them: a day's cuts are megabytes that Dask would otherwise send
    # inside every task), and their digest (the part's name says which it used)
    cuts_file: str = ""
    cuts_digest: str = ""

    @property
    def part(self) -> str:
        """Where its output goes, named by everything it is computed from: a rerun of a killed
        build finds the parts already written and keeps them."""
        what = json.dumps([self.day, self.hours, self.shards, self.host_lo, self.host_hi, self.tag, summaries.FORMAT_VERSION,
                           self.cuts_digest]).encode()
        return f"{PARTS_DIR}/{self.day}-{hashlib.blake2b(what, digest_size=8).hexdigest()}-{self.shard + 1}of{self.shards}.parquet"

    def label(self) -> str:
        return f"{self.day} GPU shard {self.shard + 1}/{self.shards}"


def build_summary_part(task: SummaryTask) -> str:
    """The task's summary rows, every hour of it, written atomically to task.part (a task killed
    half-way leaves nothing; one already done is not redone). Module-level: Dask sends it by name."""
    path = Path(task.root) / task.part
    if path.exists():
        return task.part
    p = task.params
    gap = timedelta(microseconds=p.gap_us)
    cuts = pq.read_table(Path(task.root) / task.cuts_file) if task.cuts_file else None
    con = duckdb.connect(":memory:")
    try:
        tables = []
        for hour, sources, to in task.hours:
            h = datetime.fromisoformat(hour)
            end = datetime.fromisoformat(to) if to else h + timedelta(hours=1)
            q = SUMMARY_SAMPLES.format(source=sample_source(con, [str(Path(task.root) / f) for f in sources]))
            rows = con.sql(q, params={"lo": h - gap, "hi": end + gap, "host_lo": task.host_lo,
                                      "host_hi": task.host_hi}).to_arrow_table()
            h0 = epoch_us(h)
            tables.append(summaries.summarize(rows, h0, epoch_us(end), p, _cuts_of(con, rows, cuts, h0)))
    finally:
        con.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(pa.concat_tables(tables), path)
    return task.part


def _cuts_of(con: duckdb.DuckDBPyConnection, rows: pa.Table, cuts: pa.Table | None, h0: int) -> tuple | None:
    """The cuts inside hour h0 (epoch us) by the rows' GPU numbers (g): summaries.summarize's `cuts`."""
    if cuts is None or not cuts.num_rows or not rows.num_rows:
        return None
    con.register("_rows", rows)
    con.register("_cuts", cuts)
    try:
        found = con.execute(CUTS_BY_GPU, {"lo": h0, "hi": h0 + 3_600_000_000}).fetchnumpy()
    finally:
        con.unregister("_rows")
        con.unregister("_cuts")
    return found["g"].astype("int64"), found["t"].astype("int64")


def _day_cuts(w: StoreWriter, day: str, p: summaries.SummaryParams) -> tuple[pa.Table, str]:
    """The allocation edges of a day's hours (and max_gap either side) this part of the store
    knows now, and their digest."""
    lo = epoch_us(datetime.fromisoformat(day)) - p.gap_us
    hi = lo + 24 * 3_600_000_000 + 2 * p.gap_us
    table = w.db.sql(ALLOCATION_EDGES, params={"lo": lo, "hi": hi, "max_gap": p.max_gap_s}).to_arrow_table()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return table, hashlib.blake2b(sink.getvalue().to_pybytes(), digest_size=8).hexdigest()


def _edge_digests(w: StoreWriter, hours: list[datetime], p: summaries.SummaryParams, query: str = CUT_DIGESTS) -> dict[str, str]:
    """Each hour's CUT_DIGESTS (or ALIGNED_DIGESTS) digest (hour in ISO form -> digest; an hour with no edge: absent)."""
    if not hours:
        return {}
    lo, hi = epoch_us(min(hours)), epoch_us(max(hours)) + 3_600_000_000
    rows = w.db.execute(query, {"lo": lo, "hi": hi, "max_gap": p.max_gap_s, "bucket_us": p.bucket_us}).fetchall()
    return {from_epoch_us(h * 3_600_000_000).isoformat(): d for h, d in rows}


def summarize(w: StoreWriter, now: datetime, p: summaries.SummaryParams, tasks: TaskRunner | None = None,
              gpu_shards: int = 1, progress: Callable[[int, int], None] | None = None) -> int:
    """Build the summaries of every closed hour that has none, or one over other sample files
    (compaction, late data, a re-ingest) or other parameters; retire those whose samples are gone.
    An hour not closed yet (the open hour, and the last one until it settles) is summarised up to
    the last bucket that ended SETTLE and max_gap ago (its entry's "to"), again at each pass as
    that moves on: readers then read raw only the newest minutes, not the hour or two since the
    last compaction. The work is SummaryTasks per (day, shard of `gpu_shards`), run by `tasks` (a
    Dask scheduler) when there are at least DASK_MIN_HOURS hours to build, else here (one task a
    day, or a shard of its hosts each where an hour holds more than SUMMARY_TASK_SAMPLES); the
    same code either way, so the same bytes. Returns the hours (re)built, open ones
    included; the caller publishes."""
    gap = timedelta(microseconds=p.gap_us)
    files = w.db.execute(
        """SELECT file, min(min_ts), max(max_ts), sum(rows) FROM batches WHERE file <> '' AND min_ts IS NOT NULL GROUP BY file ORDER BY file"""
    ).fetchall()
    span_of = {f: (lo, hi, n) for f, lo, hi, n in files}
    hours: dict[datetime, list[tuple[str, datetime, datetime]]] = {}
    for f, lo, hi, _ in files:
        h = (lo - gap).replace(minute=0, second=0, microsecond=0)
        while h <= hi + gap:
            if lo < h + timedelta(hours=1) + gap and hi >= h - gap:
                hours.setdefault(h, []).append((f, lo, hi))
            h += timedelta(hours=1)
    tag = p.tag()
    open_to = floor_time(now - SETTLE - gap, timedelta(seconds=p.bucket_s))  # the open hours' summaries end here
    # (hour, where its summary ends: None for the whole hour); an open hour not reaching one bucket: none
    wanted = [(h, None if h + timedelta(hours=1) + SETTLE < now else open_to) for h in sorted(hours)]
    wanted = [(h, to) for h, to in wanted if to is None or to > h]
    cut_digests = _edge_digests(w, [h for h, _ in wanted], p)
    todo: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
    for hour, to in wanted:
        end = to or hour + timedelta(hours=1)
        sources = sorted(f for f, lo, hi in hours[hour] if lo < end + gap and hi >= hour - gap)
        old = w.summaries.get(hour.isoformat())
        if old is not None and raw_retired(old):
            continue  # its samples are retired (those left, of the hours beside it, could not rebuild it)
        if (old is not None and old.get("tag") == tag and old["sources"] == sources and old.get("to") == (to and to.isoformat())
                and old.get("cuts", "") == cut_digests.get(hour.isoformat(), "") and old.get("hash_by") == summaries.HASH_BY):
            continue
        todo.setdefault(f"{hour:%Y-%m-%d}", []).append((hour.isoformat(), tuple(sources), to.isoformat() if to else ""))
    built = sum(len(hs) for hs in todo.values())
    runner = summary_runner(tasks, built)
    shards = gpu_shards if runner.scheduler else 1  # here, one task a day reads each file once ...
    work, cut_files = [], {}
    for day, hs in todo.items():
        # ... unless an hour holds more samples than a task can
        most = max(_samples_in(datetime.fromisoformat(h), [span_of[f] for f in sources]) for h, sources, _ in hs)
        ranges = _host_ranges(w, sorted({f for _, sources, _ in hs for f in sources}), max(shards, -(-most // SUMMARY_TASK_SAMPLES)))
        cuts, digest = _day_cuts(w, day, p)
        cut_file = f"{PARTS_DIR}/cuts-{day}-{digest}.parquet" if cuts.num_rows else ""
        if cut_file:
            cut_files[cut_file] = cuts
        work += [SummaryTask(str(w.root), day, tuple(hs), s, len(ranges), p, tag, lo, hi, cut_file, digest)
                 for s, (lo, hi) in enumerate(ranges)]
    if progress is not None:
        runner = replace(runner, progress=progress)
    _remove_stale_parts(w, {t.part for t in work} | set(cut_files))
    try:
        for rel, cuts in cut_files.items():  # the tasks' input for this build only
            (w.root / rel).parent.mkdir(parents=True, exist_ok=True)
            write_parquet(cuts, w.root / rel)
        cut_files = dict.fromkeys(cut_files)  # (the tables are not held while the tasks run)
        runner.map(build_summary_part, work, label=SummaryTask.label)
    finally:
        for rel in cut_files:
            (w.root / rel).unlink(missing_ok=True)
    for day, hs in todo.items():
        parts = [w.root / t.part for t in work if t.day == day]
        for hour, sources, to in hs:
            _register_hour(w, datetime.fromisoformat(hour), list(sources), parts, p, tag, cut_digests.get(hour, ""),
                           datetime.fromisoformat(to) if to else None)
        for part in parts:
            part.unlink(missing_ok=True)
    for key in [k for k, e in w.summaries.items() if datetime.fromisoformat(k) not in hours and not raw_retired(e)]:
        w.retire_summary(key)  # its samples were retired
    return built


@dataclass(frozen=True)
class HealthTask:
    """One hour's run facts (Fleet now's), from the sample files its summary was built from, for
    the parameters that summary was built with; for an open hour's summary (`to`), the
    same of its samples before `to`. Runs anywhere that sees the store's directory (a Dask
    worker)."""

    root: str
    hour: str
    sources: tuple[str, ...]
    summary_file: str  # the hour's summary: its file goes beside it
    idle_threshold: float
    max_gap_s: float
    to: str = ""

    @property
    def kind(self) -> str:
        """The summary entry's key it goes under."""
        return "now" if self.to else "health"

    @property
    def format(self) -> int:
        return NOW_FORMAT_VERSION if self.to else HEALTH_FORMAT_VERSION

    @property
    def rel(self) -> str:
        """Where it goes."""
        return self.summary_file.replace("/sum-", f"/{self.kind}{self.format}-", 1)

    def label(self) -> str:
        return f"{self.kind} {self.hour}"


def build_health_file(task: HealthTask) -> str:
    """The hour's run facts file (schema.HEALTH_FILE; for an open hour, of its samples before
    task.to), written atomically to task.rel. One DuckDB thread, as the writer's own
    connection runs it: the same bytes wherever it runs (a sum's order follows the threads).
    Module-level: Dask sends it by name."""
    hour = datetime.fromisoformat(task.hour)
    hi = datetime.fromisoformat(task.to) if task.to else hour + timedelta(hours=1)
    con = duckdb.connect(":memory:", config={"threads": 1})
    try:
        source = sample_source(con, [str(Path(task.root) / f) for f in task.sources])
        q = HEALTH_FILE.format(source=source, where="ts >= $lo AND ts < $hi")
        table = con.sql(q, params={"lo": hour, "hi": hi, "thr": task.idle_threshold, "max_gap": task.max_gap_s}).to_arrow_table()
    finally:
        con.close()
    write_parquet(table, Path(task.root) / task.rel)
    return task.rel


def summarize_health(w: StoreWriter, limit: int | None = None, tasks: TaskRunner | None = None,
                     progress: Callable[[int, int], None] | None = None) -> int:
    """The run facts file (HealthTask: schema.HEALTH_FILE, the NOW_HOURS run facts for the
    summary's idle threshold and max_gap; the hour's "health" entry) of every summarised hour that has none or one of another
    format - the newest `limit` of them, None: all - one file per hour beside the summary, listed
    in the summary's manifest entry, so it stands and falls with it; and an open hour's summary
    (`to`) the same of its samples before `to`, kept as its "now" (Fleet now then reads raw only
    the minutes after: gpufleet.analytics.fleet_now). A task an hour, run by `tasks` (a Dask
    scheduler) when there are at least DASK_MIN_HOURS, else here, as summarize's. Returns the
    hours built; the caller publishes."""
    todo = [k for k, e in sorted(w.summaries.items(), reverse=True)  # (none without its samples: they are what it reads)
            if e.get("health_format") != HEALTH_FORMAT_VERSION and not e.get("to") and not raw_retired(e)][:limit]
    todo += [k for k, e in sorted(w.summaries.items()) if e.get("to") and e.get("now_format") != NOW_FORMAT_VERSION]
    work = [HealthTask(str(w.root), key, tuple(e["sources"]), e["file"], e["params"]["idle_threshold"], e["params"]["max_gap_s"],
                       e.get("to", "")) for key, e in ((k, w.summaries[k]) for k in todo)]
    runner = replace(summary_runner(tasks, len(work)), name="run facts")
    if progress is not None:
        runner = replace(runner, progress=progress)
    for task, rel in zip(work, runner.map(build_health_file, work, label=HealthTask.label)):
        w.attach_health(task.hour, rel, task.format, task.kind)
    return len(work)


def retire_health_days(w: StoreWriter) -> int:
    """Retire the closed days' merged health files a store written before lists (the manifest's
    "health_days"): they held the hours' health figures, which the facts carry now, and nothing
    reads them (the retired files are deleted after the grace period). Returns days retired; the
    caller publishes."""
    days = sorted(w.health_days)
    for day in days:
        w.retire_health_day(day)
    return len(days)


def _samples_in(hour: datetime, spans: list[tuple[datetime, datetime, int]]) -> int:
    """About how many samples of the files (first and last sample time, rows) fall in the hour:
    each file's rows in the share of its time span inside the hour (a compacted hour's file: all
    of them; its neighbours' read for the intervals crossing the hour's edges: none)."""
    end, n = hour + timedelta(hours=1), 0.0
    for lo, hi, rows in spans:
        if hi <= lo:
            n += rows if hour <= lo < end else 0
        else:
            n += rows * max(0.0, (min(hi, end) - max(lo, hour)) / (hi - lo))
    return round(n)


def _host_ranges(w: StoreWriter, files: list[str], shards: int) -> list[tuple[str | None, str | None]]:
    """The day's hosts (those its sample files hold) cut into `shards` contiguous ranges of about
    as many hosts each; fewer when there are fewer hosts. One range, (None, None), for one shard."""
    if shards == 1:
        return [(None, None)]
    hosts = [r[0] for r in w.db.execute(f"SELECT DISTINCT host FROM read_parquet({_sql_list([str(w.root / f) for f in files])}) "
                                        "WHERE host IS NOT NULL ORDER BY host").fetchall()]
    cuts = sorted({hosts[i * len(hosts) // shards] for i in range(1, shards)} - {hosts[0]}) if hosts else []
    bounds = [None, *cuts, None]
    return list(zip(bounds[:-1], bounds[1:]))


def _remove_stale_parts(w: StoreWriter, wanted: set[str]) -> None:
    """Parts of an earlier build that no task of this one names (killed, then the data or the
    parameters changed): their rows would be out of date."""
    d = w.root / PARTS_DIR
    for path in (sorted(d.iterdir()) if d.is_dir() else []):
        if str(path.relative_to(w.root)) not in wanted:
            path.unlink(missing_ok=True)


def _register_hour(w: StoreWriter, hour: datetime, sources: list[str], parts: list[Path], p: summaries.SummaryParams, tag: str,
                   cuts: str, to: datetime | None = None) -> None:
    """The hour's summary file: its rows from the day's parts, in the order one task over every
    GPU gives (by GPU, then bucket), and its manifest entry (`to`: where an open hour's summary
    ends; its samples from max_gap before the hour to max_gap after that are what it stands for)."""
    gap = timedelta(microseconds=p.gap_us)
    lo, hi = hour - gap, (to or hour + timedelta(hours=1)) + gap
    table = pq.read_table([str(f) for f in parts], schema=summaries.SCHEMA,
                          filters=[("bucket", ">=", hour), ("bucket", "<", hour + timedelta(hours=1))])
    table = table.sort_by([(c, "ascending") for c in ("cluster", "host", "gpu_uuid", "gi", "bucket", "seg0_us")])
    w.db.register("_hour", table)
    try:
        table = w.db.sql(SUMMARY_HASHES).to_arrow_table().cast(summaries.FILE_SCHEMA)
    finally:
        w.db.unregister("_hour")
    digest = hashlib.blake2b("\n".join([*sources, cuts, *([to.isoformat()] if to else [])]).encode(), digest_size=6).hexdigest()
    rel = f"summaries/date={hour:%Y-%m-%d}/sum-{hour:%H}-{tag}-{digest}.parquet"
    (w.root / rel).parent.mkdir(parents=True, exist_ok=True)
    write_parquet(table, w.root / rel)
    key = hour.isoformat()
    if key in w.summaries and w.summaries[key]["file"] != rel:
        w.retire_summary(key)
    w.summaries[key] = {"hour": key, "file": rel, "lo": lo.isoformat(), "hi": hi.isoformat(), "tag": tag,
                        "params": asdict(p), "sources": sources, "cuts": cuts, "hash_by": summaries.HASH_BY,
                        **({"format": summaries.OPEN_FORMAT, "to": to.isoformat()} if to else {"format": summaries.FORMAT_VERSION})}


def add_coarse(w: StoreWriter, limit: int | None = None) -> int:
    """Write the joined segments (summaries.coarsen) of every closed hour's current summary that
    has none - just summarised, or by a version before them - or whose allocation edges on bucket
    starts changed since (ALIGNED_DIGESTS: an allocation learnt of later; those inside a bucket
    rebuild the hour instead), from the hour's rows: no sample is read. The newest `limit` of
    them (None: all). Returns how many."""
    closed = [(k, e) for k, e in sorted(w.summaries.items(), reverse=True) if not e.get("to") and e.get("format") == summaries.FORMAT_VERSION]
    by_params: dict[str, list[tuple[str, dict]]] = {}
    for k, e in closed:
        by_params.setdefault(json.dumps(e["params"], sort_keys=True), []).append((k, e))
    n = 0
    for params, entries in by_params.items():
        p = summaries.SummaryParams(**json.loads(params))
        digests = _edge_digests(w, [datetime.fromisoformat(k) for k, _ in entries], p, ALIGNED_DIGESTS)
        for key, e in entries:
            if e.get("coarse") and e.get("aligned", "") == digests.get(key, ""):
                continue
            if limit is not None and n >= limit:
                return n
            lo = epoch_us(datetime.fromisoformat(key))
            found = w.db.execute(ALIGNED_EDGES, {"lo": lo, "hi": lo + 3_600_000_000, "max_gap": p.max_gap_s,
                                                 "bucket_us": p.bucket_us}).fetchnumpy() if key in digests else {}
            aligned = (found["gh"].astype("uint64"), found["t"].astype("int64")) if found else None
            rows = pq.read_table(w.root / e["file"], schema=summaries.FILE_SCHEMA)
            edges = hashlib.blake2b(digests.get(key, "").encode(), digest_size=4).hexdigest()
            rel = e["file"].replace("/sum-", f"/hsum-{edges}-", 1)
            write_parquet(summaries.coarsen(rows, p, aligned), w.root / rel)
            w.attach_coarse(key, rel, digests.get(key, ""))
            n += 1
    return n


def _compact_hour(w: StoreWriter, hour: datetime, files: list[str], now: datetime) -> None:
    paths = [str(w.root / f) for f in files]
    tag = hashlib.blake2b("\n".join(files).encode(), digest_size=6).hexdigest()
    target = f"samples/date={hour:%Y-%m-%d}/compact-{hour:%H}-{tag}.parquet"
    table = w.db.sql(f"SELECT * FROM {sample_source(w.db, paths)} ORDER BY host, gpu_uuid, gpu_instance, ts").to_arrow_table()
    (w.root / target).parent.mkdir(parents=True, exist_ok=True)
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


def apply_retention(w: StoreWriter, now: datetime, raw_days: int, summary_days: int = 0, facts_5m_days: int = 35,
                    facts_days: int = 400) -> int:
    """Retire sample files wholly older than `raw_days`, the facts as retire_facts has them, and
    delete job throughput, job checkpoint and GPU share rows older than `facts_days` (kept like the
    hour facts); returns files retired + rows deleted + summaries retired. The summary of a closed hour
    whose sample files go is kept (raw_retired) while the hour is younger than `summary_days`,
    when that is longer than raw_days (0: the summaries go with their samples); it goes then. A
    summary that cannot stand alone (of an older format: nothing could rebuild it) goes with its
    samples."""
    facts_gone = retire_facts(w, now, raw_days, facts_5m_days, facts_days)
    cutoff = now - timedelta(days=raw_days)
    old = [r[0] for r in w.db.execute(
        "SELECT file FROM batches WHERE file <> '' GROUP BY file HAVING max(max_ts) < ?", [cutoff]).fetchall()]
    keep_to = now - timedelta(days=max(summary_days, raw_days))  # the summaries of hours ending before go
    gone, expired = set(old), 0
    for key, e in list(w.summaries.items()):
        ends = datetime.fromisoformat(key) + timedelta(hours=1)
        if raw_retired(e) and ends < keep_to:
            w.retire_summary(key)
            expired += 1
        # kept: an hour any of whose samples go (the hour after the newest such one loses only the
        # sample crossing into it, and keeps its summary built over it too)
        elif (not raw_retired(e) and ends >= keep_to and summary_days > raw_days and not e.get("to")
              and e.get("format") == summaries.FORMAT_VERSION and gone.intersection(e["sources"])):
            e["raw_retired"] = now.isoformat()
    reports_cutoff = now - timedelta(days=facts_days)
    # job reports (hourly throughput, checkpoints saved) and shared GPUs' hourly split, by their time column: kept like hour facts
    hourly = {"job_throughput": "ts", "gpu_job_shares": "ts", "job_checkpoints": "saved_at"}
    old_hourly = {t: w.db.execute(f"SELECT count(*) FROM {t} WHERE {c} < ?", [reports_cutoff]).fetchone()[0] for t, c in hourly.items()}
    old_reports = sum(old_hourly.values())
    if not old and not old_reports:
        if expired or facts_gone:
            w.publish()
        return expired + facts_gone
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
    log.info("retention: retired %d sample files, %d facts files and %d summaries, deleted %d job throughput, checkpoint and GPU share rows",
             len(old), facts_gone, expired, old_reports)
    return len(old) + facts_gone + old_reports + expired


def retire_facts(w: StoreWriter, now: datetime, raw_days: int, facts_5m_days: int, facts_days: int) -> int:
    """Unlist the facts of the days that ended more than `facts_5m_days` (a day's 5-minute facts,
    all at once) or `facts_days` (its hour and day facts) before `now`; returns how many files.
    Upkeep builds a settled hour's facts from its samples and a day's from its hours, so a grain
    outlives what it is built from: 5-minute facts go no sooner than the raw samples (raw_days),
    hour and day facts no sooner than the 5-minute ones. The caller publishes."""
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
    """`gpufleet collect --rebuild-facts`: build the facts of the settled hours and closed days that
    overlap `span` (None: all) again, whether or not their inputs changed (a file lost or damaged),
    then publish. An hour without samples left (retention) keeps its facts, and so does one whose
    sample holding into it went (build_facts) and a day without 5-minute facts left. Returns
    build_facts' counts. `tasks`: where the hours are built, as there."""
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

    def label(self) -> str:
        return f"facts {_iso(self.hour_us)}"


def build_fact_hour(task: FactsTask) -> str:
    """The hour's facts file, written atomically to task.rel; one DuckDB thread, as the writer's
    own connection: the same bytes wherever it runs. Module-level: Dask sends it by name."""
    h = task.hour_us
    con = duckdb.connect(":memory:", config={"threads": 1})
    try:
        q = facts.samples_query(sample_source(con, [str(Path(task.root) / f) for f in task.sources]))
        samples = con.sql(q, params={"lo": h, "hi": h + facts.HOUR_US, "gap_us": task.params.gap_us}).to_arrow_table()
    finally:
        con.close()
    _write_facts(Path(task.root), task.rel, facts.build_parts(samples, task.hold, h, h + facts.HOUR_US, task.params), task.tag)
    return task.rel


def _holds_in(hold: pa.Table, h: int) -> pa.Table:
    """The holds (facts.HOLDS' rows) overlapping the hour starting at h (epoch us)."""
    return hold.filter(pc.and_(pc.greater(hold["a1"], h), pc.less(hold["a0"], h + facts.HOUR_US)))


def build_facts(w: StoreWriter, now_us: int, p: facts.FactParams, span: tuple[int, int] | None = None,
                force: bool = False, limit: int | None = None, tasks: TaskRunner | None = None) -> dict[str, int]:
    """Write the facts of every settled hour whose inputs (its sample files, the allocation edges
    in it, the parameters, the format) changed since its file was written, and of every closed
    day whose hours' files changed: exactly the touched buckets and their coarser parents. Returns
    how many hour and day files were (re)written ("hours", "days") and how many are left for the
    next passes ("hours_left", "days_left"; also kept as w.facts_backlog); the caller publishes.
    Run twice, it writes nothing. `span` (epoch us, [from, to)): only the hours and days that
    overlap it; `force`: those whose inputs did not change too; `limit`: at most that many hours,
    newest first (a store without facts has every hour it keeps to build, under the writer's
    lock), and no day until all its hours are current. The hours are FactsTasks, run by `tasks` (a
    Dask scheduler) when there are at least DASK_MIN_HOURS of them, else here: the same bytes.

    An hour is keyed on the files holding its own samples; the files whose samples end within
    max_gap before it (the sample holding into it: its "head") are read too, and a new one there
    (late data, compaction) rebuilds it, but one that only went (raw retention) does not - not
    even with `force`: built again without the sample that held into it, the hour would lose up
    to max_gap seconds at its start."""
    tag = p.tag()
    gap = p.gap_us
    files = w.db.execute("SELECT file, epoch_us(min(min_ts)), epoch_us(max(max_ts)) FROM batches "
                         "WHERE file <> '' AND min_ts IS NOT NULL GROUP BY file ORDER BY file").fetchall()
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
    runner = replace(summary_runner(tasks, built["hours"]), name="facts")
    for day, work in todo.items():  # a day's tasks at a time: each carries its hour's holds
        for task in work:
            task.hold = _holds_in(hold, task.hour_us)
        for task, rel in zip(work, runner.map(build_fact_hour, work, label=FactsTask.label)):
            w.put_facts(f"5m/{_iso(task.hour_us)}", {"grain": "5m", "bucket": _iso(task.hour_us), "file": rel, "inputs": task.inputs,
                                                     "head": list(task.head), "tag": tag, "format": facts.FORMAT_VERSION})
            task.hold = None  # (a rebuild of the whole store holds a day's at a time)
    days: dict[int, list[str]] = {}
    for key, e in w.facts.items():
        if e["grain"] == "5m" and e["tag"] == tag:
            h = epoch_us(datetime.fromisoformat(e["bucket"]))
            days.setdefault(h - h % facts.DAY_US, []).append(e["file"])
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
        fine = w.db.sql(f"SELECT * EXCLUDE (tag) FROM read_parquet({_sql_list([str(w.root / f) for f in sorted(fs)])}, hive_partitioning = false)").to_arrow_table()
        hourly = facts.join_parts(fine.cast(facts.SCHEMA), facts.GRAIN_1H, p)
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
