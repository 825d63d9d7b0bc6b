"""MFU (model FLOPs utilization) per job and per account, always with the method that gave it.

MFU = achieved model FLOP/s / (GPUs x dense peak FLOP/s of the GPU model for a dtype). Every row
names its method, tried in this order:

1. reported: the job's published throughput (exporter/jobreport.py -> job_throughput):
   sum(FLOP/s x reports) / sum(GPUs x reports) / peak over its hourly reports overlapping the window.
   GPUs: what the report covers, else the job's GPU equivalents (MIG share). tokens/s counts as
   6 x N x tokens/s: attention FLOPs excluded, so long sequences are understated.
2. estimate: the time-weighted mean of DCGM_FI_PROF_PIPE_TENSOR_ACTIVE x SM clock / boost clock over
   the job's GPU time (clock factor 1 where either clock is unknown, and the method says so); where
   dcgm-exporter and the gpufleet exporter both report a GPU, dcgm-exporter's (exposition_parse.PRECEDENCE).
   The counter knows no dtype: it is against `[analytics] mfu_dtype` (bf16), so FP8 reads up to 2x.
3. unknown, with the reason (no tensor activity data, a GPU model without a peak, no mapping).

Never from GPU_UTIL: a one-thread kernel reads 100 % utilization and 0 % MFU.
Peaks: analytics/data/gpu_peaks.csv, dense TFLOPS (no sparsity) with a source for every row.
"""

from __future__ import annotations

import csv
from datetime import datetime
from functools import cache
from importlib import resources

import numpy as np
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.core import JOB_KEY, Analysis


DTYPES = ("bf16", "fp16", "tf32", "fp8", "fp64")
NO_TENSOR = "no tensor activity data (dcgm-exporter without DCP metrics, or the gpufleet exporter on a GPU without GPM)"
NO_MAPPING = "no GPU of this job in the store (no exporter job mapping in the window)"
COLUMNS = ("cluster", "job_key", "job_id", "account", "user_name", "model", "gpus", "mfu", "method", "reason")


@cache
def gpu_peaks() -> pl.DataFrame:
    """gpu_peaks.csv: model, dtype, dense_tflops, boost_clock_mhz (null: unknown), source."""
    with resources.files("gpufleet.analytics.data").joinpath("gpu_peaks.csv").open() as f:
        rows = list(csv.DictReader(f))
    return pl.DataFrame(
        {
            "model": [r["model"] for r in rows],
            "dtype": [r["dtype"] for r in rows],
            "dense_tflops": [float(r["dense_tflops"]) for r in rows],
            "boost_clock_mhz": [float(r["boost_clock_mhz"]) if r["boost_clock_mhz"] else None for r in rows],
            "source": [r["source"] for r in rows],
        },
        schema={"model": pl.Utf8, "dtype": pl.Utf8, "dense_tflops": pl.Float64, "boost_clock_mhz": pl.Float64, "source": pl.Utf8},
    )


