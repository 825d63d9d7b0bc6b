"""Idle (or no-process) stretches: a GPU's runs met with the allocations that held it, in arrays.

A stretch is the part of one run (gputime.GpuTime.runs: a maximal chain of back-to-back hit
intervals) inside one allocation, counted when it lasts at least idle_min_duration; its GPU-hours
are its seconds inside the window times the GPU's (or MIG instance's) share. The runs of one GPU
are disjoint and come in time order, so those meeting an allocation are one contiguous range of
them: two binary searches per allocation, not a range join over every run and allocation (the
rule row by row: tests/support/oracle_sql.py ISLANDS).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import polars as pl

from gpufleet.analytics.core import STRETCH_SCHEMA as SCHEMA
from gpufleet.analytics.prices import usd_per_gpu_hour
from tests.support.gputime import _side_by_side, search

# what a stretch names of its allocation (Analysis' alv: the job's part of its key, the job's
# attributes) and of its GPU variant (GpuTime.gpus: the GPU's part of the key, by which the
# allocation found its GPU id, and what the variant is)
NAMED_BY_ALLOCATION = ("scheduler", "job_key", "job_id", "user_name", "account", "partition")
_VARIANT = ("cluster", "host", "gpu_uuid", "gi", "model", "gpu", "equiv")
_ORDER = ["cluster", "job_key", "host", "gpu_uuid", "gi", "scheduler", "s0"]  # the stretches' order: by job, GPU, start



def stretches(runs: pl.DataFrame, alv: pl.DataFrame, variants: pl.DataFrame, prices: Mapping[str, float],
              start_us: int, end_us: int, min_idle_s: float,
              rows_of: Callable[[np.ndarray], pl.DataFrame] | None = None) -> pl.DataFrame:
    """The stretches of `runs` (gid, vid, r0, r1: epoch us, in (gid, r0) order, disjoint per GPU)
    inside the allocations `alv` (with gid, a0, a1) lasting at least `min_idle_s`, with their
    seconds inside [start_us, end_us), GPU-hours and cost (null without a price); those with no
    second inside the window left out. Ordered by cluster, job, host, GPU, start. One row
    of alv per hold (a job on a GPU, a requeued job's back-to-back runs one: raw_analysis._holds). `rows_of`: alv's rows at the given
    positions with the columns a stretch names of it (NAMED_BY_ALLOCATION), where alv holds numbers
    only (core.Analysis: al's text stays in DuckDB); None: alv has them."""
    if runs.is_empty() or alv.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    rg, r0, r1 = (runs[c].to_numpy().astype(np.int64, copy=False) for c in ("gid", "r0", "r1"))
    g = alv["gid"].fill_null(-1).to_numpy().astype(np.int64, copy=False)
    a0, a1 = alv["a0"].dt.epoch("us").to_numpy(), alv["a1"].dt.epoch("us").to_numpy()
    # searched in the line's order (gputime.search), the pairs come in that order
    rows = np.lexsort((a0, g))
    rows = rows[np.searchsorted(g[rows], 0):]  # a GPU with no sample in the window (no gid) has no run
    g, a0, a1 = g[rows], a0[rows], a1[rows]
    # one ascending line over every GPU: keys gid x span + (t - t_lo), allocations clipped to the
    # runs' extent (which changes no overlap with them)
    t_lo, t_hi = int(r0.min()), int(r1.max())
    span = t_hi - t_lo + 1
    lo = search(rg * span + (r1 - t_lo), g * span + (np.clip(a0, t_lo, t_hi) - t_lo), side="right")  # first run ending after a0
    hi = search(rg * span + (r0 - t_lo), g * span + (np.clip(a1, t_lo, t_hi) - t_lo), side="left")  # runs starting before a1
    _, ai, ri = _side_by_side(lo, np.maximum(hi, lo))  # each allocation's runs [lo, hi), laid side by side
    s0, s1 = np.maximum(r0[ri], a0[ai]), np.minimum(r1[ri], a1[ai])
    long = (s1 - s0) >= min_idle_s * 1_000_000
    ai, ri, s0, s1 = ai[long], ri[long], s0[long], s1[long]
    # seconds inside the window as sql.CLIP counts them (epoch seconds as doubles)
    in_window = np.maximum(0.0, np.minimum(s1, end_us) / 1e6 - np.maximum(s0, start_us) / 1e6)
    inside = in_window > 0
    ai, ri, s0, s1, in_window = ai[inside], ri[inside], s0[inside], s1[inside], in_window[inside]
    named = alv[rows[ai]].select(NAMED_BY_ALLOCATION) if rows_of is None else rows_of(rows[ai])
    vid = runs["vid"].to_numpy()[ri]
    vids = variants["vid"].to_numpy()
    row_of = np.zeros(int(vids.max()) + 1 if len(vids) else 0, dtype=np.int64)
    row_of[vids] = np.arange(len(vids))  # (every run's variant is among them)
    out = named.hstack(variants.select(*_VARIANT)[row_of[vid]]).with_columns(
        s0=pl.Series(s0, dtype=pl.Int64), s1=pl.Series(s1, dtype=pl.Int64), in_window_s=pl.Series(in_window, dtype=pl.Float64),
        usd_per_gpu_hour=usd_per_gpu_hour(prices)).sort(_ORDER)
    gpu_h = out["in_window_s"].to_numpy() * out["equiv"].to_numpy() / 3600  # (numpy divides; polars would multiply by 1/3600)
    out = out.with_columns(pl.from_epoch("s0", "us"), pl.from_epoch("s1", "us"), gpu_h=pl.Series(gpu_h, dtype=pl.Float64))
    out = out.with_columns(cost=pl.col("gpu_h") * pl.col("usd_per_gpu_hour"))
    return out.select([pl.col(c).cast(t) for c, t in SCHEMA.items()])
