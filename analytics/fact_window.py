"""A window's whole analysis answered from its hours' facts: the job list, waste and MFU too.

Why: the Jobs, Waste and MFU pages of a window nobody computed ahead (one typed in) need what
the Utilization page's sums (hour_facts.window_use) leave out - each job's figures, its idle and
no-process stretches, its memory high-water and tensor activity - and computing them costs the
window's analysis (~15 s for a 16,384-GPU week on two cores). Each hour's facts also hold, per
allocation (a job on a GPU: its hash, sql.ALLOCATION_KEY_ROWS), what the analysis looks up over
its part in the hour (hour_facts._allocation_facts); those are sums (or a maximum, or "any") over
the hour's parts, so an allocation's window figures are its hours' added up. Its idle stretches
are judged by their whole length when the hour's facts are built (through the reach either side;
a fact's name covers the neighbouring hours it read), and its stretches' GPU-seconds in each
hour add up to those in the window.

`window_analysis` gives a FactWindow: a core.Analysis whose per-GPU figures, allocations' look-ups
and detail, and idle time come from the facts - so totals, utilization, waste, the top jobs, the
job list (analytics/jobs.py), MFU (analytics/mfu.py) and fairness are computed by the same code
over them - and the window's timelines. An idle-stretch row then stands for all of an
allocation's stretches in the window (their GPU-hours; no start or end): the job report, which
lists stretches, is computed on the job's own narrow window as before.

`window_jobs` gives the job list alone, from what it reads of the facts only (each allocation's
sums, named by its job's hash, grouped by job; the window's job table): what the Jobs page waits
for, in a third of the whole analysis' time. So do `window_waste` the Waste page's figures (the
allocations with stretches only: a fifth of it) and `mfu_window` what MFU reads (each job's held
GPUs and tensor use, summed from its allocations' facts - their seconds held too, of hours
without a sample - by the job's hash: no allocations table, no join on a job's key) - no page of
a window its facts answer needs the whole analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.core import Analysis, Totals, fleet_totals, top_wasteful_jobs, waste_by
from gpufleet.analytics.hour_facts import FactFiles, query_frame, read_window, read_with_gpus, timelines
from gpufleet.analytics.jobs import gpu_use, job_list
from gpufleet.analytics.mfu import peaks_for, tensor_use
from gpufleet.analytics.params import Params
from gpufleet.analytics.prices import price_table, usd_per_gpu_hour

# what an idle-stretch row names (analytics/stretches.py SCHEMA, without the stretch's own times)
_STRETCH = ("cluster", "scheduler", "job_key", "host", "gpu_uuid", "gi", "job_id", "user_name", "account", "partition", "model", "gpu",
            "equiv")


class FactWindow(Analysis):
    """core.Analysis of a window from its hours' facts (see the module's docstring). Its cursor
    holds the window's capacity, allocations (al, alv) and job table (ja), as Analysis' does;
    close it (`con.close()`) when done."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, p: Params, bind: dict, per_gpu: pl.DataFrame, allocations: pl.DataFrame):
        self.con = cur
        self.p = p
        self.bind = bind
        self.prices = price_table(p.prices)  # (registered on the cursor by hour_facts.read_window)
        self._held_only = False
        self.gt = None  # no line: detail_time() cannot be asked
        self._alv = allocations
        self._alv_order = None
        self.con.register("alv", allocations.to_arrow())
        self._memo = {("per_gpu",): per_gpu}

    def held_data(self, s: int, e: int) -> pl.DataFrame:
        raise NotImplementedError("a window from hour facts has per-GPU figures, not its line")

    def detail_time(self):
        raise NotImplementedError("a window from hour facts has no samples: the job report computes its own window")

    def allocation_detail(self) -> pl.DataFrame:
        """alv with its allocations' detail summed from the facts (Analysis.allocation_detail's
        columns; no gid: the window has no line)."""
        return self._alv.clone()

    def _islands(self, kind: str) -> pl.DataFrame:
        return _stretch_rows(self._alv, kind, self.prices)


def _stretch_rows(allocations: pl.DataFrame, kind: str, prices: dict[str, float]) -> pl.DataFrame:
    """One row per allocation with idle (or no-process) stretches in the window: their GPU-hours
    and cost (in_window_s: their seconds x MIG share) - Analysis.idle_stretches' columns."""
    col = "idle_s" if kind == "idle" else "nop_s"
    s = allocations.filter(pl.col(col) > 0)
    return s.select(*_STRETCH, pl.col(col).alias("in_window_s"), (pl.col(col) / 3600).alias("gpu_h")).with_columns(
        usd_per_gpu_hour=usd_per_gpu_hour(prices)).with_columns(cost=pl.col("gpu_h") * pl.col("usd_per_gpu_hour"))


