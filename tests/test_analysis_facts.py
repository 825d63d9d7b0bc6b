"""core.Analysis from the facts equals RawAnalysis (tests/support/raw_analysis.py), the raw oracle, figure for figure.

On test_analytics_properties' random fleets (MIG slices, gaps, each GPU's samples over several
files, allocations starting and ending mid-bucket, running jobs), over stores whose upkeep wrote
facts at a random time (some hours and days have them; the rest is cut from raw samples) and
stores with none, for windows on the bucket grids and cut mid-bucket, under every filter
(cluster, model, account, user, partition, job): totals, per_gpu, utilization by every dimension,
waste_by (idle and no process), top_wasteful_jobs, allocation_detail's sums and the timelines
equal the raw path's to 1e-9. A fact moved one bucket later fails the comparison.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_analytics_properties import TOL, at, fleets, frames_equal, scratch
from test_analytics_golden import T, build_golden
from test_facts import A100, DAY, FACT_SETTINGS, params, store

from gpufleet.analytics.core import GPU_DIMS, JOB_DIMS, Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.timeline import TIMELINE_DIMS, utilization_timeline, utilization_timelines
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.raw_analysis import RawAnalysis

GPU_KEY = ["cluster", "host", "gpu_uuid", "gi"]
ALLOCATION_KEY = ["cluster", "scheduler", "job_key", *GPU_KEY[1:]]
DETAIL_SUMS = ("data_s", "busy_s", "has_piece", "has_util", "fb_max", "any_s", "tensor_s", "clocked_s", "tclock", "tw_clocked", "tnoclock")


def keyed(df: pl.DataFrame, keys: list[str], cols) -> dict:
    """{(keys..., col): value} of the rows, values summed over repeated keys (null kept as None
    where every repeat is null); zeros dropped, so a row of nothing equals no row."""
    out: dict = {}
    for row in df.select(*keys, *cols).iter_rows(named=True):
        k = tuple(row[c] for c in keys)
        for c in cols:
            v = row[c]
            v = float(v) if isinstance(v, (bool, int, float)) else v
            prev = out.get((*k, c))
            out[(*k, c)] = v if prev is None else (prev if v is None else prev + v)
    return {k: v for k, v in out.items() if v is not None and not (isinstance(v, float) and abs(v) < 1e-12)}


def figures(a: Analysis) -> dict:
    out = {"totals": {k: v for k, v in asdict(a.totals()).items()}}
    # (under a job filter the raw path's per-GPU held time is the selected jobs' only, so its
    # "stranded" there is the time those jobs did not hold; the facts' is the time nobody held -
    # the word's meaning - and neither is a figure of the filter: compared without one)
    held = () if a.job_filtered else ("allocated_data_gpu_h", "stranded_gpu_h")
    out["per_gpu"] = keyed(a.per_gpu(), GPU_KEY, ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", *held))
    for by, keys in {**GPU_DIMS, **JOB_DIMS}.items():
        u = a.utilization(by)
        cols = [c for c in ("capacity_gpu_h", "allocated_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "stranded_gpu_h") if c in u.columns]
        out[f"utilization.{by}"] = keyed(u, list(keys), cols)
    for kind in ("idle", "no_process"):
        for by in ("account", "job"):
            out[f"waste.{kind}.{by}"] = keyed(a.waste_by(by, kind), list(JOB_DIMS[by]), ("gpu_h", "cost", "gpus"))
    top = a.top_wasteful_jobs(50)
    out["top"] = keyed(top, ["cluster", "scheduler", "job_key"], [c for c in ("idle_gpu_h", "idle_gpus", "idle_cost", "runtime_h") if c in top.columns])
    out["detail"] = keyed(a.allocation_detail(), ALLOCATION_KEY, DETAIL_SUMS)
    for by, t in utilization_timelines(a, TIMELINE_DIMS).items():
        keys = ["bucket", *[k for k in t.columns if k in ("cluster", "model", "partition", "account", "user_name")]]
        out[f"timeline.{by}"] = keyed(t, keys, ("capacity_gpu_h", "allocated_gpu_h", "held_data_gpu_h", "data_gpu_h", "busy_gpu_h",
                                                 "no_data_gpu_h"))
    return out


def mismatches(want: dict, got: dict) -> list[str]:
    bad = []
    for name, w in want.items():
        g = got[name]
        for k in set(w) | set(g):
            a, b = w.get(k), g.get(k)
            if isinstance(a, (tuple, str)) or isinstance(b, (tuple, str)):
                if a != b:
                    bad.append(f"{name}[{k}]: raw {a} facts {b}")
            elif (a is None) != (b is None) and not (a in (None, 0.0) and b in (None, 0.0)) or (
                    a is not None and b is not None and b != pytest.approx(a, **TOL)):
                bad.append(f"{name}[{k}]: raw {a} facts {b}")
    return bad


def compare(con, p, now, timeline: bool = True) -> tuple[list[str], Analysis]:
    fa = Analysis(con, p, now=now, timeline=timeline)
    return mismatches(figures(RawAnalysis(con, p, now=now, detail=True)), figures(fa)), fa


def windows(fleet, data) -> list[tuple[int, int]]:
    a, m, b = fleet["cuts"]
    hour = data.draw(st.integers(0, 2), label="hour")
    return [(a, b), (a, m), (hour * 3600, (hour + 1) * 3600), (-DAY, 2 * DAY),
            (data.draw(st.integers(-600, 7200), label="lo"), data.draw(st.integers(7200, 3 * DAY), label="hi"))]


def every_filter(fleet) -> list[Filters]:
    job = fleet["jobs"][0]["key"] if fleet["jobs"] else "x"
    return [Filters(), Filters(cluster="prop"), Filters(model=A100), Filters(account="alpha"), Filters(user_name="u"),
            Filters(partition="gpu"), Filters(job_key=job), Filters(job_key=tuple(j["key"] for j in fleet["jobs"][:3]) or ("x", "y"))]


@settings(FACT_SETTINGS, max_examples=12)
@given(fleets(), st.sampled_from([(1, False), (2, True), (3, False)]), st.data())
def test_analysis_from_facts_equals_the_raw_oracle(fleet, how, data):
    upkeep_at = data.draw(st.sampled_from([None, 2 * DAY]) | st.integers(3600, 4 * 3600), label="upkeep_at")
    now = at(max(fleet["now"], (upkeep_at or 0) + 1))
    event(f"stored facts: {upkeep_at is not None}")
    with scratch() as tmp:
        store(tmp, fleet, how, upkeep_at)
        con = open_reader(tmp)
        for i, (lo, hi) in enumerate(windows(fleet, data)):
            for f in every_filter(fleet) if i == 0 else [Filters(), data.draw(st.sampled_from(every_filter(fleet)), label="filter")]:
                # (timeline=False: the coarsest tiling, as gpufleet analyze reads; its timelines then read the parts again)
                bad, fa = compare(con, params(fleet, lo, hi, filters=f), now, timeline=data.draw(st.booleans(), label="timeline"))
                assert not bad, (lo, hi, f, fa.fw.tiles, "\n".join(bad[:20]))
                for g in fa.fw.tiles:
                    event(f"buckets of {g} s read from facts")


def test_a_fact_one_bucket_off_fails_the_comparison(tmp_path):
    fleet = {"gpus": [{"gpu": 0, "host": "h0", "uuid": "GPU-prop-0", "samples": [(t, 50.0 if t < 1800 else 0.0, 1.0) for t in range(0, 3600, 15)]}],
             "jobs": [{"key": "1", "account": "alpha", "user": "u", "start": 600, "end": 3000, "seen_until": 3000, "gpus": 1, "held": [0]}],
             "cuts": [0, 1800, 3600], "now": 2 * DAY, "idle_min": 300}
    store(tmp_path, fleet, (2, True), 2 * DAY)
    p = params(fleet, 0, 3300)
    con = open_reader(tmp_path)
    bad, fa = compare(con, p, at(fleet["now"]))
    assert fa.fw.tiles and fa.fw.raw_us == 0 and not bad, bad
    con.close()
    for f in Path(tmp_path).rglob("facts/**/*.parquet"):  # every part one 5-minute bucket later
        t = pq.read_table(f)
        shift = 300_000_000
        for c in ("p0", "p1"):
            t = t.set_column(t.schema.get_field_index(c), c, pc.add(t[c], shift))
        t = t.set_column(t.schema.get_field_index("bucket"), "bucket",
                         pa.array(t["bucket"].cast(pa.int64()).to_numpy() + shift, pa.int64()).cast(pa.timestamp("us")))
        pq.write_table(t, f)
    bad, _ = compare(open_reader(tmp_path), p, at(fleet["now"]))
    assert bad


def test_an_analysis_that_draws_no_timeline_reads_day_facts_where_a_page_reads_hours(tmp_path):
    """An analysis asked for its timeline's cuts (timeline=True: a job's page) cuts its parts at
    that timeline's buckets (hour facts for a day's window); by default (gpufleet analyze, the
    pages' window figures) it reads the coarsest tiling: the day's one fact, the same figures."""
    fleet = {"gpus": [{"gpu": 0, "host": "h0", "uuid": "GPU-prop-0", "samples": [(t, 50.0 if t < 1800 else 0.0, 1.0) for t in range(0, 3600, 15)]}],
             "jobs": [{"key": "1", "account": "alpha", "user": "u", "start": 600, "end": 3000, "seen_until": 3000, "gpus": 1, "held": [0]}],
             "cuts": [0, 1800, 3600], "now": 2 * DAY, "idle_min": 300}
    store(tmp_path, fleet, (2, True), 2 * DAY)
    con = open_reader(tmp_path)
    p = params(fleet, 0, DAY)
    page, cli = Analysis(con, p, now=at(fleet["now"]), timeline=True), Analysis(con, p, now=at(fleet["now"]))
    assert page.fw.tiles.get(3600) == 24 and 86400 not in page.fw.tiles, page.fw.tiles
    assert cli.fw.tiles.get(86400) == 1 and 3600 not in cli.fw.tiles, cli.fw.tiles
    assert not mismatches(figures(page), figures(cli))


def test_the_golden_scenario_from_its_facts(tmp_path):
    """The golden store with its facts (upkeep at 20:00): windows on the hour, cut to the second and
    over the day so far, under a filter, give the raw path's figures, whole buckets read from facts."""
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20), facts_hours=None)
    w.close()
    con = open_reader(tmp_path)
    for p in (Params(T(10), T(12)), Params(T(9, 17, 3), T(11, 59, 59)), Params(T(10), T(12), filters=Filters(account="biology")),
              Params(T(0), T(20))):
        bad, fa = compare(con, p, T(20))
        assert not bad, (p.start, p.end, "\n".join(bad[:20]))
    # (the day is open at 20:00: no day file yet; its hours are read from their own files' hour parts)
    assert fa.fw.tiles.get(3600, 0) > 0 and 86400 not in fa.fw.tiles, fa.fw.tiles


