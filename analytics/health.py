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

Cost: a week of a large fleet is hundreds of millions of samples, so every figure is SQL over the
window's facts (gpufleet.analytics.facts.FactWindow: the store's parts at the coarsest grain that
fits, the minutes a window edge cuts read raw by the same rule), whose health columns count the
samples whose time lies in each part and compose exactly (tests/test_facts_health.py holds them to
the raw queries, tests/support/raw_health.py, the tests' oracle). A counter event needs the samples of the one
part in which the counter passes the window's first value: that part of that GPU is read raw, so
the raw read grows with the events, not the window. The temperature map reads parts no coarser
than its bucket (hour facts for buckets of whole hours; 5-minute facts else). Events alone read
only the GPUs whose health moved in the window (one query over the window's facts files and the
raw tail without facts: an XID, a lost GPU, a counter that rose), and every health read only the
parts inside the window, from the files of its buckets.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from gpufleet.analytics import raw_reads, sql
from gpufleet.analytics.facts import ALL_COLUMNS, EVENT_COLUMNS, SAMPLE_EXTENT, TEMPERATURE_COLUMNS, FactWindow, fact_files_of, fact_params, stored_buckets
from gpufleet.analytics.params import Params
from gpufleet.collector.facts import DAY_US, GRAIN_1D, GRAIN_1H, GRAIN_5M, HOUR_US
from gpufleet.collector.reading import query_rows
from gpufleet.times import epoch_us


def _binds(params: Params) -> dict[str, Any]:
    f = params.filters
    return {"start": params.start, "end": params.end, "cluster": f.cluster, "model": f.model}


def _raw(con: duckdb.DuckDBPyConnection, kind: str, query: str, params: Params) -> pl.DataFrame:
    """A raw query over the window's samples on a cursor of its own, counted (raw_reads) as `kind`."""
    cur = con.cursor()
    try:
        t = raw_reads.read(cur, kind, query, sql.bound(query, _binds(params)), epoch_us(params.start), epoch_us(params.end))
        return pl.from_arrow(t)
    finally:
        cur.close()


def _grain(bucket: timedelta | None) -> int:
    """The coarsest fact grain whose buckets lie inside a chart's `bucket`s (on the clock)."""
    s = bucket.total_seconds() if bucket else None
    return next(g for g in (GRAIN_1D, GRAIN_1H, GRAIN_5M) if s is None or s % g == 0)


def _events(w: FactWindow) -> pl.DataFrame:
    """GPU_EVENTS' answer from the window's parts (sql.EVENTS_FROM_FACTS), the parts where a counter
    passes the window's first value read raw, one query per stretch they cover."""
    cur = w.con
    mixed = query_rows(cur, sql.MIXED_PARTS, sql.bound(sql.MIXED_PARTS, w.bind))
    found = []
    for lo, hi in sorted(set(zip(mixed["p0"].to_pylist(), mixed["p1"].to_pylist()))):
        cur.register("_health_mixed", mixed.filter(pc.and_(pc.equal(mixed["p0"], lo), pc.equal(mixed["p1"], hi))))
        found.append(raw_reads.read(cur, "health events", sql.EVENTS_OF_MIXED_PARTS, {"lo": lo, "hi": hi}, lo, hi))
        cur.unregister("_health_mixed")
    if not found:  # (the query answers its empty table)
        cur.register("_health_mixed", mixed)
        found.append(raw_reads.read(cur, "health events", sql.EVENTS_OF_MIXED_PARTS, {"lo": 0, "hi": 0}, 0, 0))
        cur.unregister("_health_mixed")
    cur.register("_health_mixed_events", pa.concat_tables(found))
    try:
        return w.q(sql.EVENTS_FROM_FACTS)
    finally:
        cur.unregister("_health_mixed_events")


def _moved_gpus(con: duckdb.DuckDBPyConnection, params: Params) -> list[str] | None:
    """The GPUs whose health moved in the window (sql.HEALTH_MOVED_GPUS): the only ones with events.
    Facts from the window's first hour up to its first hour with none (its day has no day facts,
    itself no 5-minute facts) but with samples (a day of the samples' days), raw samples from
    there: the tail a store's upkeep has not reached. None (every GPU) when no hour before it has
    facts: nothing to narrow the read by."""
    cur = con.cursor()
    try:
        fp = fact_params(params)
        tag = fp.tag()
        stored = stored_buckets(cur, fp)
        s, e = epoch_us(params.start), epoch_us(params.end)
        first, last = cur.execute(SAMPLE_EXTENT).fetchall()[0]
        t = s - s % HOUR_US
        while t < e and (t - t % DAY_US in stored[GRAIN_1D] or t in stored[GRAIN_5M] or first is None or t + HOUR_US <= first or t >= last):
            t += HOUR_US
        raw_us, files = min(max(t, s), e), []
        for day in range(s - s % DAY_US, raw_us, DAY_US):  # (each day's file, else its hours')
            whole = day in stored[GRAIN_1D]
            files += fact_files_of(cur, tag, GRAIN_1D if whole else GRAIN_5M, [(day if whole else max(day, s), min(day + DAY_US, raw_us))])
        if not files:
            return None
        q = sql.HEALTH_MOVED_GPUS
        bind = {"files": files, "tag": tag, "raw_us": raw_us, "end_us": e, "cluster": params.filters.cluster, "model": params.filters.model}
        return [r[0] for r in cur.execute(q, sql.bound(q, bind)).fetchall()]
    finally:
        cur.close()


_ORDER = {"gpus": ["cluster", "host", "gpu", "gi"]}  # events keep their queries' order (newest first), temperature its


def _answers(con: duckdb.DuckDBPyConnection, params: Params, what: tuple[str, ...],
             bucket: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """`what` of the window from its facts (a FactWindow for the GPUs' figures and events, another
    for the temperature); GPU rows in GPU order. Events alone read only the GPUs whose health
    moved. (The raw samples' answers, the tests' oracle: tests/support/raw_health.py.)"""
    # the GPUs' figures and events from the window's coarsest tiling (a week's day facts), the
    # temperature chart from a read of its own at the grain its buckets need (a 3-hour chart:
    # hour facts), of its columns alone: one read of every column at the chart's grain for all
    # three was 12.7 s of a 16,384-GPU week's Health page
    got = {}
    others = [k for k in what if k != "temperature"]
    if others:
        events_only = what == ("events",)
        w = FactWindow(con, params, gpus=_moved_gpus(con, params) if events_only else None, health_only=True,
                       columns=EVENT_COLUMNS if events_only else ALL_COLUMNS)
        try:
            answers = {"gpus": lambda: w.health().filter(pl.col("samples") > 0).drop(sql.HEALTH_TIME_WEIGHTED), "events": lambda: _events(w)}
            got.update({k: answers[k]() for k in others})
        finally:
            w.close()
    if "temperature" in what:
        w = FactWindow(con, params, max_grain=_grain(bucket), health_only=True, columns=TEMPERATURE_COLUMNS)
        try:
            got["temperature"] = w.q(sql.TEMPERATURE_FROM_FACTS, bucket=bucket.total_seconds())
        finally:
            w.close()
    return {k: v.sort(_ORDER[k], nulls_last=True) if k in _ORDER else v for k, v in got.items()}


def window_health(con: duckdb.DuckDBPyConnection, params: Params, temperature: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """{"gpus": gpu_health, "events": events} of the window, and with a `temperature` bucket
    also "temperature" (as temperature()), from the window's facts."""
    return _answers(con, params, ("gpus", "events") + (("temperature",) if temperature else ()), temperature)


def gpu_health(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """One row per GPU (or MIG instance) with samples in the window; see the module docstring."""
    return _answers(con, params, ("gpus",))["gpus"]


def events(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """ts, cluster, host, gpu, gpu_uuid, gi, model, kind, code, samples, detail; newest first.
    kind: xid, ecc_dbe, ecc_sbe, row_remap, row_remap_failure, gpu_lost."""
    return _answers(con, params, ("events",))["events"]


def temperature(con: duckdb.DuckDBPyConnection, params: Params, bucket: timedelta) -> pl.DataFrame:
    """Per host and time bucket (on the clock: bucket x n since the epoch, so the window's first
    and last are partial): the hottest GPU's temperature, the mean, the hottest memory."""
    return _answers(con, params, ("temperature",), bucket)["temperature"]


def job_gpu_sources(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Slurm jobs per cluster by where their GPU count came from (jobs.gpus_source, "unknown"
    where no source said it): cluster, gpus_source, jobs, ended. Counts from slurmctld or the job
    mapping on ended jobs, and unknown ones, mean the accounting does not track GPUs."""
    cur = con.cursor()
    try:
        return pl.from_arrow(query_rows(cur, sql.JOB_GPU_SOURCES))
    finally:
        cur.close()


def foreign_processes(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """The GPUs on which jobs not allocated them ran processes in the window (sql.FOREIGN_PROCESS_GPUS)."""
    return _raw(con, "foreign processes", sql.FOREIGN_PROCESS_GPUS, params)