def window_analysis(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles,
                    mfu: bool = True, names: dict | None = None) -> tuple[FactWindow, dict[str, pl.DataFrame]] | None:
    """The window's FactWindow and timelines (timeline.utilization_timelines' frames), or None
    when facts cannot answer it (hour_facts.read_window; or a held GPU whose variant - index,
    model, MIG share - is not one over the window's facts; or two allocations of one hash): the
    caller then computes it with core.Analysis. `mfu` False: without what only MFU reads (its
    detail sums: a third fewer sums over the allocations' facts), so mfu.job_mfu cannot be asked.
    `names`: hour_facts.read_window's."""
    allocations = sql.FACT_ALLOCATION_DETAIL if mfu else sql.FACT_ALLOCATIONS
    read = read_with_gpus(con, p, now, facts, (sql.FACT_BUCKETS, allocations, sql.FACT_VARIANTS), setup=(sql.ALLOCATIONS,), names=names)
    if read is None:
        return None
    cur, b, g, (parts, facts_of, variants) = read
    try:
        if variants["unsure"].any():
            cur.close()
            return None
        al = pl.from_arrow(cur.sql(sql.ALLOCATION_KEY_ROWS).to_arrow_table())
        if al["ah"].is_duplicated().any():
            cur.close()
            return None
        alv = al.join(facts_of, on="ah", how="left").join(variants.drop("unsure"), on="gh", how="left").with_columns(
            pl.col("data_s").fill_null(0.0), pl.col("busy_s").fill_null(0.0), pl.col("has_piece").fill_null(False),
            pl.col("has_util").fill_null(False), pl.col("idle_s").fill_null(0.0), pl.col("nop_s").fill_null(0.0),
            *([pl.col("any_s").fill_null(0.0)] if mfu else [])).drop("ah", "gh")
        return FactWindow(cur, p, b, g, alv), timelines(cur, p, b, parts)
    except BaseException:
        cur.close()
        raise


def window_jobs(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles, names: dict | None = None) -> pl.DataFrame | None:
    """The window's job list (analytics/jobs.py job_summaries' rows) from its hours' facts: each
    allocation's sums over the window (FACT_JOB_ALLOCATIONS, named by its job's hash) and the
    window's job table - no GPU's figures, timelines or allocations' table -, under a filter on
    the jobs too (the table's rows are then those jobs': hour_facts.why_not). None when facts
    cannot answer the window (hour_facts.read_window) or two of its jobs share a hash; the caller
    then takes the job list of the window's analysis. (A GPU's variant does not matter here, as it
    does to window_analysis: the facts' seconds carry its MIG share, and the list names no GPU.)
    `names`: hour_facts.read_window's."""
    read = read_window(con, p, now, facts, (sql.FACT_JOB_ALLOCATIONS,), names=names, job_list=True)
    if read is None:
        return None
    cur, _, (allocations,) = read
    try:
        jobs = pl.from_arrow(cur.sql(sql.JOB_ROWS_HASHED).to_arrow_table())
    finally:
        cur.close()
    if jobs.is_empty():
        return jobs.drop("jh")
    if jobs["jh"].is_duplicated().any():
        return None
    gpus = allocations.filter(pl.col("has_piece")).select("jh", *gpu_use())
    idle, nop = ((allocations.filter(pl.col(col) > 0).group_by("jh").agg((pl.col(col) / 3600).sum().alias(name)))
                 for col, name in (("idle_s", "idle_gpu_h"), ("nop_s", "no_process_gpu_h")))
    return job_list(jobs, gpus, idle, nop, ["jh"], p).drop("jh")


@dataclass(frozen=True)
class WindowWaste:
    """What the Waste page shows of a window (besides its utilization by model and host: the
    Utilization page's, hour_facts.window_use): Analysis.totals(), waste_by (account and user,
    idle and no-process) and top_wasteful_jobs."""

    totals: Totals
    waste: dict[tuple[str, str], pl.DataFrame]
    top_jobs: pl.DataFrame