def peaks_for(dtype: str) -> pl.DataFrame:
    """One row per model in the table: peak_tflops for `dtype` (null when it has none), boost clock."""
    if dtype not in DTYPES:
        raise ValueError(f"mfu dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    p = gpu_peaks()
    return (
        p.group_by("model")
        .agg(
            pl.col("dense_tflops").filter(pl.col("dtype") == dtype).first().alias("peak_tflops"),
            pl.col("boost_clock_mhz").drop_nulls().first().alias("boost_clock_mhz"),
        )
        .sort("model")
    )


def job_mfu(a: Analysis, reports_in: tuple[datetime, datetime] | None = None) -> pl.DataFrame:
    """One row per job that held GPUs in the window: COLUMNS, scheduler, gpu_h (allocated GPU-hours in
    the window), peak_tflops (per GPU) and tflops_per_gpu. `mfu` is a fraction of the dense peak
    (0.45 = 45 %), null when the method is "unknown". `reports_in`: the window whose reports count when
    `a` is narrowed to a job's run (dashboards/data.py job_report): a report written at exit still counts."""
    dtype = a.p.mfu_dtype
    peaks = peaks_for(dtype)
    a.con.register("mfu_peaks", peaks.to_arrow())
    detail = tensor_detail(a.detail_numbers(), peaks)
    a.con.register("mfu_detail", detail.drop("model").to_arrow())
    a.con.register("mfu_no_boost", _no_boost(a, detail).to_arrow())
    raw = a.q(sql.MFU_JOBS, **({"start": reports_in[0], "end": reports_in[1]} if reports_in else {}))
    f = a.p.filters
    for col, want in (("account", f.account), ("user_name", f.user_name), ("model", f.model)):
        if want is not None:
            raw = raw.filter(pl.col(col) == want)
    return decide_all(raw, dtype)


SCHEMA = {
    "cluster": pl.Utf8, "job_key": pl.Utf8, "job_id": pl.Utf8, "account": pl.Utf8, "user_name": pl.Utf8, "model": pl.Utf8,
    "gpus": pl.Int64, "mfu": pl.Float64, "method": pl.Utf8, "reason": pl.Utf8,
    "scheduler": pl.Utf8, "gpu_h": pl.Float64, "peak_tflops": pl.Float64, "tflops_per_gpu": pl.Float64,
}
UNMAPPED_MODEL = "its GPU model is unknown (no GPU of this job in the store)"
MODEL_MISSING = "a GPU of the job has no model in the inventory"


def decide_all(raw: pl.DataFrame, dtype: str) -> pl.DataFrame:
    """_decide for every row of sql.MFU_JOBS, in order, as column expressions; the few rows whose reasons
    name GPU models or whose peak is unknown go through _decide itself."""
    n_models = sum(pl.col(c).list.len().fill_null(0) for c in ("not_listed", "no_peak", "no_boost"))
    odd = (n_models > 0) | (pl.col("mapped") & pl.col("peak_tflops").is_null())
    raw = raw.with_row_index("_i")
    few = raw.filter(odd)
    rows = pl.DataFrame([_decide(r, dtype) + (r["_i"],) for r in few.iter_rows(named=True)],
                        schema={**SCHEMA, "_i": pl.UInt32}, orient="row")
    out = pl.concat([_decide_columns(raw.filter(~odd), dtype), rows], how="vertical_relaxed").sort("_i").drop("_i")
    return out.cast(SCHEMA)


# A share shown as a whole percent is first rounded to this many decimals: the same seconds summed in another order (float
# noise, ~1e-16) must not move a share that lies on a half percent (1/8: 12.5 %) to the next percent on one path only
SHARE_DECIMALS = 12


def _share(x: float) -> str:
    """format(x, ".0%") of a share rounded to SHARE_DECIMALS."""
    return f"{round(x, SHARE_DECIMALS):.0%}"


def _pct(x: pl.Expr) -> pl.Expr:
    """_share as an expression: x (rounded to SHARE_DECIMALS) x 100 rounded half to even, as Python's formatting does."""
    rounded = x.round(SHARE_DECIMALS).mul(100.0).map_batches(lambda v: pl.Series(np.rint(v.to_numpy()), dtype=pl.Float64), return_dtype=pl.Float64)
    return rounded.cast(pl.Int64, strict=False).cast(pl.Utf8) + "%"  # inf, NaN -> null (never shown)


def _decide_columns(r: pl.DataFrame, dtype: str) -> pl.DataFrame:
    """_decide's branches as expressions, for rows whose reasons name no GPU model."""
    c = pl.col
    reports = c("reports").fill_null(0) != 0
    problem = pl.when(~c("mapped")).then(pl.lit(UNMAPPED_MODEL)).when(c("model_missing").fill_null(False)).then(pl.lit(MODEL_MISSING))
    tensor = c("tensor_s").is_not_null() & (c("tensor_s") != 0)
    basis = (pl.when(c("basis") == "flops").then(pl.lit("FLOP/s")).when(c("basis") == "6N_tokens").then(pl.lit("6N x tokens/s"))
             .otherwise(pl.lit("mixed bases")))
    scaled = c("scaled_s").fill_null(0.0) / c("tensor_s")
    notes = pl.concat_list(
        pl.when(scaled == 0).then(pl.lit("no clock scaling: no SM clock samples"))
        .when(scaled < 0.999).then(pl.lit("clock scaling on ") + _pct(scaled) + " of the time (SM or boost clock missing on the rest)"),
        pl.when(c("data_s").is_not_null() & (c("data_s") != 0) & (c("tensor_s") < 0.99 * c("data_s")))
        .then(pl.lit("tensor activity data on ") + _pct(c("tensor_s") / c("data_s")) + " of the job's sampled GPU time"),
    ).list.drop_nulls()
    estimate = pl.when(scaled == 0).then(pl.lit(f"estimate (tensor_active, no clock scaling, dtype={dtype})")).otherwise(
        pl.lit(f"estimate (tensor_active x clock / boost, dtype={dtype})"))
    unknown = pl.lit("unknown")
    cases = [  # (when, mfu, method, reason), in _decide's order
        (reports & problem.is_not_null(), None, unknown, pl.lit("the job reports its throughput, but ") + problem),
        (reports & (~c("gpus_known").fill_null(False) | c("flops_per_gpu").is_null()), None, unknown,
         pl.lit("the job reports its throughput but its GPU count is unknown")),
        (reports, c("flops_per_gpu") / (c("peak_tflops") * 1e12), pl.lit("reported (") + basis + f", dtype={dtype})",
         pl.when(c("basis").str.contains("6N_tokens", literal=True)).then(pl.lit("6N FLOPs per token: attention FLOPs excluded"))),
        (~c("mapped"), None, unknown, pl.lit(NO_MAPPING + ", and no job-reported throughput")),
        (~tensor, None, unknown, pl.when(problem.is_null()).then(pl.lit(NO_TENSOR)).otherwise(pl.lit(NO_TENSOR + "; ") + problem)),
        (problem.is_not_null(), None, unknown, problem),
        (pl.lit(True), c("est_s") / c("tensor_s"), estimate, pl.when(notes.list.len() > 0).then(notes.list.join("; "))),
    ]

    def pick(j: int) -> pl.Expr:
        out = pl.lit(None)
        for when, *what in reversed(cases):
            out = pl.when(when).then(pl.lit(None) if what[j] is None else what[j]).otherwise(out)
        return out

    return r.with_columns(pick(0).cast(pl.Float64).alias("mfu"), pick(1).alias("method"), pick(2).cast(pl.Utf8).alias("reason")).select(
        *[k for k in SCHEMA if k not in ("tflops_per_gpu",)], (c("mfu") * c("peak_tflops")).alias("tflops_per_gpu"), "_i")


def tensor_detail(numbers: pl.DataFrame, peaks: pl.DataFrame) -> pl.DataFrame:
    """Each allocation's tensor use, a row per row of Analysis.detail_numbers, for sql.MFU_JOBS to sum per
    job (w = seconds x MIG share): piece, t (tensor activity known), tk (and boost clock known),
    tensor_s, est_s (tensor activity x SM clock / boost clock x w; x 1 where a clock is unknown),
    scaled_s (time with both clocks), any_s, model."""
    boost = peaks.select("model", pl.col("boost_clock_mhz").cast(pl.Float64).alias("boost"))
    d = numbers.join(boost, on="model", how="left", maintain_order="left")
    piece = pl.col("has_piece").fill_null(False)
    t, known = piece & pl.col("tensor_s").is_not_null(), pl.col("boost").is_not_null()
    return d.select(
        piece.alias("piece"), t.alias("t"), (t & known).alias("tk"), "tensor_s",
        pl.when(known).then(pl.col("tclock") / pl.col("boost")).otherwise(pl.col("tw_clocked")).add(pl.col("tnoclock")).alias("est_s"),
        pl.when(known).then(pl.col("clocked_s")).alias("scaled_s"), "any_s", "model")


def _no_boost(a: Analysis, detail: pl.DataFrame) -> pl.DataFrame:
    """Per job, the sorted models without a boost clock among its GPUs with tensor activity (no_boost)."""
    rows = np.flatnonzero((detail["t"] & ~detail["tk"] & detail["model"].is_not_null()).to_numpy())
    schema = {"cluster": pl.String, "scheduler": pl.String, "job_key": pl.String, "no_boost": pl.List(pl.String)}
    if not len(rows):
        return pl.DataFrame(schema=schema)
    keyed = a.allocation_text(rows, JOB_KEY).hstack([detail["model"][rows]])
    return keyed.group_by(JOB_KEY).agg(pl.col("model").unique().sort().alias("no_boost")).cast(schema)


def _decide(r: dict, dtype: str) -> tuple:
    """Pick the method for one job and say why."""
    base = (r["cluster"], r["job_key"], r["job_id"], r["account"], r["user_name"], r["model"], r["gpus"])
    tail = (r["scheduler"], r["gpu_h"])
    peak_problems = _peak_problems(r, dtype)
    peak = r["peak_tflops"]

    def known(mfu: float, method: str, reason: str | None) -> tuple:
        return base + (mfu, method, reason) + tail + (peak, mfu * peak)

    def unknown(reasons: list[str]) -> tuple:
        return base + (None, "unknown", "; ".join(reasons)) + tail + (peak, None)

    if r["reports"]:
        if peak_problems:
            return unknown([f"the job reports its throughput, but {p}" for p in peak_problems])
        if not r["gpus_known"] or r["flops_per_gpu"] is None:
            return unknown(["the job reports its throughput but its GPU count is unknown"])
        basis = {"flops": "FLOP/s", "6N_tokens": "6N x tokens/s"}.get(r["basis"], "mixed bases")
        note = "6N FLOPs per token: attention FLOPs excluded" if r["basis"] and "6N_tokens" in r["basis"] else None
        return known(r["flops_per_gpu"] / (peak * 1e12), f"reported ({basis}, dtype={dtype})", note)
    if not r["mapped"]:
        return unknown([NO_MAPPING + ", and no job-reported throughput"])
    if not r["tensor_s"]:
        return unknown([NO_TENSOR] + peak_problems)
    if peak_problems:
        return unknown(peak_problems)
    notes = []
    scaled = (r["scaled_s"] or 0) / r["tensor_s"]
    if scaled >= 0.999:
        method = f"estimate (tensor_active x clock / boost, dtype={dtype})"
    elif scaled == 0:
        method = f"estimate (tensor_active, no clock scaling, dtype={dtype})"
        notes.append(
            f"no clock scaling: no spec boost clock for {', '.join(repr(m) for m in r['no_boost'])} in gpu_peaks.csv"
            if r["no_boost"] else "no clock scaling: no SM clock samples"
        )
    else:
        method = f"estimate (tensor_active x clock / boost, dtype={dtype})"
        notes.append(f"clock scaling on {_share(scaled)} of the time (SM or boost clock missing on the rest)")
    if r["data_s"] and r["tensor_s"] < 0.99 * r["data_s"]:
        notes.append(f"tensor activity data on {_share(r['tensor_s'] / r['data_s'])} of the job's sampled GPU time")
    return known(r["est_s"] / r["tensor_s"], method, "; ".join(notes) or None)


def _peak_problems(r: dict, dtype: str) -> list[str]:
    if not r["mapped"]:
        return [UNMAPPED_MODEL]
    out = []
    if r["model_missing"]:
        out.append(MODEL_MISSING)
    for m in r["not_listed"] or []:
        out.append(f"unknown GPU model {m!r} for dtype {dtype}: no peak in gpu_peaks.csv")
    for m in r["no_peak"] or []:
        if m not in (r["not_listed"] or []):
            out.append(f"GPU model {m!r} has no dense {dtype} peak in gpu_peaks.csv (the GPU lacks {dtype} tensor cores, or it is not recorded)")
    return out


def account_mfu(a: Analysis, jobs: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per cluster and account: MFU weighted by GPU-hours over jobs with a known MFU; method: the shared
    one, "mixed" or "unknown". unknown_jobs / unknown_gpu_h say what it leaves out; gpus_unknown_jobs,
    the jobs of unknown GPU-hours, left out rather than weighted as 0."""
    jobs = job_mfu(a) if jobs is None else jobs
    schema = {"cluster": pl.Utf8, "account": pl.Utf8, "jobs": pl.UInt32, "unknown_jobs": pl.UInt32, "gpu_h": pl.Float64,
              "unknown_gpu_h": pl.Float64, "mfu": pl.Float64, "method": pl.Utf8, "gpus_unknown_jobs": pl.UInt32}
    if jobs.is_empty():
        return pl.DataFrame(schema=schema)
    known = pl.col("mfu").is_not_null() & pl.col("gpu_h").is_not_null()
    out = (
        jobs.group_by("cluster", "account")
        .agg(
            pl.len().alias("jobs"),
            pl.col("gpu_h").is_null().sum().alias("gpus_unknown_jobs"),
            (~known).sum().alias("unknown_jobs"),
            pl.sum("gpu_h"),
            pl.col("gpu_h").filter(pl.col("mfu").is_null()).sum().alias("unknown_gpu_h"),
            ((pl.col("mfu") * pl.col("gpu_h")).filter(known).sum() / pl.col("gpu_h").filter(known).sum()).alias("mfu"),
            pl.col("method").filter(known).unique().alias("_methods"),
        )
        .with_columns(
            pl.when(pl.col("_methods").list.len() == 0).then(pl.lit("unknown"))
            .when(pl.col("_methods").list.len() == 1).then(pl.col("_methods").list.first())
            .otherwise(pl.lit("mixed")).alias("method"),
            pl.when(pl.col("mfu").is_nan()).then(None).otherwise(pl.col("mfu")).alias("mfu"),
        )
        .drop("_methods")
        .sort("cluster", "account", nulls_last=True)
    )
    return out.select(list(schema)).cast(schema)
