"""GPU health from every sample of the window - the oracle the facts' health figures are held to.

gpufleet.analytics.health answers a window's GPU figures, events and temperature chart from its
facts' parts (the minutes a window edge cuts read raw by the same rule); these queries answer the
same from the samples alone, one aggregate each, as the product did before the facts
(tests/test_health_from_facts.py compares the two).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import polars as pl

from gpufleet.analytics import health, raw_reads, sql
from gpufleet.analytics.params import Params
from gpufleet.analytics.raw_reads import SAMPLES
from gpufleet.collector.schema import HW_SLOWDOWN_BITS, POWER_BITS, THERMAL_BITS
from gpufleet.times import epoch_us

_HEALTH_WINDOW = f"""ts >= $start AND ts < $end
      AND {sql._FILTERS}"""


def _throttled_pct(bits: int) -> str:
    return f"avg(CASE WHEN (clocks_event_reasons & {bits}) <> 0 THEN 100.0 ELSE 0.0 END) FILTER (WHERE clocks_event_reasons IS NOT NULL)"


GPU_HEALTH = f"""
SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, any_value(gpu) AS gpu, arg_max(model, ts) AS model,
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
       {_throttled_pct(THERMAL_BITS)} AS thermal_throttle_pct,
       {_throttled_pct(POWER_BITS)} AS power_throttle_pct,
       {_throttled_pct(HW_SLOWDOWN_BITS)} AS hw_slowdown_pct,
       (arg_max(thermal_violation_ns, ts) - arg_min(thermal_violation_ns, ts)) / 1e9 AS thermal_violation_s,
       (arg_max(power_violation_ns, ts) - arg_min(power_violation_ns, ts)) / 1e9 AS power_violation_s
FROM {SAMPLES}
WHERE {_HEALTH_WINDOW}
GROUP BY cluster, host, gpu_uuid, coalesce(gpu_instance, -1)
"""

_COUNTER_EVENTS = "".join(
    f"""UNION ALL
SELECT min(s.ts), s.cluster, s.host, any_value(s.gpu), s.gpu_uuid, s.gi, arg_min(s.model, s.ts),
       '{kind}', NULL, count(*), '{label}: +' || (max(s.{col}) - coalesce(any_value(b.{base}), 0))::BIGINT
FROM s JOIN base b USING (cluster, host, gpu_uuid, gi)
WHERE s.{col} > coalesce(b.{base}, 0) GROUP BY s.cluster, s.host, s.gpu_uuid, s.gi
"""
    for kind, col, base, label in sql._COUNTERS
)

# One row per event: XID codes (first sample showing each), new volatile ECC errors (first
# sample above the window's first value), row-remap failures, lost GPUs (first gpu_up = 0).
GPU_EVENTS = f"""
WITH s AS (
    SELECT ts, cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, gpu, model,
           xid_last, ecc_dbe_vol, ecc_sbe_vol, remap_failure, remap_uncorrectable, gpu_up
    FROM {SAMPLES} WHERE {_HEALTH_WINDOW}
      AND (xid_last > 0 OR ecc_dbe_vol > 0 OR ecc_sbe_vol > 0 OR remap_failure > 0 OR remap_uncorrectable > 0 OR gpu_up = 0)
), base AS (
    SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi,
           arg_min(ecc_dbe_vol, ts) AS dbe0, arg_min(ecc_sbe_vol, ts) AS sbe0,
           arg_min(remap_uncorrectable, ts) AS unc0
    FROM {SAMPLES} WHERE {_HEALTH_WINDOW}
    GROUP BY ALL
)
SELECT min(ts) AS ts, cluster, host, any_value(gpu) AS gpu, gpu_uuid, gi, arg_min(model, ts) AS model,
       'xid' AS kind, xid_last AS code, count(*) AS samples, 'XID ' || xid_last AS detail
FROM s WHERE xid_last > 0 GROUP BY cluster, host, gpu_uuid, gi, xid_last
{_COUNTER_EVENTS}
UNION ALL
SELECT min(ts), cluster, host, any_value(gpu), gpu_uuid, gi, arg_min(model, ts),
       'row_remap_failure', NULL, count(*), 'row remapping failed'
FROM s WHERE remap_failure > 0 GROUP BY cluster, host, gpu_uuid, gi
UNION ALL
SELECT min(ts), cluster, host, any_value(gpu), gpu_uuid, gi, arg_min(model, ts),
       'gpu_lost', NULL, count(*), 'GPU not usable (gpufleet_gpu_up = 0)'
FROM s WHERE gpu_up = 0 GROUP BY cluster, host, gpu_uuid, gi
ORDER BY ts DESC, cluster, host, gpu, kind
"""

TEMPERATURE_BY_HOST = f"""
SELECT {sql._TEMP_BUCKET.format(t="ts")} AS bucket,
       cluster, host, max(gpu_temp_c)::DOUBLE AS gpu_temp_max_c, avg(gpu_temp_c)::DOUBLE AS gpu_temp_avg_c,
       max(mem_temp_c)::DOUBLE AS mem_temp_max_c
FROM {SAMPLES}
WHERE {_HEALTH_WINDOW} AND (gpu_temp_c IS NOT NULL OR mem_temp_c IS NOT NULL)
GROUP BY ALL ORDER BY cluster, host, bucket
"""


_RAW = {"gpus": GPU_HEALTH, "events": GPU_EVENTS, "temperature": TEMPERATURE_BY_HOST}
_ORDER = {"gpus": ["cluster", "host", "gpu", "gi"]}  # (as health's answers are ordered)


def raw_health(con: Any, params: Params, what: tuple[str, ...], bucket: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """`what` of the window ("gpus", "events", "temperature" with a `bucket`) from its raw samples,
    each on a cursor of its own, counted as raw reads ("raw path"); ordered as health's answers."""
    f = params.filters
    binds = {"start": params.start, "end": params.end, "cluster": f.cluster, "model": f.model,
             **({"bucket": bucket.total_seconds()} if bucket else {})}
    out = {}
    for k in what:
        cur = con.cursor()
        try:
            q = _RAW[k]
            out[k] = pl.from_arrow(raw_reads.read(cur, "raw path", q, sql.bound(q, binds), epoch_us(params.start), epoch_us(params.end)))
        finally:
            cur.close()
    if "events" in out:  # (named as health names them: the inventory's model where the samples name none)
        out["events"] = health.with_inventory_models(con, out["events"])
    return {k: v.sort(_ORDER[k], nulls_last=True) if k in _ORDER else v for k, v in out.items()}
