"""Shared GPUs by team: the GPUs a team's jobs shared with other jobs, and the share of them it had
(gpu_job_shares, the exporter's per-job split of a shared GPU; one job's: analytics.jobs.gpu_shares)."""

from __future__ import annotations

import duckdb
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.params import Params
from gpufleet.collector.reading import query_rows

SCHEMA = {"cluster": pl.String, "account": pl.String, "gpus": pl.Int64, "jobs": pl.Int64, "shared_hours": pl.Int64,
          "sm_share": pl.Float64, "shared_with": pl.String}


def team_shares(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """Per team (account), sql.TEAM_GPU_SHARES: its GPU clock-hours with a shared scrape (each whole), GPUs, jobs, SM
    share of those GPUs while shared (None: unknown) and the teams it shared them with. Empty:
    no team shared a GPU (or no exporter publishes the per-job split)."""
    cur = con.cursor()  # the reader connection is shared between sessions
    try:
        values = {"start": params.start, "end": params.end, "cluster": params.filters.cluster, "account": params.filters.account}
        return pl.from_arrow(query_rows(cur, sql.TEAM_GPU_SHARES, sql.bound(sql.TEAM_GPU_SHARES, values))).cast(SCHEMA).select(list(SCHEMA))
    finally:
        cur.close()
