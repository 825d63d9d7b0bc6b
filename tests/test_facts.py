"""Facts (collector/facts.py, analytics/facts.py) give the raw path's figures, at every grain.

On the random fleets of test_analytics_properties (MIG slices, gaps, each GPU's samples over
several files, allocations starting and ending mid-bucket, running jobs), a store whose upkeep
wrote facts at a random time (some hours and days have them, the rest are cut from raw samples)
gives, for windows on the 5-minute, hour and day grid and off it, under each filter, the raw
path's totals, utilization by job dimension and idle / no-process hours by account
(RawAnalysis(...), itself held to the row-by-row SQL) to 1e-9, and Fleet now's states
(its runs from the parts' run marks) equal to those from raw samples alone. Also: joining parts
in any grouping gives the same parts (associativity); a fact one bucket off fails the comparison;
upkeep run twice writes nothing; a late sample or a late-learnt allocation rebuilds exactly its
hour and that hour's day.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st
from test_analytics_properties import MAX_GAP, SETTINGS, TOL, at, fleets, scratch
from tests.support.random_stores import split

from gpufleet.analytics import fleet_now as fn
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.facts import FactWindow
from gpufleet.analytics.params import Filters, Params
from gpufleet.collector import facts as cf
from gpufleet.collector.maintenance import build_facts, compact
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.times import epoch_us
from tests.support.raw_analysis import RawAnalysis

A100 = "NVIDIA A100-SXM4-80GB"
DAY = 86400
NOTHING = {"hours": 0, "days": 0, "hours_left": 0, "days_left": 0, "open_hours": 0}  # build_facts' counts when it writes nothing
FACT_SETTINGS = settings(SETTINGS, max_examples=30, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])  # (no shrinking: minutes per failure)


def params(fleet, a: int, b: int, **kw) -> Params:
    return Params(at(a), at(b), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]), **kw)


def upkeep_params(fleet) -> cf.FactParams:
    return cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=fleet["idle_min"])


def store(root, fleet, how=(2, True), upkeep_at: int | None = None):
    """The fleet's store (its samples over files as `how` splits them), upkeep run at `upkeep_at`
    (seconds from BASE; None: none); its writer closed."""
    w = StoreWriter(root)
    for batch in split(fleet, *how):
        w.commit(batch)
    if upkeep_at is not None:
        compact(w, at(upkeep_at), upkeep_params(fleet), facts_hours=None)
    w.publish()
    w.close()


def oracle(con, p: Params, now) -> dict:
    an = RawAnalysis(con, p, now=now)
    t = asdict(an.totals())
    out = {f"totals.{k}": t[k] for k in ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "utilization_pct",
                                         "allocated_gpu_h", "idle_allocated_gpu_h", "no_process_gpu_h", "stranded_gpu_h")}
    for by in ("account", "user_name", "job"):
        u = an.utilization(by)
        for c in ("allocated_gpu_h", "data_gpu_h", "busy_gpu_h", "no_data_gpu_h"):
            out[f"{by}.{c}"] = _keyed(u, by, c)
    for kind, name in (("idle", "idle"), ("no_process", "nop")):
        w = an.waste_by("account", kind)
        out[f"waste.{name}"] = _keyed(w, "account", "gpu_h")
    return out


def from_facts(con, p: Params, now) -> tuple[dict, FactWindow]:
    fw = FactWindow(con, p, now=now)
    out = {f"totals.{k}": v for k, v in fw.totals().items()}
    for by in ("account", "user_name", "job"):
        u = fw.utilization(by)
        for c in ("allocated_gpu_h", "data_gpu_h", "busy_gpu_h", "no_data_gpu_h"):
            out[f"{by}.{c}"] = _keyed(u, by, c)
    for kind in ("idle", "nop"):
        out[f"waste.{kind}"] = _keyed(fw.waste_by("account", kind), "account", "gpu_h")
    return out, fw


def _keyed(df, by: str, col: str) -> dict:
    keys = {"account": ["cluster", "account"], "user_name": ["cluster", "user_name"],
            "job": ["cluster", "scheduler", "job_key"]}[by]
    out: dict = {}
    for row in df.select(*keys, col).iter_rows():
        out[row[:-1]] = out.get(row[:-1], 0.0) + (row[-1] or 0.0)
    return {k: v for k, v in out.items() if v != 0.0}


def mismatches(want: dict, got: dict) -> list[str]:
    bad = []
    for k, v in want.items():
        w = got[k]
        if isinstance(v, dict):
            for kk in set(v) | set(w):
                if w.get(kk, 0.0) != pytest.approx(v.get(kk, 0.0), **TOL):
                    bad.append(f"{k}[{kk}]: raw {v.get(kk)} facts {w.get(kk)}")
        elif (v is None) != (w is None) or (v is not None and w != pytest.approx(v, **TOL)):
            bad.append(f"{k}: raw {v} facts {w}")
    return bad


def windows(fleet, data) -> list[tuple[int, int]]:
    a, m, b = fleet["cuts"]
    hour = data.draw(st.integers(0, 2), label="hour")
    return [(a, b), (a, m), (m, b), (hour * 3600, (hour + 1) * 3600), (-DAY, 2 * DAY),
            (data.draw(st.integers(-600, 7200), label="lo") // 300 * 300, data.draw(st.integers(7200, 3 * DAY), label="hi") // 300 * 300)]


@settings(FACT_SETTINGS, max_examples=15)
@given(fleets(), st.sampled_from([(1, False), (2, True), (3, False)]), st.data())
def test_facts_give_the_raw_figures_at_every_grain_and_filter(fleet, how, data):
    # upkeep at a random time: hours (and the day) settled by then have facts, the rest is cut raw
    upkeep_at = data.draw(st.sampled_from([None, 2 * DAY, 2 * DAY]) | st.integers(3600, 4 * 3600), label="upkeep_at")
    now = at(max(fleet["now"], (upkeep_at or 0) + 1))
    with scratch() as tmp:
        store(tmp, fleet, how, upkeep_at)
        con = open_reader(tmp)
        filters = [Filters(), Filters(account="alpha"), Filters(model=A100),
                   Filters(job_key=fleet["jobs"][0]["key"] if fleet["jobs"] else "x"), Filters(cluster="prop"),
                   Filters(job_key=tuple(j["key"] for j in fleet["jobs"][1:3]) or ("x", "y"))]
        for lo, hi in windows(fleet, data):
            for f in filters if (lo, hi) == tuple(fleet["cuts"][::2]) else filters[:1]:
                p = params(fleet, lo, hi, filters=f)
                got, fw = from_facts(con, p, now)
                bad = mismatches(oracle(con, p, now), got)
                assert not bad, (lo, hi, f, fw.tiles, "\n".join(bad))
                for g, n in fw.tiles.items():
                    event(f"buckets of {g} s read from facts")
        # Fleet now's runs from the parts' run marks: the same states as from raw samples alone
        # (an idle_min_duration the facts were not built for: Fleet now does not use it, so every
        # bucket is read raw)
        p = params(fleet, 0, 1)
        raw_only = replace(p, idle_min_duration=p.idle_min_duration + timedelta(seconds=1))
        for as_of in (fleet["cuts"][1], fleet["now"]):
            for lookback in (timedelta(hours=1), timedelta(days=3)):
                got, want = (fn.gpu_states(con, q, at(as_of), lookback=lookback) for q in (p, raw_only))
                assert got.equals(want), (as_of, lookback, got, want)


def fact_store(tmp, fleet):
    store(tmp, fleet, (2, True), 2 * DAY)
    return open_reader(tmp)


def five_minute_parts(root) -> pa.Table:
    """The 5-minute parts of the store's hours' files (which hold their hour parts too)."""
    files = sorted(Path(root).rglob("facts/5m/**/*.parquet"))
    if not files:
        return cf.SCHEMA.empty_table()
    t = pa.concat_tables([pq.read_table(f) for f in files]).drop(["tag"]).cast(cf.SCHEMA)
    return t.filter(pc.equal(t["grain_s"], cf.GRAIN_5M))


def rows(t: pa.Table) -> list[tuple]:
    d = t.to_pydict()
    out = []
    for r in zip(*d.values()):
        out.append(tuple(round(x, 6) if isinstance(x, float) else x for x in r))
    return sorted(out, key=repr)


@FACT_SETTINGS
@given(fleets(), st.sampled_from([600, 900, 1200, 1800]))
def test_joining_parts_in_any_grouping_gives_the_same_parts(fleet, mid):
    with scratch() as tmp:
        fact_store(tmp, fleet)
        fine = five_minute_parts(tmp)
        fp = cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=fleet["idle_min"])
        direct = cf.join_parts(fine, cf.GRAIN_1H, fp)
        assert rows(cf.join_parts(cf.join_parts(fine, mid, fp), cf.GRAIN_1H, fp)) == rows(direct)
        day = cf.join_parts(direct, cf.GRAIN_1D, fp)
        assert rows(cf.join_parts(fine, cf.GRAIN_1D, fp)) == rows(day)
        # the joined rows keep every sum
        for c in ("covered_s", "data_s", "busy_s", "nop_s"):
            assert pc.sum(day[c]).as_py() == pytest.approx(pc.sum(fine[c]).as_py(), **TOL) if fine.num_rows else True


@FACT_SETTINGS
@given(fleets(), st.lists(st.integers(1, 3600 * 1_000_000 - 1), max_size=6, unique=True))
def test_parts_cut_at_extra_edges_are_the_parts_of_each_span_alone(fleet, offsets):
    """build_parts over an hour cut at extra times (a timeline's bucket edges off the grid, what
    FactWindow._raw asks for) gives, row for row, the parts of each span between the cuts built
    alone from its own samples (those from max_gap before it on)."""
    with scratch() as tmp:
        con = fact_store(tmp, fleet)
        fp = upkeep_params(fleet)
        lo = epoch_us(at(0))
        lo, hi = lo - lo % cf.HOUR_US, lo - lo % cf.HOUR_US + cf.HOUR_US
        samples = con.sql(cf.samples_query("gpu_samples"), params={"lo": lo, "hi": hi, "gap_us": fp.gap_us}).to_arrow_table()
        hold = cf.holds(con, lo, hi, fp)
        cuts = sorted(lo + o for o in offsets)
        edges = [lo, *cuts, hi]
        alone = []
        for a, b in zip(edges[:-1], edges[1:]):
            own = samples.filter(pc.and_(pc.greater_equal(samples["ts"], a - fp.gap_us), pc.less(samples["ts"], b)))
            if own.num_rows:
                alone.append(cf.build_parts(own, hold, a, b, fp))
        together = cf.build_parts(samples, hold, lo, hi, fp, cuts_us=cuts)
        assert rows(together) == rows(pa.concat_tables(alone) if alone else cf.SCHEMA.empty_table())
        event(f"cuts: {len(cuts)}, parts: {together.num_rows}")
        con.close()


def test_a_fact_one_bucket_off_fails_the_comparison(tmp_path):
    fleet = {"gpus": [{"gpu": 0, "host": "h0", "uuid": "GPU-prop-0", "samples": [(t, 50.0 if t < 1800 else 0.0, 1.0) for t in range(0, 3600, 15)]}],
             "jobs": [{"key": "1", "account": "alpha", "user": "u", "start": 600, "end": 3000, "seen_until": 3000, "gpus": 1, "held": [0]}],
             "cuts": [0, 1800, 3600], "now": 2 * DAY, "idle_min": 300}
    con = fact_store(tmp_path, fleet)
    p = params(fleet, 0, 3300)
    got, fw = from_facts(con, p, at(fleet["now"]))
    assert fw.tiles.get(cf.GRAIN_5M) and fw.raw_us == 0 or fw.tiles
    assert not mismatches(oracle(con, p, at(fleet["now"])), got)
    con.close()
    # move every 5-minute part one bucket later (and the day's facts with them): the figures differ
    for f in Path(tmp_path).rglob("facts/**/*.parquet"):
        t = pq.read_table(f)
        shift = 300_000_000
        t = t.set_column(t.schema.get_field_index("p0"), "p0", pc.add(t["p0"], shift))
        t = t.set_column(t.schema.get_field_index("p1"), "p1", pc.add(t["p1"], shift))
        t = t.set_column(t.schema.get_field_index("bucket"), "bucket",
                         pa.array(t["bucket"].cast(pa.int64()).to_numpy() + shift, pa.int64()).cast(pa.timestamp("us")))
        pq.write_table(t, f)
    con = open_reader(tmp_path)
    got, _ = from_facts(con, p, at(fleet["now"]))
    assert mismatches(oracle(con, p, at(fleet["now"])), got)


def _snapshot(root) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in Path(root).rglob("facts/**/*.parquet")}


@settings(FACT_SETTINGS, max_examples=15)
@given(fleets())
def test_upkeep_run_twice_writes_no_new_byte(fleet):
    with scratch() as tmp:
        store(tmp, fleet, (2, True), 2 * DAY)
        before = _snapshot(tmp)
        listed = json.loads((Path(tmp) / "manifest.json").read_text())["facts"]
        w = StoreWriter(tmp)
        assert build_facts(w, epoch_us(at(2 * DAY)), cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=fleet["idle_min"])) == NOTHING
        w.publish()
        w.close()
        assert _snapshot(tmp) == before
        assert json.loads((Path(tmp) / "manifest.json").read_text())["facts"] == listed


def test_late_data_rebuilds_exactly_its_hour_and_day(tmp_path):
    from test_analytics_properties import batches

    fleet = {"gpus": [{"gpu": g, "host": "h0", "uuid": f"GPU-prop-{g}", "samples": [(t, 30.0, 1.0) for t in range(0, 3 * 3600, 15)]}
                      for g in range(2)],
             "jobs": [{"key": "1", "account": "alpha", "user": "u", "start": 600, "end": 9000, "seen_until": 9000, "gpus": 1, "held": [0]}],
             "cuts": [0, 1800, 3600], "now": 2 * DAY, "idle_min": 300}
    fp = cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=300)
    store(tmp_path, fleet, (1, False), 2 * DAY)
    w = StoreWriter(tmp_path)
    # (the last sample, 15 s before the third hour ends, holds into the fourth)
    assert len([k for k in w.facts if k.startswith("5m/")]) == 4 and len([k for k in w.facts if k.startswith("day/")]) == 1
    # a late sample in the second hour: that hour and its day, nothing else
    late = {"gpus": [{"gpu": 1, "host": "h0", "uuid": "GPU-prop-1", "samples": [(3600 + 7, 99.0, 1.0)]}], "jobs": []}
    sample = batches(late)[0]
    before = dict(w.facts)
    w.commit(type(sample)(key="late", samples=sample.samples, gpus=sample.gpus))
    # readers no longer see the facts it touches (unlisted at the next publish) ...
    assert set(before) - set(w.facts) == {"5m/" + at(3600).isoformat(), "day/" + at(0).isoformat()[:10]}
    # ... until upkeep writes them again
    assert build_facts(w, epoch_us(at(2 * DAY)), fp) == {**NOTHING, "hours": 1, "days": 1}
    changed = {k for k in w.facts if w.facts[k] != before[k]}
    assert changed == {"5m/" + at(3600).isoformat(), "day/" + at(0).isoformat()[:10]}
    # an allocation learnt late, ending in the third hour: that hour (the others' edges are unchanged) and the day
    jobs = batches({"gpus": fleet["gpus"], "jobs": [{"key": "2", "account": "beta", "user": "v", "start": 7300, "end": 7400, "seen_until": 7400,
                                          "gpus": 1, "held": [1]}]})[-1]
    w.commit(type(jobs)(key="late-jobs", jobs=jobs.jobs, allocations=jobs.allocations))
    before = dict(w.facts)
    assert build_facts(w, epoch_us(at(2 * DAY)), fp) == {**NOTHING, "hours": 1, "days": 1}
    assert {k for k in w.facts if w.facts[k] != before[k]} == {"5m/" + at(7200).isoformat(), "day/" + at(0).isoformat()[:10]}
    w.publish()
    w.close()
    con = open_reader(tmp_path)
    p = params(fleet, 0, 3 * 3600)
    got, fw = from_facts(con, p, at(fleet["now"]))
    assert fw.raw_us == 0 and fw.tiles
    assert not mismatches(oracle(con, p, at(fleet["now"])), got)


