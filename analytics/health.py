"""GPU health over a window: temperatures, XID codes, ECC errors, row remapping, throttling, lost GPUs.

Pure functions over a reader connection and Params (window, cluster and model filters; health is
about GPUs, so job filters do not apply). Definitions:

- XID: DCGM_FI_DEV_XID_ERRORS holds the code of the last XID the GPU raised (0: none). Each code
  seen in the window is one event, at the first sample that shows it.
- ECC: volatile double/single-bit counters (since the driver reload); "new" is the rise over the
  window, at the first sample above the start value. Aggregate double-bit and remapped rows are
  lifetime figures: their largest value in the window.
- Throttling: DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits, as the share of samples with the bit set:
  thermal = SW (0x20) or HW (0x40) thermal slowdown, power = SW power cap (0x4) or HW power brake
  (0x80), hw_slowdown = 0x8. Violation counters (ns) give the time throttled in the window.
- Lost: samples with gpufleet_gpu_up = 0 (fell off the bus, reset required, ...).
- Foreign processes: samples with processes of a Slurm job not allocated the GPU (foreign_processes()).
- Model: a GPU's row names its newest sample's model, an event its first sample's (an upgraded
  exporter may spell a model another way).
Shares are of samples (every scrape counts once), not time-weighted: fine at a steady interval.

Every figure is SQL over the window's facts (facts.FactWindow), whose health columns compose exactly
(tests/test_facts_health.py, against the oracle tests/support/raw_health.py). A counter event reads raw
only the one part where the counter passes the window's first value, so raw reads grow with events,
not the window. The temperature map reads parts no coarser than its bucket.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from gpufleet.analytics import raw_reads, sql
from gpufleet.analytics.facts import (EVENT_COLUMNS, FIVE_US, HEALTH_COLUMNS, OPEN_5M, SAMPLE_EXTENT, TEMPERATURE_COLUMNS, FactWindow,
                                      fact_files_of, fact_params, stored_buckets)
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


def _events(w: FactWindow, moved: list[str] | None) -> pl.DataFrame:
    """GPU_EVENTS' answer from the parts (sql.EVENTS_FROM_FACTS) of the GPUs `moved` names (the uuids of those whose health
    moved; None: every GPU); parts where a counter passes the first value read raw."""
    cur = w.con
    bind = {**w.bind, "moved": moved}
    mixed = query_rows(cur, sql.MIXED_PARTS, sql.bound(sql.MIXED_PARTS, bind))
    found = []
    p0, p1 = mixed["p0"].to_numpy(), mixed["p1"].to_numpy()
    for lo, hi in sorted(set(zip(p0.tolist(), p1.tolist()))):
        cur.register("_health_mixed", mixed.filter(pa.array((p0 == lo) & (p1 == hi))))
        found.append(raw_reads.read(cur, "health events", sql.EVENTS_OF_MIXED_PARTS, {"lo": lo, "hi": hi}, lo, hi))
        cur.unregister("_health_mixed")
    if not found:  # for the empty table's columns
        cur.register("_health_mixed", mixed)
        found.append(raw_reads.read(cur, "health events", sql.EVENTS_OF_MIXED_PARTS, {"lo": 0, "hi": 0}, 0, 0))
        cur.unregister("_health_mixed")
    cur.register("_health_mixed_events", pa.concat_tables(found))
    try:
        return w.q(sql.EVENTS_FROM_FACTS, moved=moved)
    finally:
        cur.unregister("_health_mixed_events")


def _moved_gpus(con: duckdb.DuckDBPyConnection, params: Params) -> list[str] | None:
    """The GPUs whose health moved in the window (sql.HEALTH_MOVED_GPUS): the only ones with events. Facts up
    to the first hour with samples but no facts (and through the open hour's settled 5 minutes), raw samples
    from there (the tail upkeep has not reached).
    None (every GPU) when no hour before it has facts."""
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
        while t < e and t in stored[OPEN_5M]:  # the open hour's settled 5 minutes (its file holds them)
            t += FIVE_US
        raw_us, files = min(max(t, s), e), []
        for day in range(s - s % DAY_US, raw_us, DAY_US):  # each day's file, else its hours'
            whole = day in stored[GRAIN_1D]
            files += fact_files_of(cur, tag, GRAIN_1D if whole else GRAIN_5M, [(day if whole else max(day, s), min(day + DAY_US, raw_us))])
        if not files:
            return None
        q = sql.HEALTH_MOVED_GPUS
        bind = {"files": files, "tag": tag, "raw_us": raw_us, "end_us": e, "cluster": params.filters.cluster, "model": params.filters.model}
        return raw_reads.read(cur, "health events", q, sql.bound(q, bind), raw_us, e)["gpu_uuid"].to_pylist()
    finally:
        cur.close()


_ORDER = {"gpus": ["cluster", "host", "gpu", "gi"]}  # events keep their queries' order (newest first), temperature its


def _temperature(con: duckdb.DuckDBPyConnection, params: Params, bucket: timedelta) -> pl.DataFrame:
    """sql.TEMPERATURE_FROM_FACTS from a read of its own: at its buckets' grain, of its columns alone."""
    w = FactWindow(con, params, max_grain=_grain(bucket), inside_only=True, columns=TEMPERATURE_COLUMNS, in_place=True)
    try:
        return w.q(sql.TEMPERATURE_FROM_FACTS, bucket=bucket.total_seconds())
    finally:
        w.close()


def _answers(con: duckdb.DuckDBPyConnection, params: Params, what: tuple[str, ...],
             bucket: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """`what` of the window from its facts, GPU rows in GPU order; events alone read only the GPUs whose health moved."""
    # figures and events from the coarsest tiling; the temperature (_temperature) in a worker thread beside them, on
    # a cursor of its own (DuckDB runs a statement while Python runs)
    got = {}
    others = [k for k in what if k != "temperature"]
    with ThreadPoolExecutor(1, thread_name_prefix="health-read") as pool:
        temperature = pool.submit(_temperature, con, params, bucket) if "temperature" in what else None
        if others:
            events_only = what == ("events",)
            found = _moved_gpus(con, params) if events_only else None
            w = FactWindow(con, params, gpus=found, inside_only=True,
                           columns=EVENT_COLUMNS if events_only else HEALTH_COLUMNS, in_place=True)
            try:
                # events read only the GPUs whose health moved: those the GPUs' figures name, when asked for them too,
                # else those _moved_gpus found (the window reads only theirs)
                gpus = w.health() if "gpus" in what else None
                if gpus is not None:
                    got["gpus"] = gpus.filter(pl.col("samples") > 0).drop(*sql.HEALTH_TIME_WEIGHTED, "moved")
                if "events" in what:  # (a moved GPU without a uuid: every GPU's parts)
                    moved = found if gpus is None else gpus.filter("moved")["gpu_uuid"].unique().sort().to_list()
                    got["events"] = with_inventory_models(con, _events(w, None if moved is None or None in moved else moved))
            finally:
                w.close()
        if temperature is not None:
            got["temperature"] = temperature.result()
    return {k: v.sort(_ORDER[k], nulls_last=True) if k in _ORDER else v for k, v in got.items()}


def with_inventory_models(con: duckdb.DuckDBPyConnection, events: pl.DataFrame) -> pl.DataFrame:
    """`events` with the inventory's model (sql.GPU_MODELS) where their samples name none: a lost GPU reports no model, so
    its "GPU lost" event read "-" beside its own XIDs' "NVIDIA H100 80GB HBM3"."""
    if events.is_empty() or not events["model"].null_count():
        return events
    cur = con.cursor()
    try:
        models = pl.from_arrow(query_rows(cur, sql.GPU_MODELS))
    finally:
        cur.close()
    key = ["cluster", "host", "gpu_uuid", "gi"]
    named = events.join(models.with_columns(pl.col("gi").cast(events.schema["gi"])), on=key, how="left", maintain_order="left")
    return named.with_columns(pl.coalesce("model", "inventory_model").alias("model")).drop("inventory_model")


def window_health(con: duckdb.DuckDBPyConnection, params: Params, temperature: timedelta | None = None) -> dict[str, pl.DataFrame]:
    """{"gpus": gpu_health, "events": events}, and "temperature" with a `temperature` bucket."""
    return _answers(con, params, ("gpus", "events") + (("temperature",) if temperature else ()), temperature)


def gpu_health(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """One row per GPU (or MIG instance) with samples in the window; see the module docstring."""
    return _answers(con, params, ("gpus",))["gpus"]


def events(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """ts, cluster, host, gpu, gpu_uuid, gi, model, kind, code, samples, detail; newest first.
    kind: xid, ecc_dbe, ecc_sbe, row_remap, row_remap_failure, gpu_lost."""
    return _answers(con, params, ("events",))["events"]


def temperature(con: duckdb.DuckDBPyConnection, params: Params, bucket: timedelta) -> pl.DataFrame:
    """Per host and bucket on the clock (the first and last partial): the hottest GPU's temperature, the mean,
    the hottest memory."""
    return _answers(con, params, ("temperature",), bucket)["temperature"]


def job_gpu_sources(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Slurm jobs per cluster by jobs.gpus_source ("unknown": none): cluster, gpus_source, jobs, ended. Ended jobs
    counted by slurmctld or the job mapping, or unknown, mean the accounting does not track GPUs."""
    cur = con.cursor()
    try:
        return pl.from_arrow(query_rows(cur, sql.JOB_GPU_SOURCES))
    finally:
        cur.close()


def foreign_processes(con: duckdb.DuckDBPyConnection, params: Params) -> pl.DataFrame:
    """The GPUs on which jobs not allocated them ran processes in the window (sql.FOREIGN_PROCESS_GPUS)."""
    return _raw(con, "foreign processes", sql.FOREIGN_PROCESS_GPUS, params)
