"""One job's per-GPU timeline (gpufleet.analytics.timeline.job_gpu_timeline) from the interval arrays gives
what its SQL definition gives, on random fleets.

The definition (reference_job_gpu_timeline, below: the implementation before the arrays) reads
the job's rows of the piece table PIECES (tests/support/oracle_sql.py: sample intervals
intersected with the job's allocations), clips them to the window, cuts them at bucket edges and
groups per bucket and GPU.
The fleets are test_analytics_properties' (gaps shorter and longer than max_gap, samples with no
utilization, jobs crossing the window edges, sharing GPUs, holding GPUs never sampled), with
memory readings (some missing) and MIG instances (several on one GPU) added; the windows are
the fleet's cuts, whole or narrowed to the job as the dashboard asks, with buckets from below
max_gap to a day. Timestamps are whole seconds: the definition computes in epoch seconds as
doubles, exact there (with milliseconds it rounds at ~1e-7 s, the arrays count microseconds).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import polars as pl
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_analytics_properties import (
    CLUSTER,
    H100,
    MAX_GAP,
    SETTINGS,
    at,
    build,
    fleets,
    frames_equal,
    scratch,
    uuid,
)

from gpufleet.analytics import jobs as ajobs
from gpufleet.analytics import timeline
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.sql import BUCKET_ORIGIN, bound, split_at_buckets
from gpufleet.analytics.timeline import default_bucket
from tests.support import oracle_sql
from tests.support.raw_analysis import RawAnalysis

A100 = "NVIDIA A100-SXM4-80GB"
TOL = dict(rel=1e-9, abs=1e-12)


# --- the definition: the SQL implementation job_gpu_timeline had before the arrays ---

def _short_split(src: str, a: str, b: str, cols: str) -> str:
    """Rows of `src` with [a, b) clipped to the window and split at bucket edges, for spans no
    longer than a bucket: the part in a's bucket and, if b crosses an edge, the part after it.
    Yields cols, k (bucket index), s (seconds in the bucket)."""
    return f"""
    WITH x AS (
        SELECT {cols}, epoch(greatest({a}, $start)) AS ea, epoch(least({b}, $end)) AS eb
        FROM {src} WHERE {b} > $start AND {a} < $end
    ), y AS (
        SELECT *, floor((ea - {BUCKET_ORIGIN}) / $bucket)::BIGINT AS k0, floor((eb - {BUCKET_ORIGIN}) / $bucket)::BIGINT AS k1 FROM x WHERE eb > ea
    )
    SELECT {cols}, k0 AS k, least(eb, {BUCKET_ORIGIN} + (k0 + 1) * $bucket) - ea AS s FROM y
    UNION ALL
    SELECT {cols}, k1 AS k, eb - ({BUCKET_ORIGIN} + k1 * $bucket) AS s FROM y WHERE k1 > k0 AND eb > {BUCKET_ORIGIN} + k1 * $bucket"""


def reference_job_gpu_timeline(a, cluster: str, scheduler: str, job_key: str, bucket: timedelta | None = None) -> pl.DataFrame:
    """The reference: job_gpu_timeline as SQL over the piece table pc (oracle_sql.PIECES), row by row."""
    p = a.p
    bucket = max(bucket or default_bucket(p.end - p.start), p.max_gap)
    origin = timeline.clock_origin(p.start, bucket)  # (buckets on the clock: the rule under test keeps only its origin)
    extra = {"bucket": bucket.total_seconds(), "origin": origin, "job_cluster": cluster, "job_scheduler": scheduler, "job_key": job_key}
    oracle_sql.build(a, "pc")
    src = "(SELECT * FROM pc WHERE cluster = $job_cluster AND scheduler = $job_scheduler AND job_key = $job_key)"
    split = _short_split if p.max_gap <= bucket else split_at_buckets
    query = f"""
        SELECT k, host, any_value(gpu) AS gpu, gpu_uuid, gi,
               sum(util * s * equiv) / nullif(sum(s * equiv) FILTER (WHERE util IS NOT NULL), 0) AS utilization_pct,
               max(fb_used_mib) AS fb_used_max_mib,
               sum(s * equiv) FILTER (WHERE util IS NOT NULL) / 3600 AS data_h
        FROM ({split(src, 'p0', 'p1', 'host, gpu, gpu_uuid, gi, util, fb_used_mib, equiv')})
        GROUP BY k, host, gpu_uuid, gi"""
    names = bound(query, {**a.bind, **extra})
    df = pl.from_arrow(a.con.sql(query, params=names).to_arrow_table())
    if df.is_empty():
        return pl.DataFrame(schema={"bucket": pl.Datetime("us"), "host": pl.Utf8, "gpu": pl.Int16, "gpu_uuid": pl.Utf8, "gi": pl.Int16,
                                    "utilization_pct": pl.Float64, "fb_used_max_mib": pl.Float64, "data_h": pl.Float64})
    return df.with_columns((pl.lit(origin) + pl.duration(seconds=pl.col("k") * bucket.total_seconds())).alias("bucket")).select(
        "bucket", "host", "gpu", "gpu_uuid", "gi", "utilization_pct", "fb_used_max_mib", "data_h").sort("host", "gpu", "gi", "bucket")


# --- random fleets with memory and MIG ---

MIG_PROFILES = [None, None, "3g.40gb", "1g.10gb"]
FB_MODES = ["none", "const", "varying", "gaps"]
BUCKETS = [None, 10, 30, 45, 60, 300, 3600, 86400]  # seconds; None: default_bucket(window); below max_gap: max_gap


def fb_of(mode: str, t: int) -> float | None:
    """Memory used at time t (values a FLOAT holds exactly, as the store keeps them)."""
    if mode == "const":
        return 40960.0
    if mode == "varying":
        return 1024.0 * ((t // 60) % 80) + 0.5
    if mode == "gaps":
        return None if (t // 45) % 3 == 0 else 512.0 * ((t // 30) % 50)
    return None


def placement(g: dict) -> dict:
    """Where GPU g is: a whole H100, or a MIG instance (gi = g + 1) of the one A100 "GPU-prop-mig"."""
    if g["mig"] is None:
        return dict(host=g["host"], gpu=g["gpu"], gpu_uuid=g["uuid"], gpu_instance=None, mig_profile=None, model=H100)
    return dict(host="hm", gpu=0, gpu_uuid="GPU-prop-mig", gpu_instance=g["gpu"] + 1, mig_profile=g["mig"], model=A100)


def build_store(root, fleet):
    """The fleet's store with memory readings and MIG instances (test_analytics_properties.build)."""
    return build(root, fleet, placement=placement, fields=lambda g, t: {"fb_used_mib": fb_of(g["fb"], t)})


