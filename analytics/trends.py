"""Each headline figure against the previous window of the same length."""

from __future__ import annotations

from dataclasses import asdict

import duckdb
import polars as pl

from gpufleet.analytics.core import Analysis, Totals
from gpufleet.analytics.params import Params

HEADLINES = (
    ("allocated_gpu_h", "GPU-hours allocated"),
    ("busy_gpu_h", "GPU-hours used (busy)"),
    ("utilization_pct", "fleet utilization %"),
    ("idle_allocated_gpu_h", "idle allocated GPU-hours"),
    ("idle_allocated_cost", "cost of idle allocated time $"),
    ("no_process_gpu_h", "GPU-hours held with no process"),
    ("stranded_gpu_h", "stranded (unallocated) GPU-hours"),
    ("stranded_cost", "cost of stranded capacity $"),
    ("no_data_gpu_h", "GPU-hours with no data"),
)


def compare(current: Totals, previous: Totals) -> pl.DataFrame:
    """figure, label, current, previous, change, change_pct (None where either side is unknown)."""
    cur, prev = asdict(current), asdict(previous)
    rows = []
    for key, label in HEADLINES:
        c, p = cur[key], prev[key]
        change = c - p if c is not None and p is not None else None
        pct = change / p * 100 if change is not None and p else None
        rows.append({"figure": key, "label": label, "current": c, "previous": p, "change": change, "change_pct": pct})
    return pl.DataFrame(rows, schema={"figure": pl.Utf8, "label": pl.Utf8, "current": pl.Float64, "previous": pl.Float64, "change": pl.Float64, "change_pct": pl.Float64})


def previous_totals(con: duckdb.DuckDBPyConnection, params: Params, now=None) -> Totals:
    return Analysis(con, params.previous(), now=now).totals()
