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
- Foreign processes: samples with processes of a Slurm job not allocated the GPU
  (gpufleet_gpu_foreign_processes): foreign_processes() lists the GPUs, with the most at once.
- Model: a GPU's row names the model of its newest sample in the window, an event the model of
  its first sample (an exporter upgraded mid-window may spell the same GPU's model another way).
Shares are of samples (every scrape counts once), not time-weighted: fine at a steady interval.

Cost: a week of a large fleet is hundreds of millions of samples, so the window's whole hours
come from the store's hourly health summaries (gpufleet.collector.schema.HEALTH_HOURS, one row
per GPU and hour, written with each hour's utilization summary; for the open hour, up to where
upkeep has summarised it) and only the rest - the hours a window edge cuts, hours not summarised
yet, the open hour's newest minutes - from raw samples, turned into the same rows by the same
query; every figure composes exactly from them (tests/test_health_summaries.py holds them
to the raw queries). A counter event needs the samples of the one hour in which the counter
passes the window's first value: that hour (or that part of it a row stands for) is read raw.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from gpufleet.analytics import sql
from gpufleet.analytics.params import Params
from gpufleet.times import HOUR

# Raw stretches read one query each up to this many (each query looks at every sample file's
# statistics: ~0.4 s at 16,384 GPUs a week); more (hours not summarised here and there) in one scan
MAX_STRETCHES = 4


def _binds(params: Params, **extra: Any) -> dict[str, Any]:
    f = params.filters
    return {"start": params.start, "end": params.end, "cluster": f.cluster, "model": f.model, **extra}


def _arrow(cur: duckdb.DuckDBPyConnection, query: str, binds: dict[str, Any]) -> pa.Table:
    return cur.sql(query, params=sql.bound(query, binds)).to_arrow_table()


def _q(con: duckdb.DuckDBPyConnection, query: str, binds: dict[str, Any]) -> pl.DataFrame:
    cur = con.cursor()
    try:
        return pl.from_arrow(_arrow(cur, query, binds))
    finally:
        cur.close()


def _summarised_hours(cur: duckdb.DuckDBPyConnection, params: Params) -> list[tuple[datetime, datetime, bool]]:
    """The window's hours whose health summaries the store has, each with where its summary ends
    and whether it is an open hour's (upkeep keeps one current; its rows are in gpu_now_hours):
    the hour's end, or where the open hour's summary ends now."""
    return [tuple(r) for r in cur.execute(sql.HEALTH_HOURS_IN, {"start": params.start, "end": params.end}).fetchall()]


def _raw_stretches(start: datetime, end: datetime, hours: list[tuple[datetime, datetime, bool]]) -> list[tuple[datetime, datetime]]:
    """The parts of [start, end) the summarised `hours` ((hour, ends, open), sorted, inside it) leave."""
    out, at = [], start
    for h, ends, _ in hours:
        if h > at:
            out.append((at, h))
        at = ends
    if at < end:
        out.append((at, end))
    return out


def _from_hours(con: duckdb.DuckDBPyConnection, params: Params, what: tuple[str, ...],
                bucket: timedelta | None = None) -> dict[str, pl.DataFrame] | None:
    """`what` ("gpus", "events", "temperature" in `bucket`s of whole hours) over the window's
    health rows (sql.HEALTH_PARTS: summaries of its summarised hours, the same rows from the raw
    samples of the rest, read once for all); None when no hour of it is summarised (the raw
    queries are then the shorter way)."""
    cur = con.cursor()
    try:
        hours = _summarised_hours(cur, params)
        if not hours:
            return None
        b = _binds(params, hours=[h for h, _, is_open in hours if not is_open], open_hours=[h for h, _, is_open in hours if is_open])
        stretches = _raw_stretches(params.start, params.end, hours) or [(params.start, params.start)]
        if len(stretches) > MAX_STRETCHES:  # (an open hour's minutes after its summary: a stretch of its own)
            after_open = [(ends, min(h + HOUR, params.end)) for h, ends, _ in hours if ends < min(h + HOUR, params.end)]
            raw = pa.concat_tables([_arrow(cur, sql.RAW_HEALTH_HOURS_OUTSIDE, {**b, "hours": [h for h, _, _ in hours]}),
                                    *(_arrow(cur, sql.RAW_HEALTH_HOURS, {**b, "lo": lo, "hi": hi}) for lo, hi in after_open)])
        else:
            raw = pa.concat_tables([_arrow(cur, sql.RAW_HEALTH_HOURS, {**b, "lo": lo, "hi": hi}) for lo, hi in stretches])
        cur.register("_health_raw", raw)
        answers = {"gpus": lambda: _arrow(cur, sql.HEALTH_FROM_HOURS.format(parts=sql.HEALTH_PARTS), b),
                   "events": lambda: _events_from_hours(cur, b),
                   "temperature": lambda: _arrow(cur, sql.TEMPERATURE_FROM_HOURS.format(parts=sql.HEALTH_PARTS),
                                                 {**b, "bucket": bucket.total_seconds() if bucket else None})}
        return {k: pl.from_arrow(answers[k]()) for k in what}
    finally:
        cur.close()


