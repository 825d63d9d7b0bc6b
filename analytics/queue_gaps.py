"""Queue gaps: GPU capacity left free while pending jobs that would have fit on it waited.

Utilization counts a free GPU as waste whether or not anyone wanted it; a queue gap is the part
somebody did want. The rule (README, figures):
- A pool is a partition's whole GPUs of one model: those its jobs held in the window or the
  retire_after before it (sql.QUEUE_POOL_GPUS), as capacity counts them. A GPU is free while it is
  capacity and no allocation (any partition) holds it; `free_gpu_h` is a pool's free GPU-hours.
- A job waits from eligible (else submit) to its start (else its end, else now), in its partition's
  pool of the model most of its GPUs were (else the partition's one model).
- At each moment a waiting job fits when it requests at most the pool's free GPUs; the gap is
  min(free GPUs, the fitting jobs' GPUs), so `gap_gpu_h` <= `free_gpu_h`. GPUs are counted, not node
  shapes: the gap is an upper bound of what a scheduler could have placed. Jobs of unknown GPU
  count or pool, and jobs on MIG instances, are counted apart (not_counted).
A GPU serving two partitions is in both pools, so pools are not summed into a fleet figure.
Account, user and job filters do not narrow a pool (its capacity is everyone's): they pick the jobs
listed (QueueGaps.note says so); cluster, partition and model narrow the pools. No sample is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl

from gpufleet.analytics import sql
from gpufleet.analytics.params import Params
from gpufleet.analytics.prices import price_table
from gpufleet.analytics.scope import POOL_WIDE_FILTERS, pool_filter_note
from gpufleet.collector.intervals import distinct
from gpufleet.collector.reading import query_rows, seen_floor
from gpufleet.times import utcnow

POOL = ("cluster", "partition", "model")
POOL_SCHEMA = {"cluster": pl.String, "partition": pl.String, "model": pl.String, "gpus": pl.Int64, "free_gpu_h": pl.Float64,
               "gap_gpu_h": pl.Float64, "gap_cost": pl.Float64, "jobs_waited": pl.Int64, "jobs_fit": pl.Int64}
JOB_SCHEMA = {"cluster": pl.String, "partition": pl.String, "model": pl.String, "job_id": pl.String, "job_key": pl.String,
              "account": pl.String, "user_name": pl.String, "gpus": pl.Int64, "waited_h": pl.Float64, "fit_h": pl.Float64,
              "fit_gpu_h": pl.Float64}


@dataclass(frozen=True)
class QueueGaps:
    pools: pl.DataFrame  # POOL_SCHEMA: one row per pool, largest gap first
    jobs: pl.DataFrame  # JOB_SCHEMA: the jobs that waited while they would have fit, longest first
    not_counted: dict[str, int]  # why waiting jobs were left out -> how many
    note: str | None = None  # under an account, user or job filter: the pools are everyone's, the jobs the filter's (scope.pool_filter_note)


def queue_gaps(con, params: Params, now: datetime | None = None) -> QueueGaps:
    """The queue gaps of params' window (up to `now`, default the clock) per pool, with the jobs that waited."""
    as_of = min(params.end, now or utcnow())
    f = params.filters
    values = {"start": params.start, "as_of": as_of, "cluster": f.cluster, "partition": f.partition,
              "max_gap": params.max_gap.total_seconds(), "retire_after": params.retire_after.total_seconds()}
    cur = con.cursor()  # (the dashboard's reader connection is shared between sessions: DuckDB refuses two calls at once on it)
    try:
        # (QUEUE_POOL_GPUS reads the allocations at $start - retire_after, QUEUE_HOLDS at $start: one floor, the earlier's)
        values["seen_floor"] = seen_floor(cur, params.start - params.retire_after, values["max_gap"])
        gpus, holds, waits = (pl.from_arrow(query_rows(cur, q, sql.bound(q, values))) for q in (sql.QUEUE_POOL_GPUS, sql.QUEUE_HOLDS, sql.QUEUE_WAITS))
    finally:
        cur.close()
    prices = price_table(params.prices)
    models = gpus.group_by("cluster", "partition").agg(pl.col("model").unique().alias("models"))
    waits = waits.join(models, on=["cluster", "partition"], how="left").with_columns(
        pl.coalesce("model", pl.when(pl.col("models").list.len() == 1).then(pl.col("models").list.first())).alias("pool_model"))
    not_counted = {
        "GPUs requested unknown": waits.filter(pl.col("gpus").is_null()).height,
        "on MIG instances": waits.filter(pl.col("gpus").is_not_null() & pl.col("on_mig")).height,
        "pool unknown (no GPU of the partition seen, or several models and the job never ran)":
            waits.filter(pl.col("gpus").is_not_null() & ~pl.col("on_mig") & pl.col("pool_model").is_null()).height,
    }
    waits = waits.filter(pl.col("gpus").is_not_null() & ~pl.col("on_mig") & pl.col("pool_model").is_not_null())
    if f.model is not None:  # after the pools' models: a job's pool is the same filtered or not
        gpus, waits = gpus.filter(pl.col("model") == f.model), waits.filter(pl.col("pool_model") == f.model)
    pool_rows, job_rows = [], []
    steps = _free_gpus(gpus, holds)
    waiting = {k: g for k, g in waits.group_by("cluster", "partition", "pool_model")}
    for key, pool in gpus.group_by(*POOL, maintain_order=True):
        t, free = steps.get(key, (np.zeros(1, np.int64), np.zeros(1, np.int64)))
        w = waiting.get(key)
        gap_h, fit_s = (0.0, np.zeros(0)) if w is None else _gap(t, free, w["w0"].to_numpy(), w["w1"].to_numpy(), w["gpus"].to_numpy())
        price = prices.get(key[2])
        pool_rows.append({**dict(zip(POOL, key)), "gpus": pool.height, "free_gpu_h": float(np.sum(free[:-1] * np.diff(t))) / 3.6e9,
                          "gap_gpu_h": gap_h, "gap_cost": None if price is None else gap_h * price,
                          "jobs_waited": 0 if w is None else w.height, "jobs_fit": int(np.count_nonzero(fit_s))})
        if w is not None:
            job_rows.append(w.with_columns(pl.col("pool_model").alias("model"), ((pl.col("w1") - pl.col("w0")) / 3.6e9).alias("waited_h"),
                                           pl.Series("fit_h", fit_s / 3.6e9)).filter(pl.col("fit_h") > 0))
    pools = pl.DataFrame(pool_rows, schema=POOL_SCHEMA).sort(["gap_gpu_h", *POOL], descending=[True, False, False, False])
    jobs = (pl.concat(job_rows) if job_rows else pl.DataFrame(schema={**JOB_SCHEMA, "fit_h": pl.Float64}))
    jobs = jobs.with_columns(fit_gpu_h=pl.col("fit_h") * pl.col("gpus").cast(pl.Float64)).select(list(JOB_SCHEMA)).cast(JOB_SCHEMA)
    picked = [pl.col(k).is_in(f.values(k)) for k in POOL_WIDE_FILTERS if getattr(f, k) is not None]
    if picked:  # (the gaps are everyone's; the filter picks whose waiting jobs are listed)
        jobs = jobs.filter(*picked)
    return QueueGaps(pools, jobs.sort(["fit_gpu_h", "job_key"], descending=[True, False]), not_counted, pool_filter_note(f))


