"""The array path (tests/support/gputime.py, the raw oracle) gives what the SQL definitions give, on random fleets.

Analysis computes per-GPU figures, per-job data/busy time and idle stretches from sample arrays
and look-ups; the per-sample SQL (tests/support/oracle_sql.py: INTERVALS, PIECES, ISLANDS)
states the same rules row by row. Both run here on the random fleets of test_analytics_properties, with each GPU's samples
split over several files, some interleaved in time (the arrays then need a full sort).
"""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_analytics_properties import (
    MAX_GAP,
    SETTINGS,
    TOL,
    at,
    batches,
    fleets,
    frames_equal,
    scratch,
)

from gpufleet.analytics import sql
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support import oracle_sql

REF_PER_GPU = f"""
WITH u AS (
    SELECT cluster, host, gpu_uuid, gi,
           sum({sql.clip_seconds("t0", "t1")} * equiv) FILTER (WHERE util IS NOT NULL) AS data_s,
           sum(util / 100 * {sql.clip_seconds("t0", "t1")} * equiv) AS busy_s
    FROM iv GROUP BY ALL
), a AS (
    SELECT iv.cluster, iv.host, iv.gpu_uuid, iv.gi,
           sum({sql.clip_seconds("greatest(iv.t0, held.a0)", "least(iv.t1, held.a1)")} * iv.equiv) FILTER (WHERE iv.util IS NOT NULL) AS alloc_data_s
    FROM iv JOIN ({oracle_sql.HELD}) held
      ON iv.cluster = held.cluster AND iv.host = held.host AND iv.gpu_uuid = held.gpu_uuid AND iv.gi = held.gi
     AND iv.t1 > held.a0 AND iv.t0 < held.a1
    GROUP BY ALL
)
SELECT cap.gpu_uuid, coalesce(u.data_s, 0) / 3600 AS data_gpu_h, coalesce(u.busy_s, 0) / 3600 AS busy_gpu_h,
       least(coalesce(u.data_s, 0), coalesce(a.alloc_data_s, 0)) / 3600 AS allocated_data_gpu_h
FROM cap LEFT JOIN u USING (cluster, host, gpu_uuid, gi) LEFT JOIN a USING (cluster, host, gpu_uuid, gi)
ORDER BY cap.gpu_uuid
"""
REF_JOB_USE = f"""
SELECT job_key, coalesce(sum({sql.clip_seconds("p0", "p1")} * equiv) FILTER (WHERE util IS NOT NULL), 0) / 3600 AS data_gpu_h,
       coalesce(sum(util / 100 * {sql.clip_seconds("p0", "p1")} * equiv), 0) / 3600 AS busy_gpu_h
FROM pc WHERE p1 > $start AND p0 < $end GROUP BY job_key ORDER BY job_key
"""


def split_batches(fleet, parts: int, interleave: bool):
    """The fleet's batches with each GPU's samples cut into `parts` files: consecutive slices, or every parts-th sample."""
    out = []
    for b in batches(fleet):
        if b.samples is None or b.samples.num_rows < parts:
            out.append(b)
            continue
        n = b.samples.num_rows
        for k in range(parts):
            idx = list(range(k, n, parts)) if interleave else list(range(k * n // parts, (k + 1) * n // parts))
            out.append(type(b)(key=f"{b.key}/{k}", samples=b.samples.take(pa.array(idx, pa.int64())), gpus=b.gpus))
    return out


@SETTINGS
@given(fleets(), st.sampled_from([(1, False), (3, False), (2, True)]))
def test_arrays_match_the_sql_definitions(fleet, split):
    with scratch() as tmp:
        w = StoreWriter(tmp)
        for b in split_batches(fleet, *split):
            w.commit(b)
        w.publish()
        w.close()
        con = open_reader(tmp)
        a, _, b = fleet["cuts"]
        p = Params(at(a), at(b), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]))
        an = Analysis(con, p, now=at(fleet["now"]))

        oracle_sql.build(an, "iv", "pc")
        got = an.per_gpu().sort("gpu_uuid")
        ref = an.q(REF_PER_GPU)
        for c in ("data_gpu_h", "busy_gpu_h", "allocated_data_gpu_h"):
            assert got[c].to_list() == pytest.approx(ref[c].to_list(), **TOL), c

        jobs = an.utilization("job")
        ref = an.q(REF_JOB_USE)
        used = {r["job_key"]: r for r in jobs.filter(jobs["job_key"].is_in(ref["job_key"].implode())).to_dicts()}
        for r in ref.to_dicts():
            assert used[r["job_key"]]["data_gpu_h"] == pytest.approx(r["data_gpu_h"], **TOL)
            assert used[r["job_key"]]["busy_gpu_h"] == pytest.approx(r["busy_gpu_h"], **TOL)

        for kind, pred in (("idle", oracle_sql.IDLE_PRED), ("no_process", oracle_sql.NO_PROCESS_PRED)):
            got = an.idle_stretches(kind).drop("gpu_h", "usd_per_gpu_hour", "cost")
            ref = an.q(f"SELECT * EXCLUDE (island) FROM ({oracle_sql.islands(pred)}) WHERE in_window_s > 0")
            assert frames_equal(got.select(ref.columns), ref.cast(got.select(ref.columns).schema)), kind


@SETTINGS
@given(st.lists(st.floats(1e5, 1e7), min_size=1, max_size=300), st.lists(st.floats(1e-6, 1.0), min_size=2, max_size=30),
       st.integers(0, 300), st.data())
def test_look_ups_round_at_the_gpus_scale_not_the_fleets(big, small, where, data):
    """A nearly idle GPU's seconds among GPUs of a week's seconds: a look-up on it is exact to the
    GPU's own scale (the sums start again with each GPU; one sum over the fleet rounded them at the
    fleet's total, ~1e-7 s a week at 4,096 GPUs)."""
    from tests.support.gputime import GpuTime, per_gpu_cumsum

    where = min(where, len(big))
    gt = GpuTime.__new__(GpuTime)
    gt.base, gt.span, step = 0, 10**13, 1_000_000
    per_gpu = [[x] for x in big[:where]] + [small] + [[x] for x in big[where:]]
    t0 = np.concatenate([g * gt.span + np.arange(len(xs)) * step for g, xs in enumerate(per_gpu)]).astype(np.int64)
    gt.t0, gt.t1 = t0, t0 + step
    sec = np.array([x for xs in per_gpu for x in xs])
    gt.cdata, gt.cbusy = per_gpu_cumsum(gt.t0, gt.span, sec, sec / 2)
    i = data.draw(st.integers(0, len(small) - 1))
    j = data.draw(st.integers(i + 1, len(small)))
    got, half = gt.integrals(np.array([where]), np.array([i * step]), np.array([j * step]))
    scale = 1e-12 * math.fsum(small)
    assert got[0] == pytest.approx(math.fsum(small[i:j]), rel=0, abs=scale)
    assert half[0] == pytest.approx(math.fsum(small[i:j]) / 2, rel=0, abs=scale)
    # before a GPU's first interval, and a GPU with none, hold no seconds
    assert gt.integrals(np.array([where, len(per_gpu)]), np.array([-step, 0]), np.array([0, step]))[0].tolist() == [0.0, 0.0]
