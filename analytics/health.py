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

from gpufleet.analytics.params import Params

THERMAL_BITS = 0x20 | 0x40
POWER_BITS = 0x04 | 0x80
HW_SLOWDOWN_BITS = 0x08

_WINDOW = """ts >= $start AND ts < $end
      AND ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model)"""

_KEY = "cluster, host, gpu_uuid, coalesce(gpu_instance, -1)"


def _pct(bits: int) -> str:
    return f"avg(CASE WHEN (clocks_event_reasons & {bits}) <> 0 THEN 100.0 ELSE 0.0 END) FILTER (WHERE clocks_event_reasons IS NOT NULL)"


PER_GPU = f"""
SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, any_value(gpu) AS gpu, any_value(model) AS model,
       count(*) AS samples, min(ts) AS first_sample, max(ts) AS last_sample,
       max(gpu_temp_c)::DOUBLE AS gpu_temp_max_c, avg(gpu_temp_c)::DOUBLE AS gpu_temp_avg_c, max(mem_temp_c)::DOUBLE AS mem_temp_max_c,
       max(power_w)::DOUBLE AS power_max_w,
       count(*) FILTER (WHERE gpu_up = 0) AS lost_samples, min(ts) FILTER (WHERE gpu_up = 0) AS first_lost,
       list(DISTINCT xid_last ORDER BY xid_last) FILTER (WHERE xid_last > 0) AS xids,
       min(ts) FILTER (WHERE xid_last > 0) AS first_xid,
       arg_max(ecc_dbe_vol, ts) - arg_min(ecc_dbe_vol, ts) AS ecc_dbe_new,
       arg_max(ecc_sbe_vol, ts) - arg_min(ecc_sbe_vol, ts) AS ecc_sbe_new,
       max(ecc_dbe_agg) AS ecc_dbe_total,
       max(remap_correctable) AS remap_correctable, max(remap_uncorrectable) AS remap_uncorrectable,
       max(remap_failure) AS remap_failure,
       arg_max(pcie_replay, ts) - arg_min(pcie_replay, ts) AS pcie_replays,
       {_pct(THERMAL_BITS)} AS thermal_throttle_pct,
       {_pct(POWER_BITS)} AS power_throttle_pct,
       {_pct(HW_SLOWDOWN_BITS)} AS hw_slowdown_pct,
       (arg_max(thermal_violation_ns, ts) - arg_min(thermal_violation_ns, ts)) / 1e9 AS thermal_violation_s,
       (arg_max(power_violation_ns, ts) - arg_min(power_violation_ns, ts)) / 1e9 AS power_violation_s
FROM gpu_samples
WHERE {_WINDOW}
GROUP BY cluster, host, gpu_uuid, coalesce(gpu_instance, -1)
"""

# Counters whose rise in the window is an event: (kind, column, its first value in base, label).
_COUNTERS = (
    ("ecc_dbe", "ecc_dbe_vol", "dbe0", "double-bit ECC errors"),
    ("ecc_sbe", "ecc_sbe_vol", "sbe0", "single-bit ECC errors"),
    ("row_remap", "remap_uncorrectable", "unc0", "uncorrectable remapped rows"),
)
_COUNTER_EVENTS = "".join(
    f"""UNION ALL
SELECT min(s.ts), s.cluster, s.host, any_value(s.gpu), s.gpu_uuid, s.gi, any_value(s.model),
       '{kind}', NULL, count(*), '{label}: +' || (max(s.{col}) - coalesce(any_value(b.{base}), 0))::BIGINT
FROM s JOIN base b USING (cluster, host, gpu_uuid, gi)
WHERE s.{col} > coalesce(b.{base}, 0) GROUP BY s.cluster, s.host, s.gpu_uuid, s.gi
"""
    for kind, col, base, label in _COUNTERS
)

# One row per event: XID codes (first sample showing each), new volatile ECC errors (first
# sample above the window's first value), row-remap failures, lost GPUs (first gpu_up = 0).
EVENTS = f"""
WITH s AS (
    SELECT ts, cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, gpu, model,
           xid_last, ecc_dbe_vol, ecc_sbe_vol, remap_failure, remap_uncorrectable, gpu_up
    FROM gpu_samples WHERE {_WINDOW}
      AND (xid_last > 0 OR ecc_dbe_vol > 0 OR ecc_sbe_vol > 0 OR remap_failure > 0 OR remap_uncorrectable > 0 OR gpu_up = 0)
), base AS (
    SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi,
           arg_min(ecc_dbe_vol, ts) AS dbe0, arg_min(ecc_sbe_vol, ts) AS sbe0,
           arg_min(remap_uncorrectable, ts) AS unc0
    FROM gpu_samples WHERE {_WINDOW}
    GROUP BY ALL
)
SELECT min(ts) AS ts, cluster, host, any_value(gpu) AS gpu, gpu_uuid, gi, any_value(model) AS model,
       'xid' AS kind, xid_last AS code, count(*) AS samples, 'XID ' || xid_last AS detail
FROM s WHERE xid_last > 0 GROUP BY cluster, host, gpu_uuid, gi, xid_last
{_COUNTER_EVENTS}
UNION ALL
SELECT min(ts), cluster, host, any_value(gpu), gpu_uuid, gi, any_value(model),
       'row_remap_failure', NULL, count(*), 'row remapping failed'
FROM s WHERE remap_failure > 0 GROUP BY cluster, host, gpu_uuid, gi
UNION ALL
SELECT min(ts), cluster, host, any_value(gpu), gpu_uuid, gi, any_value(model),
       'gpu_lost', NULL, count(*), 'GPU not usable (gpufleet_gpu_up = 0)'
FROM s WHERE gpu_up = 0 GROUP BY cluster, host, gpu_uuid, gi
ORDER BY ts DESC, cluster, host, gpu, kind
"""

TEMPERATURE = f"""
SELECT to_timestamp(floor((epoch(ts) - epoch($start)) / $bucket) * $bucket + epoch($start))::TIMESTAMP AS bucket,
       cluster, host, max(gpu_temp_c)::DOUBLE AS gpu_temp_max_c, avg(gpu_temp_c)::DOUBLE AS gpu_temp_avg_c,
       max(mem_temp_c)::DOUBLE AS mem_temp_max_c
FROM gpu_samples
WHERE {_WINDOW} AND (gpu_temp_c IS NOT NULL OR mem_temp_c IS NOT NULL)
GROUP BY ALL ORDER BY cluster, host, bucket
"""


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
    return _q(con, PER_GPU, _binds(params)).sort(["cluster", "host", "gpu", "gi"], nulls_last=True)


def events(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """ts, cluster, host, gpu, gpu_uuid, gi, model, kind, code, samples, detail; newest first.
    kind: xid, ecc_dbe, ecc_sbe, row_remap, row_remap_failure, gpu_lost."""
    return _q(con, EVENTS, _binds(params))


def temperature(con: duckdb.DuckDBPyConnection, params: Params, bucket: timedelta) -> pl.DataFrame:
    """Per host and time bucket: the hottest GPU's temperature, the mean, the hottest memory."""
    return _q(con, TEMPERATURE, _binds(params, bucket=bucket.total_seconds()))