@st.composite
def cases(draw):
    fleet = draw(fleets())
    for g in fleet["gpus"]:
        g["mig"] = draw(st.sampled_from(MIG_PROFILES))
        g["fb"] = draw(st.sampled_from(FB_MODES))
    return {"fleet": fleet, "bucket": draw(st.sampled_from(BUCKETS)), "window": draw(st.sampled_from(["whole", "left", "right"])),
            "narrowed": draw(st.booleans()), "twice": draw(st.booleans())}


def assert_same(got: pl.DataFrame, ref: pl.DataFrame) -> None:
    assert got.schema == ref.schema
    assert got.height == ref.height
    # the rows in the reference's order; ties in (host, gpu, gi, bucket) - two GPUs with one index
    # on one host - have no order there, and the arrays break them by gpu_uuid
    assert got.equals(got.sort("host", "gpu", "gi", "bucket", "gpu_uuid", nulls_last=False))
    ref = ref.sort("host", "gpu", "gi", "bucket", "gpu_uuid", nulls_last=False)
    for c, t in got.schema.items():
        x, y = got[c].to_list(), ref[c].to_list()
        if t.is_float():
            assert [v is None for v in x] == [v is None for v in y], c
            assert [v for v in x if v is not None] == pytest.approx([v for v in y if v is not None], **TOL), c
        else:
            assert x == y, c


def assert_same_report(got: ajobs.JobReport | None, ref: ajobs.JobReport | None) -> None:
    """Two reports of one job with the same figures (to TOL: sums taken along other lines)."""
    assert (got is None) == (ref is None)
    if got is None or ref is None:
        return
    for k, v in vars(ref).items():
        if isinstance(v, pl.DataFrame):
            assert frames_equal(getattr(got, k), v), k
        elif isinstance(v, dict):
            assert getattr(got, k).keys() == v.keys(), k
            for key, x in v.items():
                assert getattr(got, k)[key] == (pytest.approx(x, **TOL) if isinstance(x, float) else x), (k, key)
        elif k == "rule" and isinstance(v, str):
            # the same words, and numbers as far apart as their printed decimals: a mean printed to
            # 0.1 % rounds either way where the two sums (taken along other lines) straddle x.x5
            assert NUMBER.sub("#", got.rule) == NUMBER.sub("#", v), k
            assert all(abs(float(a) - float(b)) <= 0.1 + 1e-9 for a, b in zip(NUMBER.findall(got.rule), NUMBER.findall(v))), k
        else:
            assert getattr(got, k) == (pytest.approx(v, **TOL) if isinstance(v, float) else v), k


