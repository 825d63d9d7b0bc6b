"""One analysis of one window: utilization, allocation, idle-time waste and its cost.

`Analysis(con, params)` reads the window's samples once into arrays (analytics/gputime.py) and
materializes the small tables of analytics/sql.py (capacity, allocations); each figure is then a
look-up or a small query. (The row-by-row interval and piece tables the arrays are held to live
with the tests: tests/support/oracle_sql.py.) Pure in the sense that matters: the same store and
parameters give the same figures. Results are polars DataFrames (GPU-hours, percentages,
dollars) so the CLI, dashboards and report share them. Money is null when a model has no price:
unknown, not 0.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, Mapping

import duckdb
import numpy as np
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.gputime import GpuTime, epoch_us
from gpufleet.analytics.params import Params
from gpufleet.times import utcnow

GPU_DIMS = {"gpu": ("cluster", "host", "gpu", "gpu_uuid", "gi"), "host": ("cluster", "host"), "model": ("model",), "cluster": ("cluster",), "fleet": ()}
JOB_DIMS = {"partition": ("cluster", "partition"), "account": ("cluster", "account"), "user_name": ("cluster", "user_name"),
            "job": ("cluster", "scheduler", "job_key", "job_id", "user_name", "account", "partition")}


@cache
def default_prices() -> dict[str, float]:
    with resources.files("gpufleet.analytics.data").joinpath("prices.csv").open() as f:
        return {row["model"]: float(row["usd_per_gpu_hour"]) for row in csv.DictReader(f)}


def price_table(overrides: Mapping[str, float]) -> dict[str, float]:
    return {**default_prices(), **overrides}


@dataclass(frozen=True)
class Totals:
    """Headline figures of a window, in GPU-hours and dollars (None = unknown)."""

    capacity_gpu_h: float
    data_gpu_h: float
    no_data_gpu_h: float
    busy_gpu_h: float
    utilization_pct: float | None
    allocated_gpu_h: float  # scheduler accounting
    idle_allocated_gpu_h: float
    idle_allocated_cost: float | None
    no_process_gpu_h: float
    no_process_cost: float | None
    stranded_gpu_h: float
    stranded_cost: float | None
    unpriced_models: tuple[str, ...]


def money(df: pl.DataFrame, hours: str, price: str = "usd_per_gpu_hour") -> float | None:
    """Sum of hours x price; None (unknown) if any hours are on a GPU model without a price."""
    if df.is_empty():
        return 0.0
    if df.filter((pl.col(hours) > 0) & pl.col(price).is_null()).height:
        return None
    return float((df[hours] * df[price].fill_null(0.0)).sum())


class Analysis:
    def __init__(self, con: duckdb.DuckDBPyConnection, params: Params, *, now: datetime | None = None, detail: bool = False):
        """`detail`: read the samples' detail columns (memory, tensor activity, clock) at once, for
        an analysis that will ask for per-job detail anyway (one read of the window, not two)."""
        # a cursor of its own: the temp tables below are private to this analysis, so two
        # analyses (this window and the previous one) can share one reader connection
        self.con = con.cursor()
        self.p = params
        now = now or utcnow()
        reach = params.idle_min_duration + params.max_gap
        f = params.filters
        self.bind: dict[str, Any] = {
            "start": params.start, "end": params.end, "as_of": min(params.end, now),
            "xstart": params.start - reach, "xend": params.end + reach,
            "max_gap": params.max_gap.total_seconds(), "retire_after": params.retire_after.total_seconds(),
            "thr": params.idle_threshold,
            "min_idle": params.idle_min_duration.total_seconds(),
            "cluster": f.cluster, "model": f.model, "account": f.account, "user_name": f.user_name, "partition": f.partition,
        }
        self.prices = price_table(params.prices)
        self.con.register("prices", pl.DataFrame({"model": list(self.prices), "usd_per_gpu_hour": list(self.prices.values())}).to_arrow())
        for stmt in (sql.CAPACITY, sql.ALLOCATIONS):
            self._exec(stmt)
        self.gt = GpuTime(self.con, self.bind, detail=detail)
        self.con.register("variants", self.gt.gpus.to_arrow())
        self._allocation_use()
        # per_gpu() and idle_stretches() read only the data above, which never changes after
        # this point: computed once each, then handed out as copies (totals, utilization by GPU
        # dimensions, waste and the top jobs all start from them)
        self._memo: dict[tuple[str, ...], pl.DataFrame] = {}

    def _allocation_use(self) -> None:
        """alv: each allocation with its GPU id, data and busy seconds in the window, and whether
        any sample interval overlaps it (then it has pieces, as oracle_sql.PIECES would give)."""
        al = self.q(sql.ALLOCATION_ROWS)
        al = al.join(self.gt.ids, on=["cluster", "host", "gpu_uuid", "gi"], how="left")
        gid = al["gid"].fill_null(-1).to_numpy()
        a0 = al["a0"].dt.epoch("us").to_numpy()
        a1 = al["a1"].dt.epoch("us").to_numpy()
        s, e = epoch_us(self.p.start), epoch_us(self.p.end)
        data, busy = self.gt.integrals(gid, np.maximum(a0, s), np.minimum(a1, e))
        has = self.gt.overlaps(gid, a0, a1) & (gid >= 0)
        self._alv = al.with_columns(data_s=pl.Series(data), busy_s=pl.Series(busy), has_piece=pl.Series(has))
        self.con.register("alv", self._alv.to_arrow())

    def detail_time(self) -> GpuTime:
        """The window's arrays with the detail columns (memory, tensor activity, SM clock): the
        first call re-reads the window with them (same intervals, ids), later ones hand out the
        same arrays, so the per-job report, MFU and the job's GPU timeline read it once."""
        if self.gt.fb is None:
            self.gt = None  # the plain arrays go first: the detail ones are a superset
            self.gt = GpuTime(self.con, self.bind, detail=True)
        return self.gt

    def job_allocations(self, cluster: str, scheduler: str, job_key: str) -> pl.DataFrame:
        """One job's allocations in the window (alv's rows) with the GPU ids of the current arrays
        (gid null: a GPU with no sample in the window)."""
        is_job = (pl.col("cluster") == cluster) & (pl.col("scheduler") == scheduler) & (pl.col("job_key") == job_key)
        return self._current_ids(self._alv.filter(is_job))

    def _current_ids(self, alv: pl.DataFrame) -> pl.DataFrame:
        """Rows of alv with the gid of the arrays now held (detail_time may have re-read them)."""
        return alv.drop("gid").join(self.gt.ids, on=["cluster", "host", "gpu_uuid", "gi"], how="left")

    def allocation_detail(self) -> pl.DataFrame:
        """alv with what each allocation's pieces add up to (GpuTime.allocation_detail: pieces,
        util_n, fb_max, any_s, tensor_s, clocked_s, tclock, tw_clocked, tnoclock) and its GPU's gpu index and
        model. The first call re-reads the window with the detail columns (same intervals, ids)."""
        if ("detail",) not in self._memo:
            self.detail_time()
            g = self.gt.gpus.sort("vid").group_by("gid", maintain_order=True).agg(
                pl.first("gpu"), pl.col("model").drop_nulls().first(), pl.first("equiv"))
            al = self._current_ids(self._alv).join(g, on="gid", how="left")
            d = self.gt.allocation_detail(
                al["gid"].fill_null(-1).to_numpy(), al["a0"].dt.epoch("us").to_numpy(), al["a1"].dt.epoch("us").to_numpy(),
                al["equiv"].fill_null(1.0).to_numpy(), epoch_us(self.p.start), epoch_us(self.p.end))
            self._memo[("detail",)] = al.with_columns([pl.Series(k, v) for k, v in d.items()]).with_columns(
                pl.col("fb_max", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock").fill_nan(None))
        return self._memo[("detail",)].clone()

    def _exec(self, query: str) -> None:
        self.con.execute(query, {k: v for k, v in self.bind.items() if f"${k}" in query})

    def q(self, query: str, **extra: Any) -> pl.DataFrame:
        """Run a query with this analysis' bound parameters (plus `extra` ones)."""
        names = {k: v for k, v in {**self.bind, **extra}.items() if f"${k}" in query}
        return pl.from_arrow(self.con.sql(query, params=names).to_arrow_table())

    # --- per GPU ---

    def per_gpu(self) -> pl.DataFrame:
        """Capacity, data, busy, allocated and stranded GPU-hours per GPU (or MIG instance)."""
        if ("per_gpu",) not in self._memo:
            self._memo[("per_gpu",)] = self._per_gpu()
        return self._memo[("per_gpu",)].clone()

    def _per_gpu(self) -> pl.DataFrame:
        s, e = epoch_us(self.p.start), epoch_us(self.p.end)
        use = self.gt.per_gpu(s, e)
        held = self.q(sql.HELD).join(use.select("cluster", "host", "gpu_uuid", "gi", "gid"),
                                     on=["cluster", "host", "gpu_uuid", "gi"], how="inner")
        data, _ = self.gt.integrals(held["gid"].to_numpy(), np.maximum(held["a0"].dt.epoch("us").to_numpy(), s),
                                    np.minimum(held["a1"].dt.epoch("us").to_numpy(), e))
        alloc = held.select("gid").with_columns(alloc_data_s=pl.Series(data, dtype=pl.Float64)).group_by("gid").agg(pl.sum("alloc_data_s"))
        use = use.join(alloc, on="gid", how="left")
        self.con.register("gpu_use", use.to_arrow())
        try:
            return self.q(sql.PER_GPU)
        finally:
            self.con.unregister("gpu_use")

    # --- utilization by a dimension ---

    def utilization(self, by: str = "fleet") -> pl.DataFrame:
        """Time-weighted utilization grouped by one of gpufleet.analytics.params.DIMENSIONS.

        GPU dimensions (gpu, host, model, cluster, fleet) cover all capacity; job dimensions
        (partition, account, user_name, job) cover the time jobs held GPUs.
        """
        if by in GPU_DIMS:
            keys = [k for k in GPU_DIMS[by]]
            g = self.per_gpu()
            if g.is_empty():
                return g
            cols = [pl.sum(c) for c in ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_data_gpu_h", "stranded_gpu_h")]
            out = g.group_by(keys).agg(cols) if keys else g.select(cols)
        elif by in JOB_DIMS:
            keys = list(JOB_DIMS[by])
            used = self.q(sql.job_use(keys))
            alloc = self.q(sql.job_allocated_by(keys))
            out = alloc.join(used, on=keys, how="full", coalesce=True, nulls_equal=True).with_columns(
                pl.col("allocated_gpu_h").fill_null(0.0), pl.col("data_gpu_h").fill_null(0.0), pl.col("busy_gpu_h").fill_null(0.0)
            ).with_columns((pl.col("allocated_gpu_h") - pl.col("data_gpu_h")).clip(lower_bound=0).alias("no_data_gpu_h"))
        else:
            raise ValueError(f"unknown dimension {by!r}: expected one of {', '.join([*GPU_DIMS, *JOB_DIMS])}")
        return out.with_columns(
            pl.when(pl.col("data_gpu_h") > 0).then(pl.col("busy_gpu_h") / pl.col("data_gpu_h") * 100).otherwise(None).alias("utilization_pct")
        ).sort(keys or [pl.lit(0)])

    # --- waste ---

    def idle_stretches(self, kind: str = "idle") -> pl.DataFrame:
        """Stretches of allocated time at least idle_min_duration long where the GPU was idle
        (kind "idle": utilization below the threshold) or held with no compute process
        (kind "no_process"), with their in-window GPU-hours and cost."""
        if kind not in ("idle", "no_process"):
            raise KeyError(kind)
        if ("idle_stretches", kind) not in self._memo:
            self._memo[("idle_stretches", kind)] = self._islands(kind)
        return self._memo[("idle_stretches", kind)].clone()

    def _islands(self, kind: str) -> pl.DataFrame:
        runs = self.gt.runs(kind, self.p.idle_threshold, round(self.p.idle_min_duration.total_seconds() * 1_000_000))
        self.con.register("runs", runs.with_columns(pl.from_epoch("r0", "us"), pl.from_epoch("r1", "us")).to_arrow())
        try:
            return self.q(sql.PRICED_STRETCHES)
        finally:
            self.con.unregister("runs")

    def waste_by(self, by: str = "account", kind: str = "idle") -> pl.DataFrame:
        keys = list(JOB_DIMS[by])
        s = self.idle_stretches(kind)
        if s.is_empty():
            return pl.DataFrame(schema={**{k: pl.Utf8 for k in keys}, "gpus": pl.UInt32, "gpu_h": pl.Float64, "cost": pl.Float64})
        return (
            s.group_by(keys)
            .agg(
                pl.struct("host", "gpu_uuid", "gi").n_unique().alias("gpus"),
                pl.sum("gpu_h"),
                pl.when(pl.col("cost").is_null().any()).then(None).otherwise(pl.sum("cost")).alias("cost"),
            )
            .sort("gpu_h", descending=True)
        )

    def top_wasteful_jobs(self, n: int = 10) -> pl.DataFrame:
        """The jobs with the most idle allocated GPU-hours in the window."""
        idle = self.waste_by("job", "idle").rename({"gpus": "idle_gpus", "gpu_h": "idle_gpu_h", "cost": "idle_cost"})
        if idle.is_empty():
            return idle
        jobs = self.q(sql.JOB_RUNTIMES)
        ranked = idle.join(jobs, on=["cluster", "scheduler", "job_key"], how="left")
        return ranked.sort(["idle_gpu_h", "idle_cost", "job_key"], descending=[True, True, False], nulls_last=True).head(n)

    def totals(self) -> Totals:
        g = self.per_gpu()
        alloc = self.q(sql.ALLOCATED_GPU_H_TOTAL)["h"][0]
        idle, nop = self.idle_stretches("idle"), self.idle_stretches("no_process")

        data = float(g["data_gpu_h"].sum()) if not g.is_empty() else 0.0
        busy = float(g["busy_gpu_h"].sum()) if not g.is_empty() else 0.0
        unpriced = sorted({m for m in g.filter(pl.col("usd_per_gpu_hour").is_null())["model"].to_list() if m} if not g.is_empty() else set())
        return Totals(
            capacity_gpu_h=float(g["capacity_gpu_h"].sum()) if not g.is_empty() else 0.0,
            data_gpu_h=data,
            no_data_gpu_h=float(g["no_data_gpu_h"].sum()) if not g.is_empty() else 0.0,
            busy_gpu_h=busy,
            utilization_pct=busy / data * 100 if data > 0 else None,
            allocated_gpu_h=float(alloc),
            idle_allocated_gpu_h=float(idle["gpu_h"].sum()) if not idle.is_empty() else 0.0,
            idle_allocated_cost=money(idle, "gpu_h"),
            no_process_gpu_h=float(nop["gpu_h"].sum()) if not nop.is_empty() else 0.0,
            no_process_cost=money(nop, "gpu_h"),
            stranded_gpu_h=float(g["stranded_gpu_h"].sum()) if not g.is_empty() else 0.0,
            stranded_cost=money(g, "stranded_gpu_h"),
            unpriced_models=tuple(unpriced),
        )