def _events_from_hours(cur: duckdb.DuckDBPyConnection, b: dict[str, Any]) -> pa.Table:
    mixed = _arrow(cur, sql.MIXED_HOURS.format(parts=sql.HEALTH_PARTS), b)
    cur.register("_health_mixed", mixed)
    lo = hi = b["start"]  # none: the query below answers its empty table
    if mixed.num_rows:
        lo, hi = pc.min(mixed["part_lo"]).as_py(), pc.max(mixed["part_hi"]).as_py()
    cur.register("_health_mixed_events", _arrow(cur, sql.EVENTS_OF_MIXED_HOURS, {**b, "lo": lo, "hi": hi}))
    return _arrow(cur, sql.EVENTS_FROM_HOURS.format(parts=sql.HEALTH_PARTS), b)


# The raw queries each answer has (the oracle), and how its rows are ordered
_RAW = {"gpus": sql.GPU_HEALTH, "events": sql.GPU_EVENTS, "temperature": sql.TEMPERATURE_BY_HOST}
_ORDER = {"gpus": ["cluster", "host", "gpu", "gi"]}  # events keep their queries' order (newest first), temperature its


def _answers(con: duckdb.DuckDBPyConnection, params: Params, what: tuple[str, ...], summaries: bool,
             bucket: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """`what` of the window: from the health summaries (summaries True and an hour of the window
    summarised; temperature buckets of whole hours), else from the raw queries; GPU rows in GPU
    order."""
    composed = tuple(k for k in what if k != "temperature" or bucket % HOUR == timedelta(0))
    got = (_from_hours(con, params, composed, bucket) if summaries and composed else None) or {}
    extra = {"bucket": bucket.total_seconds()} if bucket else {}
    got.update({k: _q(con, _RAW[k], _binds(params, **extra)) for k in what if k not in got})
    return {k: v.sort(_ORDER[k], nulls_last=True) if k in _ORDER else v for k, v in got.items()}


def window_health(con: duckdb.DuckDBPyConnection, params: Params, summaries: bool = True,
                  temperature: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """{"gpus": gpu_health, "events": events} of the window, and with a `temperature` bucket
    also "temperature" (as temperature()), from the store's hourly health summaries where it has
    them (`summaries` False: every raw sample, the oracle the tests hold them to); the raw
    samples the summaries leave are read once for all."""
    return _answers(con, params, ("gpus", "events") + (("temperature",) if temperature else ()), summaries, temperature)


def gpu_health(con: duckdb.DuckDBPyConnection, params: Params, summaries: bool = True) -> pl.DataFrame:
    """One row per GPU (or MIG instance) with samples in the window; see the module docstring.
    From the hourly health summaries where the store has them, as window_health."""
    return _answers(con, params, ("gpus",), summaries)["gpus"]


def events(con: duckdb.DuckDBPyConnection, params: Params, summaries: bool = True) -> pl.DataFrame:
    """ts, cluster, host, gpu, gpu_uuid, gi, model, kind, code, samples, detail; newest first.
    kind: xid, ecc_dbe, ecc_sbe, row_remap, row_remap_failure, gpu_lost. From the hourly health
    summaries where the store has them, as window_health."""
    return _answers(con, params, ("events",), summaries)["events"]


def temperature(con: duckdb.DuckDBPyConnection, params: Params, bucket: timedelta, summaries: bool = True) -> pl.DataFrame:
    """Per host and time bucket (on the clock: bucket x n since the epoch, so the window's first
    and last are partial): the hottest GPU's temperature, the mean, the hottest memory. Buckets
    of whole hours come from the hourly health summaries where the store has them, as
    window_health."""
    return _answers(con, params, ("temperature",), summaries, bucket)["temperature"]


def job_gpu_sources(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Slurm jobs per cluster by where their GPU count came from (jobs.gpus_source, "unknown"
    where no source said it): cluster, gpus_source, jobs, ended. Counts from slurmctld or the job
    mapping on ended jobs, and unknown ones, mean the accounting does not track GPUs."""
    cur = con.cursor()
    try:
        return pl.from_arrow(cur.sql(sql.JOB_GPU_SOURCES).to_arrow_table())
    finally:
        cur.close()


def foreign_processes(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """The GPUs on which jobs not allocated them ran processes in the window (sql.FOREIGN_PROCESS_GPUS)."""
    return _q(con, sql.FOREIGN_PROCESS_GPUS, _binds(params))
