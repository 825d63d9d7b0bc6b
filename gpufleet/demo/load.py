"""What each simulated device is doing at a time, as polars expressions.

One definition serves both halves of the demo: history.py evaluates it over a week of
(time x device) rows, live.py over one row per device every few seconds and hands the result to
the simulated exporters through their control files. So the live fleet continues exactly where
the backfilled week left off.

Input columns: `t` (epoch seconds), `slot` (an integer per device), `prof` (fleet.PROFILE_CODE
of the job holding the device, null when none), `s0` (the job's start, epoch seconds), `a`, `b`,
`c`, `off` (the profile's shape, fleet._params) and `seed`. Output: `util` (0-100), `procs`,
`tensor` (0-1), `fb_mib` (framebuffer the job's processes hold), and what the profiling fields
show: `sm_active` (0-1), `pcie_rx` and `nvlink` (RX + TX) in bytes/s.

Profiles: train (busy ~90 % with checkpoint dips every `a` s for a fraction `b`), stalled (like
train until `c` s in, then 0 % with the process still there: a hung collective), held (no
process at all), notebook (a process, nearly always 0 %), inference (`a` + `b` x a daily cycle
peaking at hour `c`), dev (bursts: busy a fraction `b` of every `a` s), idle (unallocated).
The training jobs that lose time one way each (fleet.PATTERNS) are train with: loading (0 % with
the process there for its first LOAD_S), starved (SM active 18 % under 11 GB/s of PCIe RX while
"busy"), allreduce (NVLink traffic with tensor activity near 0), straggler (the job's GPU of
slot % 8 == 3 at 60 % of the others' utilization), checkpoint (params: every 30 min, 90 s).
"""

from __future__ import annotations

import math

import polars as pl

from gpufleet.demo.fleet import PROFILE_CODE, STEP_S

P = PROFILE_CODE


def _noise(seed: int) -> pl.Expr:
    """Uniform [0, 1) per (device, scrape): the same on replay and live, no RNG state."""
    key = pl.col("slot").cast(pl.Int64) * 1_000_000_007 + pl.col("t") // STEP_S
    return (key.hash(seed) % 1_000_003).cast(pl.Float64) / 1_000_003


LOAD_S = 20 * 60  # the `loading` profile's model load
TRAINING = [P[p] for p in ("train", "loading", "starved", "allreduce", "straggler", "checkpoint")]


def columns() -> dict[str, pl.Expr]:
    """util, procs, tensor, fb_mib, sm_active, pcie_rx, nvlink as expressions over the input columns."""
    prof = pl.col("prof").fill_null(P["idle"])
    rel = (pl.col("t") - pl.col("s0")).cast(pl.Float64)
    u1, u2, u3 = _noise(1), _noise(2), _noise(3)
    phase = ((rel + pl.col("off")) % pl.col("a")) / pl.col("a")
    busy = (90 + 9 * (u1 + u2 - 1)).round().clip(0, 100)
    hour = (pl.col("t") % 86400).cast(pl.Float64) / 3600
    daily = 0.5 + 0.5 * ((hour - pl.col("c")) * (2 * math.pi / 24)).cos()
    lagging = (prof == P["straggler"]) & (pl.col("slot") % 8 == 3)
    util = (
        pl.when((prof == P["loading"]) & (rel < LOAD_S)).then(0.0)
        .when(lagging).then(pl.when(phase >= pl.col("b")).then((busy * 0.6).round()).otherwise(0.0))
        .when(prof.is_in(TRAINING)).then(pl.when(phase >= pl.col("b")).then(busy).otherwise(0.0))
        .when(prof == P["stalled"]).then(pl.when((rel < pl.col("c")) & (phase >= pl.col("b"))).then(busy).otherwise(0.0))
        .when(prof == P["notebook"]).then(pl.when(u3 > 0.997).then((10 + 30 * u1).round()).otherwise(0.0))
        .when(prof == P["inference"]).then((pl.col("a") + pl.col("b") * daily + 10 * (u1 - 0.5)).round().clip(0, 100))
        .when(prof == P["dev"]).then(pl.when(phase < pl.col("b")).then((35 + 65 * u1).round()).otherwise(0.0))
        .otherwise(0.0)
    )
    no_process = prof.is_in([P["idle"], P["held"]])
    tensor_share = (
        pl.when(prof == P["allreduce"]).then(0.03 + 0.02 * u3)
        .when(prof.is_in(TRAINING + [P["stalled"]])).then(0.42 + 0.12 * u3)
        .when(prof == P["inference"]).then(0.15 + 0.05 * u3)
        .otherwise(0.08 * u3)
    )
    fb = (
        pl.when(no_process).then(0.0)
        .when(prof.is_in(TRAINING + [P["stalled"]])).then(70_000.0)
        .when(prof == P["inference"]).then(34_000.0)
        .when(prof == P["notebook"]).then(7_000.0)
        .otherwise(16_000.0)
        + pl.when(no_process).then(0.0).otherwise((500 * u2).round())
    )
    load = util / 100
    working = util > 0
    return {
        "util": util,
        "procs": pl.when(no_process).then(0).otherwise(1).cast(pl.Int32),
        "tensor": (util / 100 * tensor_share).round(4),
        "fb_mib": fb,
        "sm_active": (pl.when(working & (prof == P["starved"])).then(0.18).when(working & (prof == P["allreduce"])).then(0.35)
                      .otherwise(0.9 * load)).round(4),
        "pcie_rx": pl.when(working & (prof == P["starved"])).then(11e9 + 1e9 * u2).otherwise(2e8 * load).round(),
        "nvlink": pl.when(working & (prof == P["allreduce"])).then(2.0e11 + 2e10 * u1)
                    .when(prof.is_in(TRAINING)).then(3e9 * load).otherwise(0.0).round(),
    }


def evaluate(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with util, procs, tensor and fb_mib added."""
    return frame.with_columns(**columns())
