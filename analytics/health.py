"""GPU health over a window: temperatures, XID codes, ECC errors, row remapping, throttling, lost GPUs.

Pure functions over a reader connection and gpufleet.analytics.params.Params (window, cluster and model
filters; health is about GPUs, so account/user/partition filters do not apply). Definitions:

- XID: DCGM_FI_DEV_XID_ERRORS holds the code of the last XID the GPU raised (0: none). Each code
  seen in the window is one event, at the first sample that shows it.
- ECC: the volatile double/single-bit counters (since the last driver reload); "new" is the rise
  from the window's first to its last value, the event time the first sample above the start
  value. Aggregate double-bit count and remapped rows (correctable, uncorrectable, failure) are
  reported as their largest value in the window: they are lifetime figures.
- Throttling: DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits, as the share of samples with the bit set:
  thermal = SW (0x20) or HW (0x40) thermal slowdown, power = SW power cap (0x4) or HW power brake
  (0x80), hw_slowdown = 0x8. Violation counters (ns) give the time throttled in the window.
- Lost: samples with gpufleet_gpu_up = 0 (fell off the bus, reset required, ...).
Shares are of samples (every scrape counts once), not time-weighted: fine at a steady interval.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import duckdb
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.params import Params


def _binds(params: Params, **extra: Any) -> dict[str, Any]:
    f = params.filters
    return {"start": params.start, "end": params.end, "cluster": f.cluster, "model": f.model, **extra}


def _q(con: duckdb.DuckDBPyConnection, query: str, binds: dict[str, Any]) -> pl.DataFrame:
    cur = con.cursor()
    try:
        names = {k: v for k, v in binds.items() if f"${k}" in query}
        return pl.from_arrow(cur.sql(query, params=names).to_arrow_table())
    finally:
        cur.close()


def gpu_health(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """One row per GPU (or MIG instance) with samples in the window; see the module docstring."""
    return _q(con, sql.GPU_HEALTH, _binds(params)).sort(["cluster", "host", "gpu", "gi"], nulls_last=True)


def events(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """ts, cluster, host, gpu, gpu_uuid, gi, model, kind, code, samples, detail; newest first.
    kind: xid, ecc_dbe, ecc_sbe, row_remap, row_remap_failure, gpu_lost."""
    return _q(con, sql.GPU_EVENTS, _binds(params))


def temperature(con: duckdb.DuckDBPyConnection, params: Params, bucket: timedelta) -> pl.DataFrame:
    """Per host and time bucket: the hottest GPU's temperature, the mean, the hottest memory."""
    return _q(con, sql.TEMPERATURE_BY_HOST, _binds(params, bucket=bucket.total_seconds()))
