"""Per-job efficiency report: what jobstats tells a user, plus the rule behind the verdict.

Per job in the window: GPUs, runtime, mean and per-GPU utilization, memory high-water, idle
stretches, no-process time, and a verdict: the first rule that matches, its text saying which and the numbers:

  no_data        the job held GPUs but no sample covers them
  no_process     a GPU was held with no compute process for >= idle_min_duration
  idle           mean utilization below idle_threshold
  idle_stretches stretches >= idle_min_duration below idle_threshold (the waste figure)
  unused_gpus    some GPUs below idle_threshold while the job's mean is not
  low            mean utilization below LOW_UTILIZATION_PCT
  ok             none of the above
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Mapping

import duckdb
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics import vocabulary as words
from gpufleet.analytics.core import JOB_KEY, Analysis
from gpufleet.analytics.params import Params
from gpufleet.analytics.scope import JOB_FILTER_NAMES, filter_scope
from gpufleet.analytics.window import window_bind
from gpufleet.collector.reading import query_rows
from gpufleet.times import utcnow

LOW_UTILIZATION_PCT = 25.0  # below this a job uses a quarter of what it holds: worth a look
# verdicts compare utilization rounded to 1e-9 points: facts and raw samples sum in different orders, and a mean
# exactly at the threshold must not fall either side by a float's last bit
VERDICT_DECIMALS = 9


@dataclass
class JobReport:
    job: dict  # the job row: job_id, user_name, account, partition, state, gpus, start, end, ...
    runtime_h: float
    allocated_gpu_h: float | None  # None: the job's GPU count is unknown
    mean_utilization_pct: float | None
    per_gpu: pl.DataFrame  # host, gpu, gpu_uuid, gi, model, data_h, utilization_pct, fb_used_max_mib
    idle_stretches: pl.DataFrame
    no_process_gpu_h: float
    idle_gpu_h: float
    verdict: str
    rule: str
    mfu: dict | None = field(default=None)


def gpu_use() -> list[pl.Expr]:
    """An allocation's data hours, utilization and memory high-water in the window, from data_s, busy_s, has_util, fb_max."""
    return [pl.when(pl.col("has_util")).then(pl.col("data_s") / 3600).alias("data_h"),
            pl.when(pl.col("data_s") > 0).then(pl.col("busy_s") / pl.col("data_s") * 100).alias("utilization_pct"),
            pl.col("fb_max").cast(pl.Float64).alias("fb_used_max_mib")]


def per_job_gpu(a: Analysis) -> pl.DataFrame:
    """Per job and GPU: gpu_use's figures (as oracle_sql.PIECES adds up), in job and GPU order."""
    return _job_gpus(a).sort("cluster", "job_key", "host", "gpu", "gi")


def _job_gpus(a: Analysis) -> pl.DataFrame:
    """per_job_gpu's rows in no order: the job list adds them up per job."""
    return a.allocation_detail().lazy().filter(pl.col("has_piece")).select(  # lazy: the other columns are never copied
        "cluster", "scheduler", "job_key", "host", pl.col("gpu").cast(pl.Int16), "gpu_uuid", pl.col("gi").cast(pl.Int16), "model",
        *gpu_use()).collect()


def rule(verdict: str, row: dict, a: Analysis) -> str:
    """The sentence that says which rule gave the verdict, with the job's numbers."""
    p = a.p
    mean = row.get("mean_utilization_pct")
    least = words.duration(p.idle_min_duration.total_seconds())  # "30 min", not 0:30:00
    return {
        "no_data": lambda: (f"no samples cover this job's {row['allocated_gpu_h']:.2f} allocated GPU-hours"
                            if row["allocated_gpu_h"] is not None else
                            "no samples cover this job, and its allocated GPU-hours are unknown (its GPU count is unknown)"),
        "no_process": lambda: f"{row['no_process_gpu_h']:.2f} GPU-hours held with no compute process, in stretches of at least {least}",
        "idle": lambda: f"mean GPU utilization {mean:.1f}% < idle threshold {p.idle_threshold:g}%",
        "idle_stretches": lambda: f"{row['idle_gpu_h']:.2f} GPU-hours below {p.idle_threshold:g}% in stretches of at least {least} (mean {mean:.1f}%)",
        "unused_gpus": lambda: f"{row['low_gpus']} of {row['gpus_seen']} GPUs below {p.idle_threshold:g}% while the job averages {mean:.1f}%",
        "low": lambda: f"mean GPU utilization {mean:.1f}% < {LOW_UTILIZATION_PCT:g}%",
        "ok": lambda: f"mean GPU utilization {mean:.1f}% >= {LOW_UTILIZATION_PCT:g}%, no idle stretch, no empty GPU",
    }[verdict]()


