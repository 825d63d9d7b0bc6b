"""Hour facts: each closed hour's figures, so that a window of whole hours gets its figures by
adding its hours up instead of reading its line.

Why: the figures of a window nobody computed ahead (one typed in) cost its whole analysis - at
16,384 GPUs a week ~15 s on two cores with the per-job detail - though what the pages show are
sums over hours. An hour's facts (FACT_SCHEMA, one file per hour, written by the dashboards'
warmer: dashboards/facts.py):

- "gpu": per GPU (its hash, gh; the model the inventory gave it) its data, busy and held-data
  seconds in the hour - what core.Analysis.per_gpu adds to the inventory's capacity;
- "iv": data and busy GPU-hours by cluster and model, "held": the allocations' by cluster, model,
  partition, account and user - the timeline's parts (timeline.compose_timelines);
- "job": the allocations' data and busy seconds by cluster, partition, account and user, and how
  many of them had a piece (a sample) in the hour - utilization by job dimension (`window_use`);
- "alloc": per allocation (a job on a GPU; its hash, ah, and its job's, jh) what the analysis
  looks up over its part in the hour - data, busy, the per-job detail, its idle and no-process
  stretches' GPU-seconds - for the job list, waste and MFU (analytics/fact_window.py).

They are computed by core.Analysis over a run of hours (`build`: its look-ups at the hours'
edges), so a window's sums are its own analysis' figures (to float rounding). Each hour's are
named by what they were computed from (`hour_keys`): the closed summary files of the hour and of
its neighbours (late samples rebuild them under new names), a digest of the allocations that meet
those hours (an allocation learnt of later, a job's end or account changing), max_gap and the
idle threshold and minimum - the neighbours because a stretch is judged by its whole length,
followed into them. A window is answered from facts (`window_use`, fact_window.window_analysis)
only when every hour's facts of the current name exist, the window has no filter but a
cluster's, starts and ends on the hour and its timeline's buckets are whole hours; capacity and
allocated time (inventory and accounting: a few cheap queries) are computed for the window, as
core.Analysis does. Otherwise None: the caller computes the window the long way. A day whose
hours all have current facts is also kept rolled up into one file (`rollup`, ROLLUP_HOURS), read
instead of its hours.
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import duckdb
import numpy as np
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.core import (GPU_DIMS, JOB_DIMS, Analysis, allocated_total, by_gpu_dimension, by_job_dimension, filter_scope,
                                     line_variants, register_prices, window_bind, with_utilization)
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.timeline import TIMELINE_DIMS, bucket_use, compose_timelines, split_at_buckets, timeline_bucket
from gpufleet.times import HOUR, epoch_us, floor_time

# of FACT_SCHEMA and its meaning: part of every fact's name (2: a GPU's row has its cluster;
# 3: "alloc" rows, and a name covers the neighbouring hours and the idle parameters; 4: an
# "alloc" row has its job's hash; 5: one for every part of an allocation, with its seconds held)
FORMAT_VERSION = 5
FACT_SCHEMA = {"hour": pl.Datetime("us"), "kind": pl.Utf8, "gh": pl.UInt64, "ah": pl.UInt64, "jh": pl.UInt64, "cluster": pl.Utf8,
               "model": pl.Utf8,
               "partition": pl.Utf8, "account": pl.Utf8, "user_name": pl.Utf8,
               "data_s": pl.Float64, "busy_s": pl.Float64, "alloc_data_s": pl.Float64,  # "gpu", "job", "alloc": seconds (x MIG share)
               "data_gpu_h": pl.Float64, "busy_gpu_h": pl.Float64,  # "iv", "held": GPU-hours, as the timelines sum them
               "pieces": pl.Int64,  # "job": allocations with a piece in the hour; "alloc": 1 if it had one
               # "alloc": Analysis.allocation_detail's sums (null: no piece had it), its idle and
               # no-process stretches' GPU-seconds, its GPU's variant and how many it had
               "util_n": pl.Int64, "fb_max": pl.Float64, "any_s": pl.Float64, "tensor_s": pl.Float64, "clocked_s": pl.Float64,
               "tclock": pl.Float64, "tw_clocked": pl.Float64, "tnoclock": pl.Float64, "idle_s": pl.Float64, "nop_s": pl.Float64,
               "gpu": pl.Int16, "equiv": pl.Float64, "variants": pl.Int64,
               "held_s": pl.Float64}  # "alloc": the part's seconds (MFU's GPU-hours held: of allocations without a sample too)
DETAIL_SUMS = ("any_s", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock")
ALLOCATION_KEY = ["cluster", "scheduler", "job_key", "host", "gpu_uuid", "gi"]
HELD_KEYS = ["cluster", "model", "partition", "account", "user_name"]
JOB_KEYS = ["cluster", "partition", "account", "user_name"]
# the dimensions a window's facts answer (the Utilization page's): utilization by these, timelines by TIMELINE_DIMS
USE_DIMS = ("fleet", "cluster", "model", "host", "partition", "account", "user_name")


@dataclass(frozen=True)
class UseTotals:
    """The headline figures the Utilization page shows (core.Totals' of the same names)."""

    capacity_gpu_h: float
    data_gpu_h: float
    no_data_gpu_h: float
    busy_gpu_h: float
    utilization_pct: float | None
    allocated_gpu_h: float | None  # None: no job's GPU count is known
    scope: str = "fleet"
    not_attributable_reason: str | None = None
    allocated_unknown_jobs: int = 0  # jobs of unknown GPU count, left out of allocated_gpu_h


@dataclass(frozen=True)
class WindowUse:
    """A window's utilization figures from its hours' facts."""

    totals: UseTotals
    utilization: dict[str, pl.DataFrame]  # by USE_DIMS, as core.Analysis.utilization
    timeline: dict[str, pl.DataFrame]  # by TIMELINE_DIMS, as timeline.utilization_timelines
    hours: int  # hours read from facts


def whole_hours(p: Params) -> list[datetime]:
    """The hours of [p.start, p.end) (both on the hour)."""
    n = (p.end - p.start) // HOUR
    return [p.start + i * HOUR for i in range(n)]


def why_not(p: Params, job_list: bool = False) -> str | None:
    """Why facts cannot answer this window (None: they can, where every hour has current facts):
    they need no filter but the cluster's, whole hours, a timeline of whole-hour buckets, and the
    summaries path ([analytics] summaries: facts are built on it). `job_list`: what the job list
    alone needs (fact_window.window_jobs) - a filter on the jobs too (a job's figures are its
    own, so under one the list is the fleet's list's rows of those jobs), and no timeline."""
    others = replace(p.filters, cluster=None, account=None, user_name=None, partition=None, job_key=None) if job_list else \
        replace(p.filters, cluster=None)
    if others != Filters():
        return ("a GPU-model filter (facts answer the fleet's job list, a cluster's or a team's)" if job_list else
                "a filter other than the cluster's (facts answer the fleet's window or a cluster's)")
    if not p.summaries:
        return "[analytics] summaries = false"
    if p.end <= p.start or floor_time(p.start, HOUR) != p.start or floor_time(p.end, HOUR) != p.end:
        return "the window starts or ends inside an hour"
    if not job_list and timeline_bucket(p) % HOUR != timedelta(0):
        return f"its timeline's buckets are {timeline_bucket(p) // timedelta(minutes=1)} minutes (a window of 12 h or less)"
    return None


def answerable(p: Params, job_list: bool = False) -> bool:
    """Can facts answer this window (why_not)?"""
    return why_not(p, job_list) is None


def neighbours(bind: dict[str, Any]) -> int:
    """How many hours either side an hour's facts depend on: its idle and no-process stretches
    are judged by their whole length, followed through the reach (idle_min_duration + max_gap)
    whose samples are read from max_gap earlier still, so a late sample or an allocation's new
    end there may change them."""
    return max(1, math.ceil((bind["min_idle"] + 2 * bind["max_gap"]) / 3600))


def hour_keys(cur: duckdb.DuckDBPyConnection, bind: dict[str, Any], start: datetime, end: datetime) -> dict[datetime, str | None]:
    """Each hour of [start, end) -> the name of its facts (None: the hour has no closed summary,
    so no facts): what it and its neighbours' hours were computed from, and the parameters."""
    n = neighbours(bind)
    b = {**bind, "start": start - n * HOUR, "end": end + n * HOUR}
    files = dict(cur.execute(sql.FACT_SUMMARY_FILES, sql.bound(sql.FACT_SUMMARY_FILES, b)).fetchall())
    digests = {int(h): (c, d) for h, c, d in cur.execute(sql.FACT_ALLOCATION_DIGESTS, sql.bound(sql.FACT_ALLOCATION_DIGESTS, b)).fetchall()}

    def inputs(hour: datetime) -> list[str]:
        c, d = digests.get(epoch_us(hour) // 3_600_000_000, (0, "0"))
        return [f"{hour:%Y-%m-%dT%H}", *files.get(hour, ["no summary"]), str(c), d]

    params = [str(FORMAT_VERSION), repr(bind["max_gap"]), repr(bind["thr"]), repr(bind["min_idle"])]
    out: dict[datetime, str | None] = {}
    for hour in whole_hours(Params(start, end)):
        if hour not in files:
            out[hour] = None
            continue
        blob = "\n".join(params + [x for k in range(-n, n + 1) for x in inputs(hour + k * HOUR)])
        out[hour] = hashlib.blake2b(blob.encode(), digest_size=10).hexdigest()
    return out


def current_keys(con: duckdb.DuckDBPyConnection, p: Params, now: datetime) -> dict[datetime, str | None]:
    """hour_keys of [p.start, p.end) as the store stands."""
    cur = con.cursor()
    try:
        return hour_keys(cur, window_bind(replace(p, filters=Filters()), now), p.start, p.end)
    finally:
        cur.close()


# Hours whose facts are also kept rolled up into one file (a day: spans aligned on its multiples
# from the epoch, midnight UTC), once each of them has current facts: a week's window then reads
# 7 files of a third of the rows (an allocation's hours of a day one row, a GPU's one row) instead
# of 168 (at 16,384 GPUs the job list's read 0.48 -> 0.16 s, the whole analysis' 0.70 -> 0.29 s).
# The timeline's rows keep their hours.
ROLLUP_HOURS = 24


def rollup_spans(p: Params) -> list[datetime]:
    """The first hours of the roll-up spans wholly inside [p.start, p.end)."""
    span = ROLLUP_HOURS * HOUR
    first = floor_time(p.start + span - timedelta(microseconds=1), span)
    return [first + i * span for i in range(max(0, (p.end - first) // span))]


def span_hours(start: datetime) -> list[datetime]:
    """The hours of the roll-up span starting at `start`."""
    return [start + i * HOUR for i in range(ROLLUP_HOURS)]


def rollup_name(names: list[str | None]) -> str | None:
    """The name of a span's roll-up, from its hours' names (hour_keys); None if an hour has none."""
    if any(n is None for n in names):
        return None
    return hashlib.blake2b("\n".join(["span", *names]).encode(), digest_size=10).hexdigest()  # type: ignore[list-item]


def rollup(con: duckdb.DuckDBPyConnection, files: list[str]) -> pl.DataFrame:
    """A span's hours' facts (their files) as one file's rows, FACT_SCHEMA (sql.FACT_ROLLUP)."""
    cur = con.cursor()
    try:
        df = pl.from_arrow(cur.sql(sql.FACT_ROLLUP, params={"files": files}).to_arrow_table())
    finally:
        cur.close()
    return df.select([pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in FACT_SCHEMA.items()])


BUILD_GPU_HOURS = 32_768 * 24  # GPU-hours one build analyses at most: a day of 32,768 GPUs (16,384: ~1.4 GiB with the detail)


def build_hours(con: duckdb.DuckDBPyConnection) -> int:
    """How many hours one `build` should take at most (1-24): a day up to 32,768 GPUs, fewer for
    a larger fleet, so a build's memory does not grow with it (a day of 100,000 GPUs in one
    analysis: 5.4 GiB and 33 s; 7 hours at a time: 3.0 GiB and 45 s)."""
    cur = con.cursor()
    try:
        gpus = cur.execute(sql.INVENTORY_GPUS).fetchone()[0]
    finally:
        cur.close()
    return max(1, min(24, BUILD_GPU_HOURS // max(int(gpus), 1)))


def build(con: duckdb.DuckDBPyConnection, p: Params, now: datetime) -> dict[datetime, tuple[str, pl.DataFrame]]:
    """The facts of each hour of [p.start, p.end) (whole hours) that has a closed summary: hour ->
    (its name, its rows), from one analysis of those hours (no filter)."""
    a = Analysis(con, replace(p, filters=Filters()), now=now, detail=True, raw=True)  # (its arrays: hour_facts reads a.gt)
    try:
        keys = hour_keys(a.con, a.bind, p.start, p.end)
        hours = [h for h, k in keys.items() if k is not None]
        if not hours:
            return {}
        frames = _facts(a, hours)
        return {h: (keys[h], frames.get(h, pl.DataFrame(schema=FACT_SCHEMA))) for h in hours}
    finally:
        a.con.close()


def _facts(a: Analysis, hours: list[datetime]) -> dict[datetime, pl.DataFrame]:
    key = ["cluster", "host", "gpu_uuid", "gi"]
    ids = a.gt.ids
    gh = a.q(sql.LINE_ID_HASHES, tables={"_line_ids": ids})
    # the model each GPU id is grouped under (per_gpu's, the inventory's; null: not in it) and its hash
    models = a.per_gpu().select(*key, "model").join(ids, on=key)
    gpus = ids.join(gh, on="gid").join(models.select("gid", "model"), on="gid", how="left").select("gid", "gh", "cluster", "model")
    out: list[pl.DataFrame] = []
    for hour in hours:
        h0 = epoch_us(hour)
        h1 = h0 + 3_600_000_000
        use = a.gt.per_gpu(h0, h1).select("gid", "data_s", "busy_s").join(a.held_data(h0, h1), on="gid", how="left").join(gpus, on="gid")
        gpu = use.filter((pl.col("data_s") != 0) | (pl.col("busy_s") != 0) | (pl.col("alloc_data_s").fill_null(0) != 0))
        out.append(gpu.select(pl.lit(hour).alias("hour"), pl.lit("gpu").alias("kind"), "gh", "cluster", "model", "data_s", "busy_s",
                              "alloc_data_s"))
        iv = use.join(models.select("gid"), on="gid").group_by("cluster", "model").agg(
            (pl.sum("data_s") / 3600).alias("data_gpu_h"), (pl.sum("busy_s") / 3600).alias("busy_gpu_h"))
        out.append(iv.select(pl.lit(hour).alias("hour"), pl.lit("iv").alias("kind"), "cluster", "model", "data_gpu_h", "busy_gpu_h"))
    # the allocations' time per hour: as the timeline's "held" parts (allocations of GPUs in the
    # inventory with samples), and as utilization by job dimension counts it (every allocation)
    held = pl.from_arrow(a.con.sql(sql.TIMELINE_HELD).to_arrow_table()).join(models, on=key)
    start = a.p.start  # (the hour k of the analysis' hours is start + k hours)
    parts = bucket_use(a, held, HELD_KEYS, 3600.0)
    out.append(parts.group_by(*HELD_KEYS, "k").agg(pl.sum("data_gpu_h"), pl.sum("busy_gpu_h")).select(
        (pl.lit(start) + pl.duration(hours=pl.col("k"))).alias("hour"), pl.lit("held").alias("kind"), *HELD_KEYS, "data_gpu_h", "busy_gpu_h"))
    out += _allocation_facts(a, start)
    df = pl.concat([f.cast({c: t for c, t in FACT_SCHEMA.items() if c in f.columns}) for f in out], how="diagonal")
    df = df.select([pl.col(c) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in FACT_SCHEMA.items()])
    wanted = set(hours)
    return {h: f for (h,), f in df.partition_by("hour", as_dict=True).items() if h in wanted}


def _allocation_facts(a: Analysis, start: datetime) -> list[pl.DataFrame]:
    """The "job" and "alloc" facts, from every allocation's parts in the hours of the analysis
    (cut at the hours' edges once): "job", each part's data and busy seconds and whether it has a
    piece there (core.Analysis._allocation_use, hour by hour) summed by job group; "alloc", per
    part, its seconds and those figures, the detail sums (Analysis.allocation_detail, over the
    part), its idle and no-process stretches' GPU-seconds in the hour (the stretches judged by
    their whole length) and - for a part with a piece or a stretch - its GPU's variant
    (core.line_variants)."""
    group = [k for k in JOB_KEYS if k not in ALLOCATION_KEY]  # (the job group's keys besides the cluster)
    spans = a.allocation_use().select(*ALLOCATION_KEY, *group, pl.col("gid").fill_null(-1), "a0", "a1")
    df = split_at_buckets(a, spans, 3600.0).join(line_variants(a.gt), on="gid", how="left")
    gid, a0, a1 = df["gid"].to_numpy(), df["_a"].to_numpy(), df["_b"].to_numpy()
    data, busy = a.gt.integrals(gid, a0, a1)
    has = a.gt.overlaps(gid, a0, a1) & (gid >= 0)
    jobs = df.select(*JOB_KEYS, "k", data_s=pl.Series(data), busy_s=pl.Series(busy), pieces=pl.Series(has.astype(np.int64)))
    jobs = jobs.group_by(*JOB_KEYS, "k").agg(pl.sum("data_s"), pl.sum("busy_s"), pl.sum("pieces")).select(
        (pl.lit(start) + pl.duration(hours=pl.col("k"))).alias("hour"), pl.lit("job").alias("kind"), *JOB_KEYS, "data_s", "busy_s", "pieces")
    d = a.gt.allocation_detail(gid, a0, a1, df["equiv"].fill_null(1.0).to_numpy(), epoch_us(a.p.start), epoch_us(a.p.end))
    parts = df.select(*ALLOCATION_KEY, "k", "gpu", "model", "equiv", "variants", held_s=(pl.col("_b") - pl.col("_a")) / 1e6).with_columns(
        data_s=pl.Series(data), busy_s=pl.Series(busy), pieces=pl.Series(d["has_piece"].astype(np.int64)),
        util_n=pl.Series(d["has_util"].astype(np.int64)), fb_max=pl.Series(d["fb_max"]).fill_nan(None),
        **{c: pl.Series(d[c]).fill_nan(None) for c in DETAIL_SUMS})
    for kind, col in (("idle", "idle_s"), ("no_process", "nop_s")):
        st = split_at_buckets(a, a.idle_stretches(kind).select(*ALLOCATION_KEY, "equiv", a0="s0", a1="s1"), 3600.0)
        st = st.group_by(*ALLOCATION_KEY, "k").agg(((pl.col("_b") / 1e6 - pl.col("_a") / 1e6) * pl.col("equiv")).sum().alias(col))
        parts = parts.join(st, on=[*ALLOCATION_KEY, "k"], how="left", nulls_equal=True)  # (a stretch lies in an allocation's part)
    seen = (pl.col("pieces") > 0) | (pl.col("idle_s") > 0) | (pl.col("nop_s") > 0)  # (a part without either: no variant seen)
    parts = parts.with_columns(*[pl.when(seen).then(pl.col(c)).alias(c) for c in ("gpu", "model", "equiv", "variants")])
    ah = a.q(sql.ALLOCATION_KEY_HASHES)
    allocations = parts.join(ah, on=ALLOCATION_KEY, how="inner", nulls_equal=True).select(
        (pl.lit(start) + pl.duration(hours=pl.col("k"))).alias("hour"), pl.lit("alloc").alias("kind"), "ah", "jh", "gh", "cluster", "model",
        "data_s", "busy_s", "pieces", "util_n", "fb_max", *DETAIL_SUMS, "idle_s", "nop_s", "gpu", "equiv", "variants", "held_s")
    return [jobs, allocations]


class FactFiles(Protocol):
    """Where a window's facts are: each hour's current file and the name it was written under,
    and each roll-up span's (ROLLUP_HOURS)."""

    def present(self, hour: datetime) -> tuple[str, str] | None:
        """(name, path) of the hour's facts; None: none."""

    def present_span(self, start: datetime) -> tuple[str, str] | None:
        """(name, path) of the roll-up of the span starting at `start`; None: none."""


def window_use(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles, names: dict | None = None) -> WindowUse | None:
    """The window's utilization figures from its hours' facts, or None when facts cannot answer
    it (see the module's docstring): the caller then computes it with core.Analysis. `names`:
    read_window's."""
    read = read_with_gpus(con, p, now, facts, (sql.FACT_BUCKETS, sql.FACT_JOB_USE), names=names)
    if read is None:
        return None
    cur, b, g, (parts, jobs) = read
    try:
        utilization = {}
        for by in USE_DIMS:
            if by in GPU_DIMS:
                keys = list(GPU_DIMS[by])
                utilization[by] = g if g.is_empty() else with_utilization(by_gpu_dimension(g, keys), keys)
            else:
                keys = list(JOB_DIMS[by])
                used = jobs.group_by(keys).agg(pl.sum("data_s"), pl.sum("busy_s"), pl.sum("pieces")).filter(pl.col("pieces") > 0).select(
                    *keys, (pl.col("data_s") / 3600).alias("data_gpu_h"), (pl.col("busy_s") / 3600).alias("busy_gpu_h"))
                utilization[by] = with_utilization(by_job_dimension(query_frame(cur, sql.job_allocated_by(keys), b), used, keys), keys)
        data = float(g["data_gpu_h"].sum()) if not g.is_empty() else 0.0
        busy = float(g["busy_gpu_h"].sum()) if not g.is_empty() else 0.0
        totals = UseTotals(capacity_gpu_h=float(g["capacity_gpu_h"].sum()) if not g.is_empty() else 0.0, data_gpu_h=data,
                           no_data_gpu_h=float(g["no_data_gpu_h"].sum()) if not g.is_empty() else 0.0, busy_gpu_h=busy,
                           utilization_pct=busy / data * 100 if data > 0 else None, scope=filter_scope(p.filters),
                           **allocated_total(query_frame(cur, sql.ALLOCATED_GPU_H_TOTAL, b)))
        return WindowUse(totals=totals, utilization=utilization, timeline=timelines(cur, p, b, parts), hours=len(whole_hours(p)))
    finally:
        cur.close()


def facts_present(p: Params, facts: FactFiles) -> bool:
    """Whether every hour of the window has a facts file, or its day's roll-up (their names are
    checked against the store when they are read: read_window)."""
    return _window_files(p, facts, spans=True) is not None


def _window_files(p: Params, facts: FactFiles, spans: bool) -> tuple[dict, dict] | None:
    """The window's facts files: the roll-ups of its whole days (`spans`) and its other hours'
    files, each (name, path) by its start; None if an hour has none."""
    rolled = {s: facts.present_span(s) for s in rollup_spans(p)} if spans else {}
    rolled = {s: f for s, f in rolled.items() if f is not None}
    covered = {h for s in rolled for h in span_hours(s)}
    present = {h: facts.present(h) for h in whole_hours(p) if h not in covered}
    return None if any(f is None for f in present.values()) else (rolled, present)


def read_window(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles, queries: tuple[str, ...],
                setup: tuple[str, ...] = (), spans: bool = True, names: dict | None = None, job_list: bool = False
                ) -> tuple[duckdb.DuckDBPyConnection, dict[str, Any], list[Any]] | None:
    """The window's facts as `queries` (of sql.FACT_*; FACT_GPUS gives an Arrow table, the others
    frames) read them, with a cursor holding the window's capacity (cap), job table (ja), prices
    and what the `setup` statements made (of sql.py, bound to the window), and the queries' bound
    parameters; None (nothing left open) when facts cannot answer the window: not answerable, an
    hour without facts, or facts of inputs that changed since. The caller closes the cursor.

    The roll-ups of the spans inside the window are read instead of their hours' files (`spans`);
    a roll-up older than its hours' facts, the hours instead. The facts are read while their
    names are checked against the store (and the job table is built): three queries at once, on
    cursors of their own. `names`: where the hours' names computed on this store as it stands
    are kept, by window and parameters - read, and filled (the pages of one window ask them
    of the same store: 0.35 s each at 16,384 GPUs). `job_list`: for the job list alone (why_not)."""
    found = _window_files(p, facts, spans) if answerable(p, job_list) else None
    if found is None:
        return None
    rolled, present = found
    files = [path for _, path in [*present.values(), *rolled.values()]]  # type: ignore[misc]
    bind = window_bind(p, now)
    b = {**bind, "files": files, "bucket": timeline_bucket(p).total_seconds()}
    named = (p.start, p.end, bind["max_gap"], bind["thr"], bind["min_idle"])
    known = names.get(named) if names is not None else None
    cur, side, rd = con.cursor(), con.cursor(), con.cursor()
    try:
        register_prices(cur, p)
        cur.execute(sql.CAPACITY, sql.bound(sql.CAPACITY, bind))
        with ThreadPoolExecutor(max_workers=2) as pool:  # (DuckDB lets go of the GIL)
            jobs = pool.submit(lambda: [cur.execute(q, sql.bound(q, bind)) for q in (sql.JOB_TABLE, *setup)])
            keys = pool.submit(hour_keys, side, bind, p.start, p.end) if known is None else None
            try:
                read = [rd.sql(q, params=sql.bound(q, b)).to_arrow_table() if q == sql.FACT_GPUS else query_frame(rd, q, b) for q in queries]
            except duckdb.IOException:
                read = None  # a file replaced or removed since it was listed (its inputs changed, or it aged out)
            finally:
                jobs.result()
                current = known if keys is None else keys.result()
        if names is not None:
            names[named] = current
        hours_current = all(current.get(h) == f[0] for h, f in present.items())  # type: ignore[index]
        spans_current = all(rollup_name([current.get(h) for h in span_hours(s)]) == f[0] for s, f in rolled.items())
        if read is None or not hours_current or not spans_current:
            cur.close()
            if read is not None and hours_current and rolled:  # a roll-up behind its hours' facts: read those
                return read_window(con, p, now, facts, queries, setup, spans=False, names=names, job_list=job_list)
            return None  # an hour's facts are of inputs that changed since: not read
        return cur, b, read
    except BaseException:
        cur.close()
        raise
    finally:
        side.close()
        rd.close()


def read_with_gpus(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles, queries: tuple[str, ...],
                   setup: tuple[str, ...] = (), names: dict | None = None
                   ) -> tuple[duckdb.DuckDBPyConnection, dict[str, Any], pl.DataFrame, list[Any]] | None:
    """read_window with the GPUs' facts read first and turned into their figures (gpu_figures):
    the cursor, the bound parameters, the per-GPU rows and `queries`' frames; None (nothing left
    open) where facts cannot answer the window or give its GPUs' figures."""
    read = read_window(con, p, now, facts, (sql.FACT_GPUS, *queries), setup=setup, names=names)
    if read is None:
        return None
    cur, b, (gpus, *rest) = read
    try:
        g = gpu_figures(cur, b, gpus)
    except BaseException:
        cur.close()
        raise
    if g is None:
        cur.close()
        return None
    return cur, b, g, rest


def query_frame(cur: duckdb.DuckDBPyConnection, query: str, bind: dict[str, Any]) -> pl.DataFrame:
    return pl.from_arrow(cur.sql(query, params=sql.bound(query, bind)).to_arrow_table())


def gpu_figures(cur: duckdb.DuckDBPyConnection, b: dict[str, Any], gpus: Any) -> pl.DataFrame | None:
    """Analysis.per_gpu's rows from the GPUs' facts (FACT_GPUS) and the window's capacity (cap) on
    `cur`; None if a GPU's facts are not under the model the inventory gives it now (or under
    two)."""
    cur.register("_fact_gpus", gpus)
    try:
        use = query_frame(cur, sql.FACT_GPU_USE, b)
    finally:
        cur.unregister("_fact_gpus")
    if use.filter(pl.col("cluster").is_null() | pl.col("unsure") | pl.col("model").ne_missing(pl.col("fact_model"))).height:
        return None
    cur.register("gpu_use", use.select("cluster", "host", "gpu_uuid", "gi", "data_s", "busy_s", "alloc_data_s").to_arrow())
    try:
        return query_frame(cur, sql.PER_GPU, b)
    finally:
        cur.unregister("gpu_use")


def timelines(cur: duckdb.DuckDBPyConnection, p: Params, b: dict[str, Any], parts: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """timeline.utilization_timelines' frames from the facts' parts (FACT_BUCKETS), the window's
    capacity and job table on `cur`."""
    base = {"iv": parts.filter(pl.col("kind") == "iv").select("cluster", "model", "k", "data_gpu_h", "busy_gpu_h"),
            "pc": parts.filter(pl.col("kind") == "held").select(*HELD_KEYS, "k", "data_gpu_h", "busy_gpu_h"),
            "cap": query_frame(cur, sql.TIMELINE_CAPACITY, b), "alloc": query_frame(cur, sql.TIMELINE_ALLOCATED, b)}
    bsec = b["bucket"]
    return compose_timelines(base, TIMELINE_DIMS, False, int(-(-p.seconds // bsec)), bsec, p.start)