NUMBER = re.compile(r"\d+(?:\.\d+)?")


# A whole GPU with utilization and memory gaps, a MIG instance, a job crossing the window start that
# holds both, and one that also holds a GPU with no sample in its time (sampled once, before it).
EDGES = {
    "fleet": {
        "gpus": [{"gpu": 0, "host": "h0", "uuid": uuid(0), "mig": None, "fb": "gaps",
                  "samples": [(t, None if t % 90 == 0 else 40.0, 1.0) for t in range(0, 1200, 15)] + [(1300, 5.0, 1.0)]},
                 {"gpu": 1, "host": "h1", "uuid": uuid(1), "mig": "3g.40gb", "fb": "varying",
                  "samples": [(t, 70.0, 1.0) for t in range(30, 1500, 20)]},
                 {"gpu": 2, "host": "h0", "uuid": uuid(2), "mig": None, "fb": "const", "samples": [(0, 10.0, 1.0)]}],
        "jobs": [{"key": "100", "account": "alpha", "user": "u", "start": -200, "end": 1100, "seen_until": 1100, "gpus": 2, "held": [0, 1]},
                 {"key": "101", "account": "beta", "user": "u", "start": 100, "end": None, "seen_until": 1400, "gpus": 1, "held": [1, 2]}],
        "cuts": [50, 610, 1450], "now": 5000, "idle_min": 60,
    },
    "bucket": 60, "window": "whole", "narrowed": False, "twice": True,
}


@SETTINGS
@given(cases())
@example(EDGES)
def test_job_timeline_matches_the_sql_definition(case):
    fleet = case["fleet"]
    with scratch() as tmp:
        con = build_store(tmp, fleet)
        a, m, b = fleet["cuts"]
        lo, hi = {"whole": (a, b), "left": (a, m), "right": (m, b)}[case["window"]]
        bucket = None if case["bucket"] is None else timedelta(seconds=case["bucket"])
        base = Params(at(lo), at(hi), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]))
        shared = RawAnalysis(con, base, now=at(fleet["now"]))  # (its al is edited below: the raw arrays look it up again)
        if case["twice"]:
            # a job holding one GPU twice (two allocation rows): both implementations read al, so
            # a second row, shifted, must add its pieces to the same rows
            shared.con.execute("INSERT INTO al SELECT * REPLACE (a0 + INTERVAL 37 SECOND AS a0) FROM al")
            shared._allocation_use()
        for j in [*fleet["jobs"], {"key": "nope", "account": "alpha", "user": "u"}]:
            if case["narrowed"]:  # as the dashboard asks: the job's cluster, account and user
                f = Filters(cluster=CLUSTER, account=j["account"], user_name=j["user"], partition="gpu")
                an = RawAnalysis(con, replace(base, filters=f), now=at(fleet["now"]))
            else:
                an = shared
            got = timeline.job_gpu_timeline(an, CLUSTER, "slurm", j["key"], bucket)
            assert_same(got, reference_job_gpu_timeline(an, CLUSTER, "slurm", j["key"], bucket))
            if case["narrowed"]:
                # ... and as it reads it: from the facts, the timeline from the samples of the GPUs the selected jobs held only
                held = Analysis(con, replace(base, filters=f), now=at(fleet["now"]))
                assert_same(timeline.job_gpu_timeline(held, CLUSTER, "slurm", j["key"], bucket), got)
                assert_same_report(ajobs.job_report(held, j["key"]), ajobs.job_report(an, j["key"]))
                for k, v in vars(an.totals()).items():
                    assert getattr(held.totals(), k) == (pytest.approx(v, **TOL) if isinstance(v, float) else v), k
                # ... and narrowed to the job itself (the dashboard's job report): its GPUs only
                own = Analysis(con, replace(base, filters=replace(f, job_key=j["key"])), now=at(fleet["now"]))
                assert_same(timeline.job_gpu_timeline(own, CLUSTER, "slurm", j["key"], bucket), got)
                assert_same_report(ajobs.job_report(own, j["key"]), ajobs.job_report(an, j["key"]))
        assert timeline.job_gpu_timeline(shared, CLUSTER, "kubernetes", fleet["jobs"][0]["key"] if fleet["jobs"] else "x", bucket).is_empty()


