"""The fleet at one moment: each GPU's latest sample, who holds it, and how fresh the data is.

Pure functions over a reader connection (gpufleet.collector.store.open_reader) and an "as of" time: the
dashboards' "Fleet now" and "Health" pages ask them with as_of = now, and any past moment works
the same way. Definitions, and why:

- Latest sample: the newest sample of each GPU (or MIG instance) at or before as_of, looked for
  within `lookback` (default 6 h: bounded so the query reads hours, not the whole store).
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
- Idle allocated now: held, fresh, utilization below the idle threshold. `idle_since` is the start
  of the current run of below-threshold samples (a gap longer than max_gap ends a run: no data is
  not idle); a run reaching back to the lookback's start is capped there (`idle_since_capped`).
  Its cost per hour is the GPUs' $/GPU-hour (MIG instances their slice share); unknown (None)
  if any of those GPUs has no price.

Every user-supplied value (filters, times) is a bound parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.core import price_table
from gpufleet.analytics.params import Params
from gpufleet.times import utcnow

STALE_AFTER = timedelta(minutes=5)
LOOKBACK = timedelta(hours=6)
FORGET_AFTER = timedelta(hours=24)

STATUSES = ("ok", "error", "lost", "no data")


def _q(con: duckdb.DuckDBPyConnection, query: str, binds: dict[str, Any]) -> pl.DataFrame:
    cur = con.cursor()  # a cursor of its own: the reader connection is shared between sessions
    try:
        names = {k: v for k, v in binds.items() if f"${k}" in query}
        return pl.from_arrow(cur.sql(query, params=names).to_arrow_table())
    finally:
        cur.close()


def _binds(params: Params, as_of: datetime, stale_after: timedelta, lookback: timedelta, forget_after: timedelta) -> dict[str, Any]:
    f = params.filters
    return {
        "as_of": as_of, "stale_after": stale_after.total_seconds(), "lookback": lookback.total_seconds(),
        "forget_after": forget_after.total_seconds(), "max_gap": params.max_gap.total_seconds(), "thr": params.idle_threshold,
        "cluster": f.cluster, "model": f.model, "account": f.account, "user_name": f.user_name, "partition": f.partition,
    }


def gpu_states(con: duckdb.DuckDBPyConnection, params: Params, as_of: datetime, *, stale_after: timedelta = STALE_AFTER,
               lookback: timedelta = LOOKBACK, forget_after: timedelta = FORGET_AFTER) -> pl.DataFrame:
    """One row per known GPU (or MIG instance) at `as_of`: its latest sample, status and holders.

    Columns: cluster, host, gpu, gpu_uuid, gi, model, mig_profile, equiv, ts (latest sample),
    age_s, fresh, util, fb_used_mib, fb_total_mib, gpu_temp_c, mem_temp_c, power_w, xid_last,
    gpu_up, compute_processes, clocks_event_reasons, ecc_dbe_vol, remap_failure, status,
    idle_since, idle_since_capped, held, jobs (count), job_ids, job_names, user_names, accounts,
    schedulers, idle_allocated, no_process, usd_per_gpu_hour.
    Filters: cluster and model narrow the GPUs; account, user and partition keep only the GPUs
    held now by a matching job.
    """
    b = _binds(params, as_of, stale_after, lookback, forget_after)
    df = _q(con, sql.GPU_STATES, b)
    prices = price_table(params.prices)
    df = df.with_columns(
        pl.col("model").replace_strict(prices, default=None, return_dtype=pl.Float64).alias("usd_per_gpu_hour"),
    )
    job_filter = any(v is not None for v in (params.filters.account, params.filters.user_name, params.filters.partition))
    if job_filter:
        df = df.filter(pl.col("held"))
    return df.sort(["cluster", "host", "gpu", "gi"], nulls_last=True)


@dataclass(frozen=True)
class FleetNow:
    """Headline counts of gpu_states()."""

    as_of: datetime
    gpus: int
    reporting: int  # fresh data
    no_data: int
    lost: int
    error: int
    held: int
    free: int  # reporting and not held
    held_no_process: int  # held, fresh, zero compute processes
    idle_allocated: int  # held, fresh, utilization below the idle threshold
    idle_allocated_long: int  # ... for at least idle_min_duration
    idle_allocated_usd_per_h: float | None  # None: a GPU among them has no price
    idle_allocated_gpus: float  # GPU equivalents (MIG instances count as their share)
    mean_utilization_pct: float | None  # over reporting GPUs, weighted by GPU equivalents
    unpriced_models: tuple[str, ...]


def summarize(states: pl.DataFrame, params: Params, as_of: datetime) -> FleetNow:
    n = lambda expr: int(states.filter(expr).height) if not states.is_empty() else 0  # noqa: E731
    idle = states.filter(pl.col("idle_allocated")) if not states.is_empty() else states
    cost: float | None
    if idle.is_empty():
        cost = 0.0
    elif idle["usd_per_gpu_hour"].is_null().any():
        cost = None
    else:
        cost = float((idle["usd_per_gpu_hour"] * idle["equiv"]).sum())
    fresh = states.filter(pl.col("fresh") & pl.col("util").is_not_null()) if not states.is_empty() else states
    mean = float((fresh["util"] * fresh["equiv"]).sum() / fresh["equiv"].sum()) if not fresh.is_empty() and fresh["equiv"].sum() > 0 else None
    long_cut = as_of - params.idle_min_duration
    return FleetNow(
        as_of=as_of,
        gpus=states.height,
        reporting=n(pl.col("fresh")),
        no_data=n(pl.col("status") == "no data"),
        lost=n(pl.col("status") == "lost"),
        error=n(pl.col("status") == "error"),
        held=n(pl.col("held")),
        free=n(pl.col("fresh") & ~pl.col("held")),
        held_no_process=n(pl.col("no_process")),
        idle_allocated=idle.height,
        idle_allocated_long=int(idle.filter(pl.col("idle_since") <= long_cut).height) if not idle.is_empty() else 0,
        idle_allocated_usd_per_h=cost,
        idle_allocated_gpus=float(idle["equiv"].sum()) if not idle.is_empty() else 0.0,
        mean_utilization_pct=mean,
        unpriced_models=tuple(sorted({m for m in states.filter(pl.col("usd_per_gpu_hour").is_null())["model"].to_list() if m})) if not states.is_empty() else (),
    )


def host_freshness(states: pl.DataFrame) -> pl.DataFrame:
    """Per host (one exporter each) from gpu_states(): GPUs known, GPUs reporting, the newest
    sample and its age; `fresh` when any GPU of the host has a fresh sample. Stalest first."""
    if states.is_empty():
        return pl.DataFrame(schema={"cluster": pl.Utf8, "host": pl.Utf8, "gpus": pl.UInt32, "reporting": pl.UInt32,
                                    "last_sample": pl.Datetime("us"), "age_s": pl.Float64, "fresh": pl.Boolean})
    return (
        states.group_by("cluster", "host")
        .agg(pl.len().alias("gpus"), pl.col("fresh").sum().cast(pl.UInt32).alias("reporting"),
             pl.col("ts").max().alias("last_sample"), pl.col("age_s").min().alias("age_s"), pl.col("fresh").any().alias("fresh"))
        .sort(["fresh", "age_s", "cluster", "host"], descending=[False, True, False, False], nulls_last=False)
    )


def collector_status(root: str | Path, now: datetime | None = None) -> dict[str, Any]:
    """What the store's manifest says about the collector: last publish, its age, version, and
    the inputs it did not recognize (newest first: source, input, kind, detail, count,
    first_seen, last_seen; see StoreWriter.note_unrecognized).

    The collector publishes after every commit, so the age of the last publish is how long ago
    the collector last wrote anything. Returns {"published_at": None, ...} for a missing store.
    """
    from gpufleet.collector.store import MANIFEST

    now = now or utcnow()
    try:
        m = json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"published_at": None, "age_s": None, "version": None, "sample_files": 0, "unrecognized": []}
    try:
        published = datetime.fromisoformat(m["published_at"])
    except (KeyError, TypeError, ValueError):
        published = None
    if published is not None and published.tzinfo is not None:
        published = published.astimezone(timezone.utc).replace(tzinfo=None)
    return {
        "published_at": published,
        "age_s": (now - published).total_seconds() if published else None,
        "version": m.get("version"),
        "sample_files": len(m.get("samples", [])),
        "unrecognized": [_unrecognized_entry(u) for u in m.get("unrecognized", []) if isinstance(u, dict)],
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