def test_hours_written_before_their_files_held_hour_parts_are_read_as_5_minute_parts(tmp_path):
    """A store whose hours' files predate their hour parts (no hour_parts in their manifest
    entries) needs no rebuild: its open day is read as 5-minute parts, the same figures."""
    import json

    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20), facts_hours=None)
    w.close()
    manifest = Path(tmp_path) / "manifest.json"
    doc = json.loads(manifest.read_text())
    assert all(e.pop("hour_parts") for e in doc["facts"] if e["grain"] == "5m")
    manifest.write_text(json.dumps(doc))
    con = open_reader(tmp_path)
    bad, fa = compare(con, Params(T(0), T(20)), T(20))
    assert not bad, "\n".join(bad[:20])
    assert fa.fw.tiles.get(300, 0) > 0 and 3600 not in fa.fw.tiles, fa.fw.tiles


def test_a_timeline_bucket_that_cuts_the_parts_reads_them_again_cut_at_its_edges(tmp_path):
    """An analysis' parts are cut at its own timeline's bucket edges (15 min here); a bucket that
    would cut them (7 min) gets the window's parts again, cut at its edges: the raw figures."""
    build_golden(tmp_path)
    con = open_reader(tmp_path)
    p = Params(T(10, 1), T(12))
    a, raw = Analysis(con, p, now=T(20)), RawAnalysis(con, p, now=T(20))
    for bucket in (timedelta(minutes=30), timedelta(minutes=7), timedelta(minutes=5)):
        want = utilization_timeline(raw, "account", bucket)
        assert frames_equal(want, utilization_timeline(a, "account", bucket)), bucket
