"""Utilization over time: the figures of gpufleet.analytics.core, per time bucket.

`utilization_timeline(analysis, by, bucket)` gives, per bucket of [start, end) and group, the
quantities of Analysis.utilization(), so a column's buckets add up to the window's figure exactly:

  capacity_gpu_h   GPU dimensions only: inventory capacity; null under a job filter (GPU dimensions
                   then show the selected jobs' data and busy time)
  data_gpu_h       time with samples; busy_gpu_h: utilization-weighted data time
  no_data_gpu_h    capacity (GPU dimensions) or allocated time (job dimensions) without samples
  allocated_gpu_h  scheduler accounting (GPUs x run time); null for model, and where every job of
                   the bucket has an unknown GPU count
  held_data_gpu_h  time jobs held GPUs with samples (exporters' job mapping)
  utilization_pct  busy / data, null without data

Intervals are split at bucket edges: a sample interval (at most max_gap <= bucket) at one, capacity and job runs at each.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.facts import JOB_GPU_PARTS, TIMELINE_COLUMNS, FactWindow
from gpufleet.collector.reading import query_rows
from gpufleet.times import default_bucket, epoch_us, from_epoch_us

TIMELINE_DIMS = ("fleet", "cluster", "model", "partition", "account", "user_name")
_GPU_KEYS = {"fleet": (), "cluster": ("cluster",), "model": ("model",)}
_JOB_KEYS = {"partition": ("cluster", "partition"), "account": ("cluster", "account"), "user_name": ("cluster", "user_name")}


def clock_origin(start: datetime, bucket: timedelta) -> datetime:
    """The first bucket edge of a timeline: `start` floored to the bucket on the UTC clock where the bucket
    divides a day (as Grafana aligns steps), so the edges fall on the facts' buckets; else `start`."""
    b_us = round(bucket.total_seconds() * 1_000_000)
    if b_us <= 0 or 86_400_000_000 % b_us:
        return start
    t = epoch_us(start)
    return from_epoch_us(t - t % b_us)


def timeline_bucket(p) -> timedelta:
    """The bucket of a window's timeline when none is asked for (at least max_gap); core.on_the_grid cuts at it."""
    return max(default_bucket(p.end - p.start), p.max_gap)


def utilization_timeline(a, by: str = "fleet", bucket: timedelta | None = None, origin: datetime | None = None) -> pl.DataFrame:
    """Per bucket (its start time) and group of `by`; see the module docstring."""
    return utilization_timelines(a, (by,), bucket, origin)[by]