def window_waste(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles, top: int,
                 names: dict | None = None) -> WindowWaste | None:
    """The window's waste figures (the `top` most wasteful jobs) from its hours' facts: the
    allocations with idle or no-process stretches (FACT_STRETCHES; their jobs from the job table,
    their GPUs from the capacity, both by hash) and the GPUs' figures - neither the window's allocations table nor every
    allocation's sums, which the whole analysis (window_analysis) reads; a job the job table lacks
    (the accounting has none: a pod only the exporter saw) named by its allocations. None where
    facts cannot answer the window (hour_facts.read_window), a GPU's variant is not one over it (as
    window_analysis), or a stretch's job or GPU is not found by its hash (or two are): then the
    whole analysis'. `names`: hour_facts.read_window's."""
    read = read_with_gpus(con, p, now, facts, (sql.FACT_VARIANTS, sql.FACT_STRETCHES), names=names)
    if read is None:
        return None
    cur, b, g, (variants, stretched) = read
    try:
        if variants["unsure"].any():
            return None
        jobs = pl.from_arrow(cur.sql(sql.JOB_ROWS_HASHED).to_arrow_table()).select(
            "jh", "cluster", "scheduler", "job_key", pl.coalesce("job_id", "job_key").alias("job_id"), "user_name", "account", "partition")
        keys = pl.from_arrow(cur.sql(sql.CAPACITY_GPU_HASHES).to_arrow_table()).select("gh", "host", "gpu_uuid", "gi")
        if jobs["jh"].is_duplicated().any() or keys["gh"].is_duplicated().any():
            return None
        unnamed = stretched.select("jh").unique().join(jobs.select("jh"), on="jh", how="anti")
        if unnamed.height:  # jobs the accounting lacks (a pod only the exporter saw): named by their allocations, as al names them
            cur.register("_unnamed", unnamed.to_arrow())
            try:
                named = pl.from_arrow(cur.sql(sql.ALLOCATION_JOB_NAMES).to_arrow_table())
            finally:
                cur.unregister("_unnamed")
            # (two jobs of one hash; or an accounted job that did not run in the window: facts
            # that do not stand for it - the whole analysis' then)
            if named["jh"].is_duplicated().any() or named["accounted"].any():
                return None
            jobs = pl.concat([jobs, named.select(jobs.columns)], how="vertical_relaxed")
        rows = stretched.join(jobs, on="jh", how="left").join(keys, on="gh", how="left").join(variants.drop("unsure"), on="gh", how="left")
        if rows.filter(pl.col("job_key").is_null() | pl.col("host").is_null()).height:
            return None
        prices = price_table(p.prices)
        idle, nop = (_stretch_rows(rows, kind, prices) for kind in ("idle", "no_process"))
        alloc = query_frame(cur, sql.ALLOCATED_GPU_H_TOTAL, b)

        def runtimes(top: pl.DataFrame) -> pl.DataFrame:
            cur.register("_jobs", top.to_arrow())
            try:
                return query_frame(cur, sql.JOB_RUNTIMES, b)
            finally:
                cur.unregister("_jobs")

        return WindowWaste(totals=fleet_totals(g, alloc, idle, nop, p.filters),
                           waste={(by, kind): waste_by(s, by) for by in ("account", "user_name") for kind, s in (("idle", idle), ("no_process", nop))},
                           top_jobs=top_wasteful_jobs(idle, top, runtimes))
    finally:
        cur.close()


class MfuWindow:
    """What mfu.job_mfu reads of a window read from its hours' facts by `mfu_window`: its Params,
    its bound parameters, a cursor holding its job table (ja), each job's held GPUs (mfu_held:
    sql.MFU_HELD_FACTS' rows) and tensor use (mfu_use: mfu.tensor_use's) by the job's hash, and
    the held jobs the table lacks named (mfu_unnamed); close it (`con.close()`) when done."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, p: Params, bind: dict):
        self.con, self.p, self.bind = cur, p, bind

    def q(self, query: str, **extra) -> pl.DataFrame:
        return query_frame(self.con, query, {**self.bind, **extra})


def mfu_window(con: duckdb.DuckDBPyConnection, p: Params, now: datetime, facts: FactFiles, names: dict | None = None) -> MfuWindow | None:
    """The window's MfuWindow - its MFU figures (mfu.job_mfu, account_mfu) are those of its
    analysis - from its hours' facts alone: each allocation's seconds held, GPU and detail sums
    (sql.FACT_MFU_ALLOCATIONS) summed per job by the job's hash, each GPU's model from the
    inventory by the GPU's hash, the jobs named by the job table (those it lacks, by their
    allocations) - not the window's allocations table, nor a join on a job's key. None when facts
    cannot answer the window (as window_analysis), or two of its jobs share a hash (as
    window_jobs). `names`: hour_facts.read_window's."""
    read = read_window(con, p, now, facts, (sql.FACT_MFU_ALLOCATIONS, sql.FACT_VARIANTS), names=names)
    if read is None:
        return None
    cur, b, (allocations, variants) = read
    try:
        if variants["unsure"].any() or cur.execute(sql.JOB_HASH_CLASHES).fetchall()[0][0]:
            cur.close()
            return None
        peaks = peaks_for(p.mfu_dtype)
        cur.register("mfu_peaks", peaks.to_arrow())
        cur.register("_mfu_alloc", allocations.to_arrow())
        held = query_frame(cur, sql.MFU_HELD_FACTS, b)
        cur.unregister("_mfu_alloc")
        cur.register("mfu_held", held.to_arrow())
        cur.register("mfu_use", tensor_use(allocations, peaks, ["jh"]).to_arrow())
        cur.register("_unnamed", cur.sql(sql.HELD_JOBS_UNACCOUNTED).to_arrow_table())
        unnamed = pl.from_arrow(cur.sql(sql.ALLOCATION_JOB_NAMES).to_arrow_table())
        cur.unregister("_unnamed")
        if unnamed["jh"].is_duplicated().any():  # (two jobs of one hash)
            cur.close()
            return None
        cur.register("mfu_unnamed", unnamed.to_arrow())
        return MfuWindow(cur, p, b)
    except BaseException:
        cur.close()
        raise
