"""A window's basic helpers, shared by the analysis (core.py) and its facts (facts.py): the bound
parameters of its queries, its price table, and how allocated, data and busy time are put
together by a job dimension - a module of its own so that neither of those imports the other."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import duckdb
import polars as pl

from gpufleet.analytics.params import Params
from gpufleet.analytics.prices import price_table

JOB_FILTER_DIMS = {"job_key": "job", "user_name": "user_name", "account": "account", "partition": "partition"}


def allocated_total(row: pl.DataFrame) -> dict[str, Any]:
    """Totals' allocated_gpu_h and allocated_unknown_jobs from sql.ALLOCATED_GPU_H_TOTAL's row."""
    h, unknown = row.row(0)
    return {"allocated_gpu_h": None if h is None else float(h), "allocated_unknown_jobs": int(unknown)}


def window_bind(params: Params, now: datetime) -> dict[str, Any]:
    """The bound parameters of a window's queries (sql.py): its edges, the read window's (reach:
    idle_min_duration + max_gap either side, where an idle stretch crossing an edge is followed),
    the thresholds and the filters."""
    reach = params.idle_min_duration + params.max_gap
    return {
        "start": params.start, "end": params.end, "as_of": min(params.end, now),
        "xstart": params.start - reach, "xend": params.end + reach,
        "max_gap": params.max_gap.total_seconds(), "retire_after": params.retire_after.total_seconds(),
        "thr": params.idle_threshold,
        "min_idle": params.idle_min_duration.total_seconds(),
        **params.filters.bind(),
    }


def register_prices(con: duckdb.DuckDBPyConnection, params: Params) -> dict[str, float]:
    """The price table (model -> $/GPU-hour) registered on the cursor as `prices` (sql.PER_GPU)."""
    prices = price_table(params.prices)
    con.register("prices", pl.DataFrame({"model": list(prices), "usd_per_gpu_hour": list(prices.values())}).to_arrow())
    return prices


def by_job_dimension(alloc: pl.DataFrame, used: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Allocated GPU-hours (sql.job_allocated_by) and the allocations' data and busy GPU-hours (sql.job_use) by job dimension
    keys, with the allocated time without data. Allocated sums the row's jobs whose GPU count is known (gpus_unknown_jobs: how
    many are not); null - unknown, never 0 - where none is (or the accounting lacks the row's jobs the job mapping saw), and
    so is its no-data time."""
    return alloc.join(used, on=keys, how="full", coalesce=True, nulls_equal=True).with_columns(
        pl.col("data_gpu_h").fill_null(0.0), pl.col("busy_gpu_h").fill_null(0.0), pl.col("gpus_unknown_jobs").fill_null(0)
    ).with_columns((pl.col("allocated_gpu_h") - pl.col("data_gpu_h")).clip(lower_bound=0).alias("no_data_gpu_h"))