def utilization_timelines(a, dims=TIMELINE_DIMS, bucket: timedelta | None = None,
                          origin: datetime | None = None) -> dict[str, pl.DataFrame]:
    """utilization_timeline() for several dimensions, bucketed once at the finest grouping (sums of sums).
    `origin` (naive UTC, at or before the start; default clock_origin): edges are origin + k x bucket
    (the report's: local midnights); the first bucket is labelled by its edge and holds the window's part."""
    for by in dims:
        if by not in TIMELINE_DIMS:
            raise ValueError(f"unknown dimension {by!r} for a timeline: expected one of {', '.join(TIMELINE_DIMS)}")
    p = a.p
    bucket = bucket or timeline_bucket(p)
    if bucket < p.max_gap:
        bucket = p.max_gap
    origin = clock_origin(p.start, bucket) if origin is None else origin
    if origin > p.start:
        raise ValueError(f"a timeline's origin {origin.isoformat()} is after its window's start {p.start.isoformat()}: expected it at or before")
    bsec = bucket.total_seconds()
    n_buckets = int(-(-(p.end - origin).total_seconds() // bsec))
    origin_us = epoch_us(origin)
    extra = {"bucket": bsec, "origin": origin}

    def q(query: str) -> pl.DataFrame:
        names = sql.bound(query, {**a.bind, **extra})
        return pl.from_arrow(query_rows(a.con, query, names))

    job_filtered = a.job_filtered  # capacity is no job's
    gpu_dims = any(d in _GPU_KEYS for d in dims) and not job_filtered
    base = a.timeline_use(gpu_dims, bsec, origin_us)
    if gpu_dims:
        base["cap"] = q(sql.TIMELINE_CAPACITY)
    if any(d != "model" for d in dims):
        base["alloc"] = q(sql.TIMELINE_ALLOCATED)  # a job's GPUs x MIG share for each second it runs
    return compose_timelines(base, dims, job_filtered, n_buckets, bsec, origin)


def bucketed_parts(a, queries: dict[str, str], bsec: float, origin_us: int, **extra) -> dict[str, pl.DataFrame]:
    """Each of `queries` (per-bucket sums over the parts, with `fits`: no part crosses an edge) for buckets
    of `bsec` seconds from origin_us. Buckets that cut the analysis' parts read the window's parts again,
    cut at their edges: those inside the window alone (the sums read no reach), facts.TIMELINE_COLUMNS only."""
    b_us = round(bsec * 1_000_000)
    extra = {**extra, "bucket_us": b_us, "origin_us": origin_us}
    # parts coarser than the buckets nearly always cross their edges: read them cut at once
    if max(a.fw.tiles, default=0) * 1_000_000 <= b_us:
        out = {name: pl.from_arrow(query_rows(a.con, q, sql.bound(q, {**a.bind, **extra}))) for name, q in queries.items()}
        if all(o.is_empty() or o["fits"].all() for o in out.values()):
            return {name: o.drop("fits") for name, o in out.items()}
    fw = FactWindow(a.con, a.p, now=a.bind["as_of"], grid_us=b_us, grid_origin_us=origin_us, gpus=a.fw.gpus, inside_only=True,
                    columns=TIMELINE_COLUMNS, in_place=True)
    try:
        out = {name: fw.q(q, **extra) for name, q in queries.items()}
    finally:
        fw.close()
    if not all(o["fits"].all() for o in out.values()):
        raise RuntimeError(f"the window's parts cut at {bsec:g} s buckets still cross a bucket edge; expected none to")
    return {name: o.drop("fits") for name, o in out.items()}


def known_sum(col: str) -> pl.Expr:
    """The sum of `col`, null where every value is: a sum of nothing known stays unknown, never 0."""
    return pl.when(pl.col(col).is_null().all()).then(None).otherwise(pl.col(col).sum()).alias(col)


def compose_timelines(base: dict[str, pl.DataFrame], dims, job_filtered: bool, n_buckets: int, bsec: float, origin) -> dict[str, pl.DataFrame]:
    """The timelines of `dims` from per-bucket (k) GPU-hours, rows summed per key: "iv" data and busy,
    "cap" capacity (GPU dimensions), "pc" allocations' data and busy, "alloc" allocated time.
    One lazy query per dimension, collected at once (small frames: polars' overhead is per operation)."""
    def total(name: str, keys: list[str], cols: list[str], rename: dict[str, str] | None = None) -> pl.LazyFrame:
        df = base[name].lazy().with_columns(pl.col("k").cast(pl.Int64))
        out = df.group_by([*keys, "k"]).agg([known_sum(c) for c in cols])
        return out.rename(rename) if rename else out

    plans: dict[str, pl.LazyFrame] = {}
    for by in dims:
        gpu_dim = by in _GPU_KEYS
        keys = list(_GPU_KEYS[by] if gpu_dim else _JOB_KEYS[by])
        if gpu_dim and job_filtered:
            used = total("pc", keys, ["data_gpu_h", "busy_gpu_h"])
            frames = [used, used.select(*keys, "k", pl.col("data_gpu_h").alias("held_data_gpu_h"))]
        elif gpu_dim:
            frames = [total("iv", keys, ["data_gpu_h", "busy_gpu_h"]), total("cap", keys, ["capacity_gpu_h"]),
                      total("pc", keys, ["data_gpu_h"], {"data_gpu_h": "held_data_gpu_h"})]
        else:
            used = total("pc", keys, ["data_gpu_h", "busy_gpu_h"])
            frames = [used, used.select(*keys, "k", pl.col("data_gpu_h").alias("held_data_gpu_h"))]
        if by != "model":
            frames.append(total("alloc", keys, ["allocated_gpu_h"]).with_columns(pl.lit(True).alias("_allocated")))
        plans[by] = _assemble(frames, keys, gpu_dim and not job_filtered, n_buckets, bsec, origin)
    return dict(zip(plans, pl.collect_all(list(plans.values()))))


def _assemble(frames: list[pl.LazyFrame], keys: list[str], gpu_dim: bool, n_buckets: int, bsec: float, origin) -> pl.LazyFrame:
    # every bucket of every group present, so gaps read as zero (or no data), not as missing points
    groups = pl.concat([f.select(keys) for f in frames], how="vertical").unique() if keys else pl.LazyFrame({"_": [0]})
    grid = groups.join(pl.LazyFrame({"k": pl.int_range(0, n_buckets, eager=True).cast(pl.Int64)}), how="cross")
    if not keys:
        grid = grid.drop("_")
    out = grid
    names: set[str] = set()
    for f in frames:
        out = out.join(f, on=[*keys, "k"], how="left", nulls_equal=True)
        names.update(f.collect_schema().names())
    for col in ("capacity_gpu_h", "data_gpu_h", "busy_gpu_h", "allocated_gpu_h", "held_data_gpu_h"):
        if col == "allocated_gpu_h" and col in names:  # 0 where no job ran; null where only jobs of unknown GPU count did
            out = out.with_columns(pl.when(pl.col("_allocated").is_null()).then(0.0).otherwise(pl.col(col)).alias(col)).drop("_allocated")
        elif col in names:
            out = out.with_columns(pl.col(col).fill_null(0.0))
        else:
            out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    basis = "capacity_gpu_h" if gpu_dim else "allocated_gpu_h"
    out = out.with_columns(
        (pl.col(basis) - pl.col("data_gpu_h")).clip(lower_bound=0).alias("no_data_gpu_h"),
        pl.when(pl.col("data_gpu_h") > 0).then(pl.col("busy_gpu_h") / pl.col("data_gpu_h") * 100).otherwise(None).alias("utilization_pct"),
        (pl.lit(origin) + pl.duration(seconds=pl.col("k") * bsec)).alias("bucket"),
    )
    cols = ["bucket", *keys, "capacity_gpu_h", "allocated_gpu_h", "held_data_gpu_h", "data_gpu_h", "busy_gpu_h", "no_data_gpu_h", "utilization_pct"]
    return out.select(cols).sort([*keys, "bucket"], nulls_last=True)


JOB_TIMELINE_SCHEMA = {"bucket": pl.Datetime("us"), "host": pl.Utf8, "gpu": pl.Int16, "gpu_uuid": pl.Utf8, "gi": pl.Int16,
                       "utilization_pct": pl.Float64, "fb_used_max_mib": pl.Float64, "data_h": pl.Float64}


def job_gpu_timeline(a, cluster: str, scheduler: str, job_key: str, bucket: timedelta | None = None) -> pl.DataFrame:
    """One job's GPUs over time (JOB_TIMELINE_SCHEMA), per GPU and bucket on the clock: utilization
    sum(util x w) / sum(w) and data_h sum(w) / 3600 (w = seconds x MIG share; null: no data), and the
    memory high-water mark. As tests/support oracle_sql.PIECES adds up."""
    p = a.p
    bucket = max(bucket or default_bucket(p.end - p.start), p.max_gap)
    bsec = bucket.total_seconds()
    origin = clock_origin(p.start, bucket)
    return a.job_gpu_use(cluster, scheduler, job_key, bsec, origin)


def job_gpu_parts(a, cluster: str, scheduler: str, job_key: str, bsec: float, origin: datetime) -> pl.DataFrame:
    """job_gpu_timeline from the window's parts: the job's, summed per GPU and bucket."""
    out = bucketed_parts(a, {"job": JOB_GPU_PARTS}, bsec, epoch_us(origin), of_cluster=cluster, of_scheduler=scheduler,
                         of_job_key=job_key)["job"]
    if out.is_empty():
        return pl.DataFrame(schema=JOB_TIMELINE_SCHEMA)
    known = pl.col("data_s") > 0
    return out.select(
        (pl.lit(origin) + pl.duration(seconds=pl.col("k") * bsec)).alias("bucket"), "host", "gpu", "gpu_uuid", "gi",
        pl.when(known).then(pl.col("busy_s") / pl.col("data_s") * 100).alias("utilization_pct"),
        pl.col("fb_max").fill_nan(None).alias("fb_used_max_mib"),
        pl.when(known).then(pl.col("data_s") / 3600).alias("data_h"),
    ).cast(JOB_TIMELINE_SCHEMA).sort("host", "gpu", "gi", "bucket", "gpu_uuid")
