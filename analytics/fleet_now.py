"""The fleet at one moment: each GPU's latest sample, who holds it, and how fresh the data is.

Pure functions over a reader connection (gpufleet.collector.store.open_reader) and an "as of" time: the
dashboards' "Fleet now" and "Health" pages ask them with as_of = now, and any past moment works
the same way. Definitions, and why:

- Latest sample: the newest sample of each GPU (or MIG instance) at or before as_of, looked for
  within the look-back: from the start of the hour that as_of - `lookback` (default 6 h) falls in
  (look_from), so 6 to 7 hours. Bounded so the query reads hours, not the whole store.
- Cost: the look-back's runs come from the store's facts (the coarsest buckets that fit, as a
  window's figures: their parts' run marks, gpufleet.collector.facts.RUN_MARKS: first and last
  sample, last busy sample and first idle one after it, last gap, ...) and from the raw samples
  after the newest facts (summed per GPU and hour the same way, gpufleet.collector.schema.NOW_HOURS),
  composed in time order. The newest sample is the raw rows'; for a GPU whose newest sample lies
  in the facts (one that went quiet) it is read alone. Raw reads are counted (analytics/raw_reads.py:
  "fleet now", "fleet now newest").
- Stale: a latest sample older than `stale_after` (default 5 min) is not the GPU's state now.
  5 min covers the Prometheus-API source (120 s lag + a 60 s interval) with room; a scrape every
  15 s is far inside it. A stale GPU shows as "no data", never as idle or busy (contract 4).
- Known GPUs: the inventory (`gpus`) rows seen within `forget_after` (default 24 h) of as_of, so
  a GPU whose exporter went quiet an hour ago still shows, as "no data", and a GPU retired
  yesterday drops off.
- Status, first match wins: "lost" (gpufleet_gpu_up = 0 in a fresh sample), "no data" (stale or
  never sampled), "error" (a fresh sample with an XID code, a volatile double-bit ECC error or a
  row-remap failure), "ok".
- Holder: a job whose allocation covers as_of: from its scheduler start (else the first time
  the exporter saw it on the GPU) to its scheduler end; a job the scheduler started and has not
  ended (RUNNING, a running pod) holds until it does; a job the scheduler does not know (yet)
  holds until the exporter last saw it + stale_after.
- Idle allocated now: held, fresh, utilization below the idle threshold. `idle_since` is the first
  sample after the GPU's last busy sample (utilization at or above the threshold) in the store
  - the history and the live collector's samples alike - within the look-back; a gap without
  data does not end the idle run, since nothing busy was seen in it (so a collector restart or
  the demo's switch from history to live scrapes does not reset it). When no busy sample is known
  in the look-back, `idle_since_capped` is true and `idle_since` is the first idle sample looked
  at: the GPU has been idle since before then ("idle since before <time>"); when it became idle
  is unknown, and is never taken to be the collector's start.
  Its cost per hour is the GPUs' $/GPU-hour (MIG instances their slice share); unknown (None)
  if any of those GPUs has no price.
- Last XID: `last_xid` is the newest non-zero XID code the GPU reported within `forget_after`
  (`last_xid_at` when), not only the latest sample's: a GPU that fell off the bus reports nothing
  any more, but the XID it threw before is what an operator needs to see. Read from the facts
  (each XID code's last sample time in a part) where the store has them, raw samples elsewhere
  (counted: "fleet now xids").
- Counting (summarize): the fleet's GPUs are PHYSICAL GPUs - the MIG instances of a GPU (rows
  sharing its UUID) are parts of one GPU, not GPUs. A GPU is reporting when it has a fresh sample
  and is not lost; lost (any of its instances lost), no data (no fresh sample from any instance)
  and reporting add up to the GPUs known. Held, free and held-with-no-process are GPU
  equivalents: a MIG instance counts as its share of its GPU (3g.40gb = 3/7).

Every user-supplied value (filters, times) is a bound parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from gpufleet.analytics import raw_reads, sql
from gpufleet.analytics.core import not_attributable_reason
from gpufleet.analytics.facts import FIVE_US, fact_files_of, fact_params, stored_buckets, tile
from gpufleet.analytics.prices import price_table, usd_per_gpu_hour
from gpufleet.analytics.params import Params
from gpufleet.collector.facts import FactParams
from gpufleet.collector.reading import query_rows
from gpufleet.times import HOUR, epoch_us, floor_time, utcnow

STALE_AFTER = timedelta(minutes=5)
LOOKBACK = timedelta(hours=6)
FORGET_AFTER = timedelta(hours=24)

STATUSES = ("ok", "error", "lost", "no data")


def look_from(as_of: datetime, lookback: timedelta) -> datetime:
    """Where the look-back starts: the start of the hour as_of - lookback falls in."""
    return floor_time(as_of - lookback, HOUR)


def _binds(params: Params, as_of: datetime, stale_after: timedelta, lookback: timedelta, forget_after: timedelta) -> dict[str, Any]:
    f = params.filters
    return {
        "as_of": as_of, "stale_after": stale_after.total_seconds(), "look_from": look_from(as_of, lookback),
        "forget_after": forget_after.total_seconds(), "max_gap": params.max_gap.total_seconds(), "thr": params.idle_threshold,
        "max_gap_us": fact_params(params).gap_us,
        **f.bind(),
    }


def gpu_states(con: duckdb.DuckDBPyConnection, params: Params, as_of: datetime, *, stale_after: timedelta = STALE_AFTER,
               lookback: timedelta = LOOKBACK, forget_after: timedelta = FORGET_AFTER) -> pl.DataFrame:
    """One row per known GPU (or MIG instance) at `as_of`: its latest sample, status and holders.

    Columns: cluster, host, gpu, gpu_uuid, gi, model, mig_profile, equiv, ts (latest sample),
    age_s, fresh, util, fb_used_mib, fb_total_mib, gpu_temp_c, mem_temp_c, power_w, xid_last (latest
    sample), last_xid, last_xid_at, gpu_up, compute_processes (an integer), clocks_event_reasons, ecc_dbe_vol, remap_failure, status,
    idle_since, idle_since_capped, held, jobs (count), job_ids, job_names, user_names, accounts,
    schedulers, idle_allocated, no_process, usd_per_gpu_hour.
    Filters: cluster and model narrow the GPUs; account, user, partition and job keep only the
    GPUs held now by a matching job.
    """
    binds = _binds(params, as_of, stale_after, lookback, forget_after)
    cur = con.cursor()  # a cursor of its own: the reader connection is shared between sessions (its temp tables too)
    try:
        stored = stored_buckets(cur, fact_params(params))  # (read once: both tile their spans with it)
        now_rows(cur, params, binds, stored)
        xid_rows(cur, params, binds, stored)
        df = pl.from_arrow(query_rows(cur, sql.GPU_STATES, sql.bound(sql.GPU_STATES, binds)))
    finally:
        cur.close()
    df = df.with_columns(usd_per_gpu_hour(price_table(params.prices)).alias("usd_per_gpu_hour"))
    if not_attributable_reason(params.filters) is not None:  # a job filter: the GPUs its jobs hold now
        df = df.filter(pl.col("held"))
    return df.sort(["cluster", "host", "gpu", "gi"], nulls_last=True)


def now_rows(cur: duckdb.DuckDBPyConnection, params: Params, binds: dict[str, Any], stored: dict[int, set[int]]) -> None:
    """The temp tables GPU_STATES composes (sql.FACT_NOW_ROWS): now_rows, the look-back's runs per
    GPU from the facts of the coarsest buckets that fit (`stored`: facts.stored_buckets) and from
    the raw samples after them (and in any bucket without facts), and now_latest, each GPU's newest sample."""
    fp = fact_params(params)
    lo, hi = epoch_us(binds["look_from"]), epoch_us(binds["as_of"]) + 1
    # the newest minutes are read raw whatever facts there are: a reporting GPU's newest sample (at
    # most stale_after old) is among them, so only GPUs gone quiet need theirs read alone
    cut = max(lo, (hi - round(binds["stale_after"] * 1_000_000)) // FIVE_US * FIVE_US)
    spans = tile(lo, cut, stored)
    if spans and spans[-1][0] is None:
        cut = spans.pop()[1]
    spans.append((None, cut, hi))
    read = _span_rows(cur, fp, binds, spans, "fleet now", sql.NOW_RAW_ROWS, sql.FACT_NOW_ROWS)
    raw, facts = [t for from_raw, t in read if from_raw], [t for from_raw, t in read if not from_raw]
    marks = ["cluster", "host", "gpu_uuid", "gi", *sql.NOW_MARK_COLUMNS]
    _table(cur, "now_rows", [t.select(marks).append_column("from_raw", pa.array([True] * t.num_rows, pa.bool_())) for t in raw]
           + [t.select(marks).append_column("from_raw", pa.array([False] * t.num_rows, pa.bool_())) for t in facts])
    latest = ["cluster", "host", "gpu_uuid", "gi", "now_last", "now_newest"]
    _table(cur, "now_latest", [t.select(latest) for t in raw])
    cur.execute(f"CREATE OR REPLACE TEMP TABLE now_want AS {sql.NOW_WANT}")
    first, last = cur.execute("SELECT min(ts), max(ts) FROM now_want").fetchall()[0]
    if first is not None:
        bind = {**binds, "lo": first, "hi": last}
        _table(cur, "now_latest", [raw_reads.read(cur, "fleet now newest", sql.NOW_NEWEST_AT, sql.bound(sql.NOW_NEWEST_AT, bind),
                                                  epoch_us(first), epoch_us(last) + 1).select(latest)], append=True)


def xid_rows(cur: duckdb.DuckDBPyConnection, params: Params, binds: dict[str, Any], stored: dict[int, set[int]]) -> None:
    """The temp table xid_rows GPU_STATES takes each GPU's last XID from (sql.FACT_XID_ROWS): per
    GPU and span of (as_of - forget_after, as_of], its last XID code and time, from the facts of the
    coarsest buckets that fit and from raw samples elsewhere."""
    fp = fact_params(params)
    hi = epoch_us(binds["as_of"]) + 1
    lo = hi - round(binds["forget_after"] * 1_000_000)  # (ts > as_of - forget_after: from the microsecond after)
    read = _span_rows(cur, fp, binds, tile(lo, hi, stored), "fleet now xids", sql.RAW_XID_ROWS, sql.FACT_XID_ROWS)
    cur.execute(sql.XID_ROWS_TABLE)
    _table(cur, "xid_rows", [t for _, t in read], append=True)


def _span_rows(cur: duckdb.DuckDBPyConnection, fp: FactParams, binds: dict[str, Any], spans: list[tuple[int | None, int, int]],
               kind: str, raw_query: str, fact_query: str) -> list[tuple[bool, pa.Table]]:
    """Each span's rows, (from raw, table) in order: `raw_query` over its samples where it has no
    facts (grain None; counted as a raw read of `kind`), else `fact_query` over the files of its
    buckets alone (the fact_parts view opens every facts file of the store)."""
    out = []
    for grain, a, b in spans:
        bind = {**binds, "tag": fp.tag(), "grain": grain, "lo": a, "hi": b}
        if grain is None:
            out.append((True, raw_reads.read(cur, kind, raw_query, sql.bound(raw_query, bind), a, b)))
        else:
            bind["files"] = fact_files_of(cur, fp.tag(), grain, [(a, b)])
            out.append((False, query_rows(cur, fact_query, sql.bound(fact_query, bind))))
    return out


def _table(cur: duckdb.DuckDBPyConnection, name: str, tables: list[pa.Table], append: bool = False) -> None:
    """Temp table `name` of `tables`' rows (by column name; the first gives the types), or (append) more rows for it."""
    for i, t in enumerate(tables):
        cur.register("_now", t)
        try:
            if i == 0 and not append:
                cur.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM _now")
            else:
                cur.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _now")
        finally:
            cur.unregister("_now")


@dataclass(frozen=True)
class FleetNow:
    """Headline counts of gpu_states(): GPUs are physical GPUs (a GPU's MIG instances are one GPU);
    held, free and no-process are GPU equivalents (a MIG instance counts as its share)."""

    as_of: datetime
    gpus: int  # physical GPUs known
    reporting: int  # physical GPUs with fresh data that are not lost
    no_data: int  # physical GPUs with no fresh sample from any instance
    lost: int  # physical GPUs lost (gpu_up = 0 in a fresh sample of the GPU or of an instance)
    error: int  # physical GPUs reporting an error (not lost)
    held: float  # GPU equivalents held by jobs
    free: float  # GPU equivalents reporting and not held, on GPUs that are not lost
    unsliced: float  # GPU equivalents of reporting MIG GPUs that no instance covers (neither held nor free)
    held_no_process: float  # GPU equivalents held, fresh, with zero compute processes
    idle_allocated: int  # devices (GPUs or MIG instances) held, fresh, utilization below the idle threshold
    idle_allocated_long: int  # ... for at least idle_min_duration
    idle_allocated_usd_per_h: float | None  # None: a GPU among them has no price
    idle_allocated_gpus: float  # GPU equivalents (MIG instances count as their share)
    mean_utilization_pct: float | None  # over reporting GPUs, weighted by GPU equivalents
    unpriced_models: tuple[str, ...]


# a physical GPU: its MIG instances share its UUID
_GPU_KEY = [pl.col("cluster"), pl.col("host"), pl.coalesce(pl.col("gpu_uuid"), pl.format("#{}", pl.col("gpu"))).alias("gpu_uuid")]


def physical_gpus(states: pl.DataFrame) -> pl.DataFrame:
    """One row per physical GPU of gpu_states(): its MIG instances (rows sharing the GPU's UUID)
    folded into it. Columns: cluster, host, gpu_uuid, devices, equiv, fresh (any instance),
    lost (any instance), error (any instance), reporting (fresh and not lost)."""
    return (
        states.group_by(_GPU_KEY)
        .agg(pl.len().alias("devices"), pl.col("equiv").sum().alias("equiv"), pl.col("fresh").any().alias("fresh"),
             (pl.col("status") == "lost").any().alias("lost"), (pl.col("status") == "error").any().alias("error"))
        .with_columns((pl.col("fresh") & ~pl.col("lost")).alias("reporting"), (pl.col("error") & ~pl.col("lost")).alias("error"))
        .sort("cluster", "host", "gpu_uuid")
    )


def summarize(states: pl.DataFrame, params: Params, as_of: datetime) -> FleetNow:
    empty = states.is_empty()
    phys = physical_gpus(states) if not empty else None
    n = lambda expr: 0 if empty else int(phys.filter(expr).height)  # noqa: E731  physical GPUs
    eq = lambda expr: 0.0 if empty else float(states.filter(expr)["equiv"].sum())  # noqa: E731  GPU equivalents
    idle = states.filter(pl.col("idle_allocated")) if not empty else states
    cost: float | None
    if idle.is_empty():
        cost = 0.0
    elif idle["usd_per_gpu_hour"].is_null().any():
        cost = None
    else:
        cost = float((idle["usd_per_gpu_hour"] * idle["equiv"]).sum())
    fresh = states.filter(pl.col("fresh") & pl.col("util").is_not_null()) if not empty else states
    mean = float((fresh["util"] * fresh["equiv"]).sum() / fresh["equiv"].sum()) if not fresh.is_empty() and fresh["equiv"].sum() > 0 else None
    long_cut = as_of - params.idle_min_duration
    return FleetNow(
        as_of=as_of,
        gpus=0 if empty else phys.height,
        reporting=n(pl.col("reporting")),
        no_data=n(~pl.col("fresh")),
        lost=n(pl.col("lost")),
        error=n(pl.col("error")),
        held=eq(pl.col("held")),
        free=eq(pl.col("fresh") & ~pl.col("held") & ~(pl.col("status") == "lost").any().over(_GPU_KEY)),  # not on a lost GPU
        unsliced=0.0 if empty else float(phys.filter(pl.col("reporting")).select((1.0 - pl.col("equiv")).clip(lower_bound=0.0).sum()).item()),
        held_no_process=eq(pl.col("no_process")),
        idle_allocated=idle.height,
        idle_allocated_long=int(idle.filter(pl.col("idle_since") <= long_cut).height) if not idle.is_empty() else 0,
        idle_allocated_usd_per_h=cost,
        idle_allocated_gpus=float(idle["equiv"].sum()) if not idle.is_empty() else 0.0,
        mean_utilization_pct=mean,
        unpriced_models=tuple(sorted({m for m in states.filter(pl.col("usd_per_gpu_hour").is_null())["model"].to_list() if m})) if not empty else (),
    )


def host_freshness(states: pl.DataFrame) -> pl.DataFrame:
    """Per host (one exporter each) from gpu_states(): physical GPUs known, physical GPUs with a fresh
    sample (a lost GPU's exporter still sends samples: it counts here), the newest sample and its
    age; `fresh` when any GPU of the host has a fresh sample. Stalest first."""
    if states.is_empty():
        return pl.DataFrame(schema={"cluster": pl.Utf8, "host": pl.Utf8, "gpus": pl.UInt32, "reporting": pl.UInt32,
                                    "last_sample": pl.Datetime("us"), "age_s": pl.Float64, "fresh": pl.Boolean})
    return (
        states.group_by("cluster", "host")
        .agg(pl.col("gpu_uuid").n_unique().cast(pl.UInt32).alias("gpus"),
             pl.col("gpu_uuid").filter(pl.col("fresh")).n_unique().cast(pl.UInt32).alias("reporting"),
             pl.col("ts").max().alias("last_sample"), pl.col("age_s").min().alias("age_s"), pl.col("fresh").any().alias("fresh"))
        .sort(["fresh", "age_s", "cluster", "host"], descending=[False, True, False, False], nulls_last=False)
    )


def collector_status(root: str | Path, now: datetime | None = None) -> dict[str, Any]:
    """What the store's manifest says about the collector: last publish, its age, version, and
    the inputs it did not recognize (newest first: source, input, kind, detail, count,
    first_seen, last_seen; see StoreWriter.note_unrecognized).

    The collector publishes after every commit, so the age of the last publish is how long ago
    the collector last wrote anything. A sharded store (gpufleet.collector.shard) has one per
    shard, listed in `shards`; the top-level figures are the stalest shard's, so a dead shard
    shows. Returns {"published_at": None, ...} for a missing store.
    """
    from gpufleet.collector.store import StoreError, read_manifests

    now = now or utcnow()
    try:
        parts = read_manifests(root)
    except StoreError:
        return {"published_at": None, "age_s": None, "version": None, "sample_files": 0, "unrecognized": [], "shards": []}
    shards = []
    for directory, m in parts:
        try:
            published = datetime.fromisoformat(m["published_at"])
        except (KeyError, TypeError, ValueError):
            published = None
        if published is not None and published.tzinfo is not None:
            published = published.astimezone(timezone.utc).replace(tzinfo=None)
        shards.append({"shard": directory.name if directory != Path(root) else None, "published_at": published,
                       "age_s": (now - published).total_seconds() if published else None, "version": m.get("version")})
    stalest = min(shards, key=lambda x: (x["published_at"] is not None, x["published_at"] or datetime.min))
    unrecognized = [_unrecognized_entry(u) for _, m in parts for u in m.get("unrecognized", []) if isinstance(u, dict)]
    unrecognized.sort(key=lambda u: u["last_seen"] or datetime.min, reverse=True)
    return {
        "published_at": stalest["published_at"],
        "age_s": stalest["age_s"],
        "version": sum(x["version"] or 0 for x in shards),
        "sample_files": sum(len(m.get("samples", [])) for _, m in parts),
        "unrecognized": unrecognized,
        "shards": shards if len(parts) > 1 or shards[0]["shard"] is not None else [],
    }


def _unrecognized_entry(u: dict[str, Any]) -> dict[str, Any]:
    """One manifest entry of unrecognized input, typed for a table (unknown stays None)."""
    def when(v: Any) -> datetime | None:
        try:
            return datetime.fromisoformat(str(v)) if v else None
        except ValueError:
            return None

    count = u.get("count")
    return {"last_seen": when(u.get("last_seen")), "source": str(u.get("source", "")), "input": str(u.get("input", "")),
            "kind": str(u.get("kind", "")), "detail": str(u.get("detail", "")),
            "count": count if isinstance(count, int) else None, "first_seen": when(u.get("first_seen"))}


def filter_values(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """The values a filter can take: clusters, GPU models, accounts, users, partitions."""
    cur = con.cursor()
    try:
        return {name: [r[0] for r in cur.execute(q).fetchall()] for name, q in sql.FILTER_VALUES.items()}
    finally:
        cur.close()