def _free_gpus(gpus: pl.DataFrame, holds: pl.DataFrame) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Each pool's free GPUs as a step function, by pool key: times t (epoch us, ascending) and free[k] over
    [t[k], t[k + 1]) (the last 0): +1 over capacity [c0, c1), -1 over each holding (a GPU's holds clipped
    to its capacity and merged). Every pool at once, in arrays keyed by numbers."""
    cap = (gpus.select(*POOL, "gh", "c0", "c1").filter(pl.col("c1") > pl.col("c0"))
           .with_row_index("r").with_columns(pool=pl.struct(POOL).rank("dense").cast(pl.Int64) - 1))
    if cap.is_empty():
        return {}
    held = (cap.join(holds, on="gh")
            .select("r", pl.max_horizontal("h0", "c0").alias("a"), pl.min_horizontal("h1", "c1").alias("b"))
            .filter(pl.col("b") > pl.col("a")))
    r, a, b, reach = _ordered_reach(*(held[c].to_numpy().astype(np.int64) for c in ("r", "a", "b")))
    first = np.ones(len(r), dtype=bool)  # starts a holding: a GPU's first hold, or one past every earlier end
    first[1:] = (r[1:] != r[:-1]) | (a[1:] > reach[:-1])
    at = np.flatnonzero(first)
    pool_of = cap["pool"].to_numpy()
    c0, c1 = cap["c0"].to_numpy(), cap["c1"].to_numpy()
    # capacity: +1 from c0, -1 at c1; a holding: -1 from its start, +1 at its end
    pool = np.concatenate([pool_of, pool_of, pool_of[r[at]], pool_of[r[at]]])
    t = np.concatenate([c0, c1, a[at], np.maximum.reduceat(b, at) if len(at) else b[:0]])
    d = np.concatenate([np.ones(len(c0), np.int64), -np.ones(len(c0), np.int64), -np.ones(len(at), np.int64), np.ones(len(at), np.int64)])
    t0 = int(t.min())
    # by pool, then time: one key (ties in any order: only the level after all of a time's steps is kept)
    o = np.argsort(pool * (int(t.max()) - t0 + 1) + (t - t0))
    pool, t = pool[o], t[o]
    level = np.cumsum(d[o])  # each pool's steps sum to 0: one running sum serves all
    last = np.append((pool[1:] != pool[:-1]) | (t[1:] != t[:-1]), True)  # the level after all of a time's steps
    pool, t, level = pool[last], t[last], level[last]
    keys = cap.unique("pool").sort("pool").select(POOL).rows()
    cut = np.searchsorted(pool, np.arange(len(keys) + 1))
    return {key: (t[cut[i]:cut[i + 1]], level[cut[i]:cut[i + 1]]) for i, key in enumerate(keys)}


def _ordered_reach(r: np.ndarray, a: np.ndarray, b: np.ndarray, key_limit: int = 2 ** 62) -> tuple[np.ndarray, ...]:
    """Holds [a, b) of GPU rows r ordered by GPU, then start, with each one's reach: the latest end of its GPU's
    holds so far. One int64 key, GPU x width + time, sorts them and makes the per-GPU running maximum one
    running maximum; where it would pass `key_limit`, times are replaced by their ranks (same orders)."""
    if not len(r):
        return r, a, b, b
    t = None
    if (int(r.max()) + 1) * (int(b.max()) - int(a.min()) + 1) >= key_limit:
        t = distinct(np.concatenate([a, b]))
        a, b = np.searchsorted(t, a), np.searchsorted(t, b)
    t0, width = int(a.min()), int(b.max()) - int(a.min()) + 1
    o = np.argsort(r * width + (a - t0))
    r, a, b = r[o], a[o], b[o]
    reach = np.maximum.accumulate(r * width + (b - t0)) - r * width + t0
    return (r, a, b, reach) if t is None else (r, t[a], t[b], t[reach])


def _gap(t: np.ndarray, free: np.ndarray, w0: np.ndarray, w1: np.ndarray, need: np.ndarray) -> tuple[float, np.ndarray]:
    """The gap's GPU-hours (per stretch: min(free, the fitting jobs' GPUs) x its length) and each job's
    microseconds waiting while it fit. One pass per distinct GPU count requested (a handful), with running
    sums: jobs + stretches per count, never jobs x stretches."""
    edges = distinct(np.concatenate([t, w0, w1]))
    if len(edges) < 2:
        return 0.0, np.zeros(len(w0))
    level = np.where(edges >= t[0], free[np.clip(np.searchsorted(t, edges, side="right") - 1, 0, None)], 0)[:-1]
    dt = np.diff(edges).astype(np.float64)
    first, stop = np.searchsorted(edges, w0), np.searchsorted(edges, w1)
    fit_us, demand = np.zeros(len(w0)), np.zeros(len(dt))
    for v in distinct(need):
        mine = np.flatnonzero(need == v)
        fits = level >= v
        run = np.concatenate([[0.0], np.cumsum(np.where(fits, dt, 0.0))])  # whole microseconds: exact sums
        a, b = first[mine], np.maximum(stop[mine], first[mine])
        fit_us[mine] = run[b] - run[a]
        waiting = np.cumsum(np.bincount(a, minlength=len(dt) + 1) - np.bincount(b, minlength=len(dt) + 1))[:-1]
        demand += np.where(fits, waiting * float(v), 0.0)
    gap = float(np.sum(np.minimum(level, demand) * dt)) / 3.6e9
    return gap, fit_us