def job_summaries(a: Analysis) -> pl.DataFrame:
    """One row per job in the window with its verdict (the searchable job list)."""
    jobs = a.q(sql.JOB_ROWS)
    if jobs.is_empty():
        return jobs
    idle = a.waste_by("job", "idle").select(*JOB_KEY, pl.col("gpu_h").alias("idle_gpu_h"))
    nop = a.waste_by("job", "no_process").select(*JOB_KEY, pl.col("gpu_h").alias("no_process_gpu_h"))
    return job_list(jobs, _job_gpus(a), idle, nop, JOB_KEY, a.p)


def job_list(jobs: pl.DataFrame, gpus: pl.DataFrame, idle: pl.DataFrame, nop: pl.DataFrame, key: list[str], p: Params) -> pl.DataFrame:
    """job_summaries' rows from sql.JOB_ROWS, the jobs' GPUs (gpu_use's columns) and their idle and no-process
    GPU-hours, joined on `key`."""
    mean = gpus.group_by(key).agg(
        (pl.col("utilization_pct") * pl.col("data_h")).sum().alias("_busy"), pl.sum("data_h"),
        pl.min("utilization_pct").alias("min_gpu_utilization_pct"), pl.max("fb_used_max_mib"),
        pl.len().alias("gpus_seen"),
        (pl.col("utilization_pct").round(VERDICT_DECIMALS) < p.idle_threshold).sum().alias("low_gpus"),
    ).with_columns(pl.when(pl.col("data_h") > 0).then(pl.col("_busy") / pl.col("data_h")).otherwise(None).alias("mean_utilization_pct"))
    out = jobs.join(mean, on=key, how="left").join(idle, on=key, how="left").join(nop, on=key, how="left").with_columns(
        pl.col("idle_gpu_h").fill_null(0.0), pl.col("no_process_gpu_h").fill_null(0.0),
        (pl.col("run_s") / 3600).alias("runtime_h"), (pl.col("alloc_gpu_s") / 3600).alias("allocated_gpu_h"),
    )
    mean = pl.col("mean_utilization_pct").round(VERDICT_DECIMALS)
    out = out.with_columns(
        pl.when(pl.col("mean_utilization_pct").is_null()).then(pl.lit("no_data"))
        .when(pl.col("no_process_gpu_h") > 0).then(pl.lit("no_process"))
        .when(mean < p.idle_threshold).then(pl.lit("idle"))
        .when(pl.col("idle_gpu_h") > 0).then(pl.lit("idle_stretches"))
        .when(pl.col("low_gpus") > 0).then(pl.lit("unused_gpus"))
        .when(mean < LOW_UTILIZATION_PCT).then(pl.lit("low"))
        .otherwise(pl.lit("ok")).alias("verdict")
    )
    return out.drop("_busy", "run_s", "alloc_gpu_s").sort(["idle_gpu_h", "job_key"], descending=[True, False])


def job_report(a: Analysis, job: str) -> JobReport | None:
    """The report of one job, by job id as people write it (123, 123_4) or by job key."""
    summary = job_summaries(a)
    if summary.is_empty():
        return None
    match = summary.filter((pl.col("job_id") == job) | (pl.col("job_key") == job))
    if match.is_empty():
        return None
    j = match.row(0, named=True)
    is_job = (pl.col("cluster") == j["cluster"]) & (pl.col("scheduler") == j["scheduler"]) & (pl.col("job_key") == j["job_key"])
    gpu = per_job_gpu(a).filter(is_job)
    stretches = a.idle_stretches("idle").filter(is_job)
    return JobReport(
        job=j, runtime_h=j["runtime_h"], allocated_gpu_h=j["allocated_gpu_h"], mean_utilization_pct=j["mean_utilization_pct"],
        per_gpu=gpu.select("host", "gpu", "gpu_uuid", "gi", "model", "data_h", "utilization_pct", "fb_used_max_mib"),
        idle_stretches=stretches.select("host", "gpu", "gpu_uuid", "gi", "s0", "s1", "gpu_h", "cost"),
        no_process_gpu_h=j["no_process_gpu_h"], idle_gpu_h=j["idle_gpu_h"],
        verdict=j["verdict"], rule=rule(j["verdict"], j, a),
    )


def job_row(con: duckdb.DuckDBPyConnection, params: Params, job: str, now: datetime | None = None,
            exact: tuple[str, str, str] | None = None) -> dict[str, Any] | None:
    """The row of the window's job table (sql.JOB_ROWS' columns, its filters applied: the job list's row) of the job named
    `job` (an id as people write it, or its key; the first by cluster, scheduler and key where the name repeats; `exact`:
    that job's cluster, scheduler and key instead), None where the table has none. Read for that job alone (its keys found
    first), so a job's page draws the report before the window's figures are computed (docs/performance.md, stop 87)."""
    cur = con.cursor()
    try:
        keys = ([dict(zip(("cluster", "scheduler", "job_key"), exact))] if exact is not None else
                query_rows(cur, sql.JOB_NAMED_KEYS, {"job": job, "cluster": params.filters.cluster}).to_pylist())
        for key in keys:
            if params.filters.cluster not in (None, key["cluster"]):
                continue
            narrowed = replace(params, filters=replace(params.filters, cluster=key["cluster"], job_key=key["job_key"]))
            bind = {**window_bind(narrowed, now or utcnow()), "of_scheduler": key["scheduler"]}
            rows = query_rows(cur, sql.JOB_NAMED_ROW, sql.bound(sql.JOB_NAMED_ROW, bind)).to_pylist()
            if rows:
                return rows[0]
        return None
    finally:
        cur.close()


