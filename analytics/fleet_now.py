"""The fleet at one moment: each GPU's latest sample, who holds it, and how fresh the data is.

Pure functions over a reader connection and an "as of" time (the pages ask as_of = now). Definitions:

- Latest sample: each GPU's (or MIG instance's) newest at or before as_of, within the look-back from
  the hour as_of - `lookback` falls in (look_from): facts' run marks (collector.facts.RUN_MARKS), then
  raw samples (counted, raw_reads.py).
- Stale: older than `stale_after` (5 min: the Prometheus-API source's 120 s lag + 60 s interval, with
  room): shown as "no data", never idle or busy (contract 4).
- Known GPUs: inventory rows seen within `forget_after` (24 h) of as_of: a quiet GPU shows as "no data".
- Status, first match wins: "lost" (gpufleet_gpu_up = 0 in a fresh sample), "no data", "error" (a fresh
  sample with an XID, a volatile double-bit ECC error or a row-remap failure), "ok".
- Holder: a job whose allocation covers as_of, from its scheduler start (else first seen) to its end;
  a job not yet ended holds until it ends, one the scheduler does not know until last seen + stale_after.
- Idle allocated now: held, fresh, below the idle threshold. `idle_since`: the first sample after the
  last busy one in the look-back; a gap without data does not end the run (a collector restart must
  not reset it). With no busy sample, `idle_since_capped` and the first idle sample seen, never the
  collector's start. Cost per hour: $/GPU-hour x MIG share; None if any is unpriced.
- Last XID: the newest non-zero XID within `forget_after`, not only the latest sample's: a GPU that fell
  off the bus reports nothing more, but its XID is what an operator needs.
- Counting (summarize): GPUs are PHYSICAL GPUs (MIG instances sharing a UUID are one); lost, no data
  and reporting add up to the GPUs known. Held, free and no-process are GPU equivalents (3g.40gb = 3/7).

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
    """One row per known GPU (or MIG instance) at `as_of`: its latest sample (ts, xid_last), status,
    holders (held, jobs count, job_ids, ...), idle_since, last_xid and usd_per_gpu_hour (sql.GPU_STATES).
    Cluster and model filters narrow the GPUs; job filters keep the GPUs a matching job holds now."""
    binds = _binds(params, as_of, stale_after, lookback, forget_after)
    cur = con.cursor()  # own cursor: the reader connection (and its temp tables) is shared between sessions
    try:
        stored = stored_buckets(cur, fact_params(params))  # both tile their spans with it
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
    """GPU_STATES' temp tables: now_rows, the look-back's runs per GPU from the coarsest facts that fit
    (`stored`) and raw samples elsewhere; now_latest, each GPU's newest sample."""
    fp = fact_params(params)
    lo, hi = epoch_us(binds["look_from"]), epoch_us(binds["as_of"]) + 1
    # the last stale_after is read raw: it holds every reporting GPU's newest sample, so only quiet GPUs need theirs read alone
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
    """Temp table xid_rows: per GPU and span of (as_of - forget_after, as_of], its last XID code and time,
    from the coarsest facts that fit and raw samples elsewhere."""
    fp = fact_params(params)
    hi = epoch_us(binds["as_of"]) + 1
    lo = hi - round(binds["forget_after"] * 1_000_000)  # ts > as_of - forget_after
    read = _span_rows(cur, fp, binds, tile(lo, hi, stored), "fleet now xids", sql.RAW_XID_ROWS, sql.FACT_XID_ROWS)
    cur.execute(sql.XID_ROWS_TABLE)
    _table(cur, "xid_rows", [t for _, t in read], append=True)


def _span_rows(cur: duckdb.DuckDBPyConnection, fp: FactParams, binds: dict[str, Any], spans: list[tuple[int | None, int, int]],
               kind: str, raw_query: str, fact_query: str) -> list[tuple[bool, pa.Table]]:
    """Each span's (from raw, table), in order: `raw_query` where it has no facts (grain None; a raw read of
    `kind`), else `fact_query` over its buckets' files alone (the fact_parts view opens every facts file)."""
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
    """Headline counts of gpu_states(): GPUs are physical GPUs; held, free and no-process are GPU equivalents."""

    as_of: datetime
    gpus: int  # physical GPUs known
    reporting: int  # physical GPUs with fresh data that are not lost
    no_data: int  # physical GPUs with no fresh sample from any instance
    lost: int  # gpu_up = 0 in a fresh sample of the GPU or of an instance
    error: int  # physical GPUs reporting an error (not lost)
    held: float  # GPU equivalents held by jobs
    free: float  # GPU equivalents reporting and not held, on GPUs that are not lost
    unsliced: float  # GPU equivalents of reporting MIG GPUs that no instance covers
    held_no_process: float  # GPU equivalents held, fresh, with zero compute processes
    idle_allocated: int  # devices (GPUs or MIG instances)
    idle_allocated_long: int  # ... for at least idle_min_duration
    idle_allocated_usd_per_h: float | None  # None: a GPU among them has no price
    idle_allocated_gpus: float  # GPU equivalents
    mean_utilization_pct: float | None  # over reporting GPUs, weighted by GPU equivalents
    unpriced_models: tuple[str, ...]


# a physical GPU: its MIG instances share its UUID
_GPU_KEY = [pl.col("cluster"), pl.col("host"), pl.coalesce(pl.col("gpu_uuid"), pl.format("#{}", pl.col("gpu"))).alias("gpu_uuid")]


def physical_gpus(states: pl.DataFrame) -> pl.DataFrame:
    """One row per physical GPU of gpu_states(), its MIG instances folded in: devices, equiv, and fresh,
    lost, error of any instance; reporting = fresh and not lost."""
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
    """Per host (one exporter each): physical GPUs known and with a fresh sample (a lost GPU's counts: its
    exporter still sends), the newest sample and its age, `fresh` if any GPU is. Stalest first."""
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
    """The store's manifest on the collector: last publish (after every commit: its age is how long since
    the collector wrote), version, and unrecognized inputs, newest first (StoreWriter.note_unrecognized).
    A sharded store lists each in `shards`; the top-level figures are the stalest shard's, so a dead one
    shows. {"published_at": None, ...} for a missing store."""
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