def test_the_job_page_reads_the_report_arrays_once_and_no_piece_table():
    """(The raw path) job_report reads the detail arrays; the timeline then walks the same ones (no
    second read of the window, no pc table). Alone, it reads them itself."""
    fleet = EDGES["fleet"]
    with scratch() as tmp:
        con = build_store(tmp, fleet)
        p = Params(at(50), at(1450), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=60))
        a = RawAnalysis(con, p, now=at(5000))
        assert ajobs.job_report(a, "100") is not None
        gt = a.gt
        assert gt.fb is not None
        tl = timeline.job_gpu_timeline(a, CLUSTER, "slurm", "100", timedelta(minutes=5))
        assert a.gt is gt
        tables = oracle_sql.temp_tables(a)
        assert "pc" not in tables and "iv" not in tables
        assert set(tl["gpu_uuid"]) == {uuid(0), "GPU-prop-mig"}
        assert tl.filter(pl.col("gpu_uuid") == "GPU-prop-mig")["gi"].unique().to_list() == [2]

        alone = RawAnalysis(con, p, now=at(5000))
        assert alone.gt.fb is None
        assert timeline.job_gpu_timeline(alone, CLUSTER, "slurm", "nope").is_empty() and alone.gt.fb is None  # nothing to read
        assert timeline.job_gpu_timeline(alone, CLUSTER, "slurm", "100", timedelta(minutes=5)).equals(tl)
        assert alone.gt.fb is not None and not {"iv", "pc"} & oracle_sql.temp_tables(alone)

        # the dashboard's job page reads the detail columns at once (detail=True): the arrays it
        # walks are the same intervals, so every figure is the same, and it never reads twice
        upfront = RawAnalysis(con, p, now=at(5000), detail=True)
        gt = upfront.gt
        assert gt.fb is not None
        r1, r2 = ajobs.job_report(upfront, "100"), ajobs.job_report(alone, "100")
        frames = ("per_gpu", "idle_stretches")
        assert {k: v for k, v in vars(r1).items() if k not in frames} == {k: v for k, v in vars(r2).items() if k not in frames}
        assert all(getattr(r1, k).equals(getattr(r2, k)) for k in frames) and not r1.per_gpu.is_empty()
        assert timeline.job_gpu_timeline(upfront, CLUSTER, "slurm", "100", timedelta(minutes=5)).equals(tl)
        assert upfront.totals() == alone.totals() and upfront.per_gpu().equals(alone.per_gpu())
        assert upfront.gt is gt
        # from the facts: the same timeline (the job's parts summed, to rounding), and no raw arrays read for it
        fa = Analysis(con, p, now=at(5000))
        assert_same(timeline.job_gpu_timeline(fa, CLUSTER, "slurm", "100", timedelta(minutes=5)), tl)
        assert not hasattr(fa, "gt")


def test_allocation_detail_is_the_same_in_chunks_of_any_size(monkeypatch):
    """GpuTime.allocation_detail sums the allocations' slices a chunk at a time: a chunk of 3
    intervals (allocations split across many steps, one slice longer than a chunk) gives the
    same figures as one step."""
    import tests.support.gputime as gputime

    def fields(g, t):  # memory as elsewhere here; tensor activity with gaps, SM clock on some GPUs only
        return {"fb_used_mib": fb_of(g["fb"], t), "tensor_active": None if (t // 40) % 4 == 0 else ((t // 20) % 9) / 10,
                "sm_clock_mhz": 1980.0 if g["gpu"] % 2 == 0 else None}

    fleet = EDGES["fleet"]
    with scratch() as tmp:
        con = build(tmp, fleet, placement=placement, fields=fields)
        p = Params(at(50), at(1450), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=60))
        whole = RawAnalysis(con, p, now=at(5000), detail=True).allocation_detail()
        monkeypatch.setattr(gputime, "_PIECES_CHUNK", 3)
        chunked = RawAnalysis(con, p, now=at(5000), detail=True).allocation_detail()
    assert whole["pieces"].sum() > 3 and whole["fb_max"].is_not_null().any()
    assert whole["tclock"].is_not_null().any() and whole["tnoclock"].fill_null(0).gt(0).any()  # both tensor paths taken
    assert chunked.equals(whole)