def job_not_in_window(con: duckdb.DuckDBPyConnection, params: Params, job: str) -> str:
    """Why the job asked for (by id or key) has no report in the window, naming where it is: when the store's accounting
    has it run (sql.JOB_RUNS), or that the store has no such job - never a bare "not found"."""
    cur = con.cursor()
    try:
        runs = query_rows(cur, sql.JOB_RUNS, {"job": job}).to_pylist()
    finally:
        cur.close()
    if not runs:
        return f"job {job}: the store has no job of that id or key (ids as the scheduler gives them: 123, 123_4; a pod as namespace/name)"
    inside = [r for r in runs if r["start"] is not None and r["start"] < params.end and (r["end"] is None or r["end"] > params.start)]
    set_filters = {k: v for k, v in asdict(params.filters).items() if v is not None and k in ("cluster", *JOB_FILTER_NAMES)}
    left_out = {id(r): k for r in inside for k in set_filters if k in r and not params.filters.keeps(k, r[k])}
    if inside and len(left_out) == len(inside):
        r = inside[0]
        k = left_out[id(r)]
        return f"job {job}: ran in this window, but the filter {filter_scope(params.filters)} leaves it out (its {JOB_FILTER_NAMES.get(k, k)} is {r[k]})"
    if inside and params.filters.model is not None:
        return f"job {job}: ran in this window but held no GPU of model={params.filters.model} in it that the store knows"
    if inside:
        return (f"job {job}: ran in this window but held no GPU in it that the store knows (its accounting names no GPU and no "
                "exporter mapped it to one)")
    said = "; ".join(f"job {r['job_id']} of cluster {r['cluster']} " + ("has not started" if r["start"] is None else
                     f"ran {_when(r['start'])} to " + (_when(r["end"]) if r["end"] else "now (still running)")) for r in runs)
    return f"job {job}: not in this window ({_when(params.start)} to {_when(params.end)}): {said}"


def _when(t: Any) -> str:
    return f"{t:%Y-%m-%d %H:%M} UTC"


def gpu_shares(con: duckdb.DuckDBPyConnection, params: Params, cluster: str, scheduler: str, job_key: str) -> list[dict[str, Any]]:
    """The GPUs this job shared in the window (sql.JOB_GPU_SHARES): its mean SM share and memory high-water while
    shared, and the other jobs' (`others`); None where unknown, never 0. Empty: none (or no per-job split)."""
    cur = con.cursor()  # the reader connection is shared between sessions
    try:
        binds = {"cluster": cluster, "scheduler": scheduler, "job_key": job_key, "start": params.start, "end": params.end}
        rows = query_rows(cur, sql.JOB_GPU_SHARES, sql.bound(sql.JOB_GPU_SHARES, binds)).to_pylist()
    finally:
        cur.close()
    out: list[dict[str, Any]] = []
    for r in rows:
        if r["is_job"]:
            out.append({k: r[k] for k in ("host", "gpu_uuid", "gi", "first_hour", "last_hour", "shared_scrapes", "sm_share",
                                           "memory_max_bytes")} | {"others": []})
        elif out and (out[-1]["host"], out[-1]["gpu_uuid"], out[-1]["gi"]) == (r["host"], r["gpu_uuid"], r["gi"]):
            out[-1]["others"].append({k: r[k] for k in ("scheduler", "job_key", "job_id", "user_name", "sm_share", "memory_max_bytes")})
    return out


def share_sentence(gpu: Mapping[str, Any]) -> str:
    """One shared GPU of gpu_shares, said: "shared with job 7 (bob): this job 60.0 % of the SM time, job 7 30.0 %"."""
    others = gpu["others"]
    names = ", ".join(f"job {o['job_id'] or o['job_key']}" + (f" ({o['user_name']})" if o["user_name"] else "") for o in others)
    parts = [f"this job {_share(gpu['sm_share'])} of the SM time"] + [f"job {o['job_id'] or o['job_key']} {_share(o['sm_share'])}" for o in others]
    return f"shared with {names or 'other jobs'}: " + ", ".join(parts)


def _share(x: float | None) -> str:
    return words.pct(None if x is None else 100 * x)
