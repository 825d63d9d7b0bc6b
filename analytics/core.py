"""One analysis of one window: utilization, allocation, idle-time waste and its cost.

`Analysis(con, params)` materializes the interval tables of analytics/sql.py once; each figure
is then a small query over them. Pure in the sense that matters: the same store and parameters
give the same figures. Results are polars DataFrames (GPU-hours, percentages, dollars) so the
CLI, dashboards and report share them. Money is null when a model has no price: unknown, not 0.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any, Mapping

import duckdb
import polars as pl

from analytics import sql
from analytics.params import Params

GPU_DIMS = {"gpu": ("cluster", "host", "gpu", "gpu_uuid", "gi"), "host": ("cluster", "host"), "model": ("model",), "cluster": ("cluster",), "fleet": ()}
JOB_DIMS = {"partition": ("cluster", "partition"), "account": ("cluster", "account"), "user_name": ("cluster", "user_name"),
            "job": ("cluster", "scheduler", "job_key", "job_id", "user_name", "account", "partition")}


@cache
def default_prices() -> dict[str, float]:
    with resources.files("analytics.data").joinpath("prices.csv").open() as f:
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
    def __init__(self, con: duckdb.DuckDBPyConnection, params: Params, *, now: datetime | None = None):
        # a cursor of its own: the temp tables below are private to this analysis, so two
        # analyses (this window and the previous one) can share one reader connection
        self.con = con.cursor()
        self.p = params
        now = now or datetime.now(timezone.utc).replace(tzinfo=None)
        reach = params.idle_min_duration + params.max_gap
        f = params.filters
        self.bind: dict[str, Any] = {
            "start": params.start, "end": params.end, "as_of": min(params.end, now),
            "xstart": params.start - reach, "xend": params.end + reach,
            "max_gap": params.max_gap.total_seconds(), "thr": params.idle_threshold,
            "min_idle": params.idle_min_duration.total_seconds(),
            "cluster": f.cluster, "model": f.model, "account": f.account, "user_name": f.user_name, "partition": f.partition,
        }
        self.prices = price_table(params.prices)
        self.con.register("prices", pl.DataFrame({"model": list(self.prices), "usd_per_gpu_hour": list(self.prices.values())}).to_arrow())
        for stmt in (sql.INTERVALS, sql.CAPACITY, sql.ALLOCATIONS, sql.PIECES):
            self._exec(stmt)
        # per_gpu() and idle_stretches() read only the tables above, which never change after
        # this point: computed once each, then handed out as copies (totals, utilization by GPU
        # dimensions, waste and the top jobs all start from them)
        self._memo: dict[tuple[str, ...], pl.DataFrame] = {}

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
        clip = sql.clip_seconds("t0", "t1")
        return self.q(f"""
            WITH u AS (
                SELECT cluster, host, gpu_uuid, gi,
                       sum({clip} * equiv) FILTER (WHERE util IS NOT NULL) AS data_s,
                       sum(util / 100 * {clip} * equiv) AS busy_s
                FROM iv GROUP BY ALL
            ), held AS (
                -- when any job held the GPU: overlapping holders (a shared GPU, a mapping that
                -- outlives its job by max_gap) merged, so a second holder is not counted twice
                SELECT cluster, host, gpu_uuid, gi, min(a0) AS a0, max(a1) AS a1 FROM (
                    SELECT *, sum(starts) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY a0, a1 ROWS UNBOUNDED PRECEDING) AS grp
                    FROM (SELECT cluster, host, gpu_uuid, gi, a0, a1,
                                 CASE WHEN a0 <= max(a1) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY a0, a1
                                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS starts
                          FROM al))
                GROUP BY cluster, host, gpu_uuid, gi, grp
            ), a AS (
                SELECT iv.cluster, iv.host, iv.gpu_uuid, iv.gi,
                       sum({sql.clip_seconds("greatest(iv.t0, held.a0)", "least(iv.t1, held.a1)")} * iv.equiv)
                           FILTER (WHERE iv.util IS NOT NULL) AS alloc_data_s
                FROM iv JOIN (SELECT *, {sql.range_hours("a0", "a1")} AS hour FROM held) held
                  ON iv.cluster = held.cluster AND iv.host = held.host AND iv.gpu_uuid = held.gpu_uuid
                 AND iv.gi = held.gi AND {sql.iv_hour()} = held.hour AND iv.t1 > held.a0 AND iv.t0 < held.a1
                GROUP BY ALL
            )
            SELECT cap.cluster, cap.host, cap.gpu, cap.gpu_uuid, cap.gi, cap.model, cap.mig_profile,
                   cap.capacity_s * cap.equiv / 3600 AS capacity_gpu_h,
                   coalesce(u.data_s, 0) / 3600 AS data_gpu_h,
                   greatest(0, cap.capacity_s * cap.equiv - coalesce(u.data_s, 0)) / 3600 AS no_data_gpu_h,
                   coalesce(u.busy_s, 0) / 3600 AS busy_gpu_h,
                   least(coalesce(u.data_s, 0), coalesce(a.alloc_data_s, 0)) / 3600 AS allocated_data_gpu_h,
                   greatest(0, coalesce(u.data_s, 0) - coalesce(a.alloc_data_s, 0)) / 3600 AS stranded_gpu_h,
                   p.usd_per_gpu_hour
            FROM cap
            LEFT JOIN u USING (cluster, host, gpu_uuid, gi)
            LEFT JOIN a USING (cluster, host, gpu_uuid, gi)
            LEFT JOIN prices p ON p.model = cap.model
            ORDER BY cap.cluster, cap.host, cap.gpu, cap.gi""")

    # --- utilization by a dimension ---

    def utilization(self, by: str = "fleet") -> pl.DataFrame:
        """Time-weighted utilization grouped by one of analytics.params.DIMENSIONS.

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
            pclip = sql.clip_seconds("p0", "p1")
            used = self.q(f"""
                SELECT {", ".join(keys)},
                       sum({pclip} * equiv) FILTER (WHERE util IS NOT NULL) / 3600 AS data_gpu_h,
                       sum(util / 100 * {pclip} * equiv) / 3600 AS busy_gpu_h
                FROM pc GROUP BY ALL""")
            alloc = self.q(f"SELECT {', '.join(keys)}, sum(alloc_gpu_s) / 3600 AS allocated_gpu_h FROM ({sql.JOB_ALLOCATED}) GROUP BY ALL")
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
        pred = {"idle": sql.IDLE_PRED, "no_process": sql.NO_PROCESS_PRED}[kind]
        if ("idle_stretches", kind) not in self._memo:
            self._memo[("idle_stretches", kind)] = self._islands(pred)
        return self._memo[("idle_stretches", kind)].clone()

    def _islands(self, pred: str) -> pl.DataFrame:
        return self.q(f"""
            SELECT i.*, i.in_window_s * i.equiv / 3600 AS gpu_h, p.usd_per_gpu_hour,
                   i.in_window_s * i.equiv / 3600 * p.usd_per_gpu_hour AS cost
            FROM ({sql.islands(pred)}) i LEFT JOIN prices p ON p.model = i.model
            WHERE i.in_window_s > 0
            ORDER BY i.cluster, i.job_key, i.host, i.gpu_uuid, i.gi, i.s0""")

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
        jobs = self.q(f"SELECT cluster, scheduler, job_key, gpus, run_s / 3600 AS runtime_h, alloc_gpu_s / 3600 AS allocated_gpu_h FROM ({sql.JOB_ALLOCATED})")
        ranked = idle.join(jobs, on=["cluster", "scheduler", "job_key"], how="left")
        return ranked.sort(["idle_gpu_h", "idle_cost", "job_key"], descending=[True, True, False], nulls_last=True).head(n)

    def totals(self) -> Totals:
        g = self.per_gpu()
        alloc = self.q(f"SELECT coalesce(sum(alloc_gpu_s), 0) / 3600 AS h FROM ({sql.JOB_ALLOCATED})")["h"][0]
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
