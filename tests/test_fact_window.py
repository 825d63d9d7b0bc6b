"""A window's whole analysis from its hours' facts (analytics/fact_window.py) has its figures.

The Utilization page's figures summed from the facts (hour_facts.window_use), and everything the
dashboards' Bundle holds of a window of whole hours - headline totals with the
idle and no-process time and their cost, utilization by every dimension down to the job, waste
by account, user and job, the top wasteful jobs, the job list with its verdicts, per-job GPU
figures (memory high-water), MFU per job and account, the timelines - computed from the hours'
facts, the job list read from them alone (the Jobs page's), the Waste page's figures read from
them alone (the allocations with stretches) and MFU's (without the GPUs' figures), equals the raw path's (core.Analysis with every sample read: the oracle) to 1e-9 relative,
on the random fleets of test_analytics_properties (MIG slices, gaps, idle and no-process
stretches across hours, jobs across hours, several files per hour), however the hours were
grouped when their facts were built. A stretch's facts depend on the hours around it: a change
there renames them. A planted stretch one hour off fails the comparison.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_analytics_properties import SETTINGS, fleets
from test_analytics_golden import T
from tests.support.random_stores import mismatches
from test_hour_facts import BUILT, ONE_HOUR_BUCKETS, checked_windows, finder, golden, late_samples, random_fleet_facts, write_facts
from test_hour_facts import mismatches as use_mismatches
from test_hour_facts import use_figures

from gpufleet.analytics import fact_window, hour_facts
from gpufleet.analytics.core import JOB_DIMS, Analysis
from gpufleet.analytics.jobs import job_summaries, per_job_gpu
from gpufleet.analytics.mfu import MODEL_MISSING, account_mfu, job_mfu
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.timeline import TIMELINE_DIMS, utilization_timelines
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.times import HOUR
from tests.support.fleet import Fleet

DIMS = ("fleet", "cluster", "model", "host", "gpu", *JOB_DIMS)


def figures(a: Analysis) -> dict:
    """What the dashboards' Bundle shows of a window (dashboards/data.py window_bundle), but fairness
    (from the job table alone: the same code over the same table)."""
    mfu = job_mfu(a)
    out = {"totals": asdict(a.totals()), "per_gpu": a.per_gpu(), "top": a.top_wasteful_jobs(25), "per_job_gpu": per_job_gpu(a),
           "job_mfu": mfu, "account_mfu": account_mfu(a, mfu), "jobs": job_summaries(a)}
    out.update({f"waste[{by}, {kind}]": a.waste_by(by, kind) for by in ("account", "user_name", "job") for kind in ("idle", "no_process")})
    out.update({f"by_{by}": a.utilization(by) for by in DIMS})
    return out


def oracle(con, p: Params, now: datetime) -> tuple[dict, dict]:
    an = Analysis(con, p, now=now, raw=True, detail=True)
    try:
        return figures(an), utilization_timelines(an, TIMELINE_DIMS, HOUR)
    finally:
        an.con.close()


def compared(con, p: Params, now: datetime, facts: Path, waste: bool = True, use: bool = False) -> list[str]:
    """The oracle's figures against those from facts (which must answer the window): the whole
    analysis' (window_analysis), the job list alone (window_jobs), (`waste`) the Waste page's
    figures alone (window_waste), MFU's alone (mfu_window), and (`use`) the Utilization page's
    (hour_facts.window_use; its figures taken from the same oracle's analysis, not a second one)."""
    got = fact_window.window_analysis(con, p, now, finder(facts))
    jobs = fact_window.window_jobs(con, p, now, finder(facts))
    assert got is not None and jobs is not None, p
    fw, timelines = got
    try:
        want, want_tl = oracle(con, p, now)
        bad = mismatches(want, figures(fw)) + mismatches({"jobs (alone)": want["jobs"]}, {"jobs (alone)": jobs})
        if use:
            got_use = hour_facts.window_use(con, p, now, finder(facts))
            assert got_use is not None and got_use.hours == len(hour_facts.whole_hours(p))
            bad += use_mismatches(use_figures(want["totals"], {by: want[f"by_{by}"] for by in hour_facts.USE_DIMS}, want_tl), got_use)
        if waste:
            bad += waste_mismatches(want, fact_window.window_waste(con, p, now, finder(facts), 25), p)
        m = fact_window.mfu_window(con, p, now, finder(facts))
        assert m is not None, p
        try:
            got_mfu = job_mfu(m)
            bad += mismatches({"job_mfu (alone)": want["job_mfu"], "account_mfu (alone)": want["account_mfu"]},
                              {"job_mfu (alone)": got_mfu, "account_mfu (alone)": account_mfu(m, got_mfu)})
        finally:
            m.con.close()
        bad += mismatches({f"timeline[{by}]": x for by, x in want_tl.items()}, {f"timeline[{by}]": x for by, x in timelines.items()})
        return bad
    finally:
        fw.con.close()


def waste_mismatches(want: dict, got: fact_window.WindowWaste | None, p: Params) -> list[str]:
    """The oracle's totals, waste by account and user and top jobs against window_waste's."""
    assert got is not None, p
    return mismatches({"totals (waste)": want["totals"], "top (waste)": want["top"],
                       **{f"waste[{by}, {kind}] (waste)": want[f"waste[{by}, {kind}]"] for by, kind in got.waste}},
                      {"totals (waste)": asdict(got.totals), "top (waste)": got.top_jobs,
                       **{f"waste[{by}, {kind}] (waste)": x for (by, kind), x in got.waste.items()}})


def team_filters(con) -> list[Filters]:
    """An account's and a user's filter (of the first of the store's jobs that has them)."""
    account, user = con.execute("SELECT min(account), min(user_name) FROM jobs").fetchone()
    return [Filters(account=account), Filters(user_name=user)] if account and user else []


@SETTINGS
@given(fleets(), st.sampled_from([(1, False), (2, True)]), st.sampled_from(BUILT), st.sampled_from([0, 3000, 3570]))
def test_a_window_from_its_facts_has_the_raw_figures(fleet, how, built, offset_s):
    """`offset_s`: the fleet's time 0 that long after the hour, so its samples, gaps, idle runs and
    jobs cross hour edges; `built`: the facts built hour by hour, in one run, or rolled up too."""
    with random_fleet_facts(fleet, how, built, offset_s) as (con, p, now, facts):
        event(f"hours: {len(hour_facts.whole_hours(p))}")
        event(f"facts built {built}")
        event(f"roll-ups in the whole window: {sum(finder(facts).present_span(s) is not None for s in hour_facts.rollup_spans(p))}")
        for q in checked_windows(p):
            # the whole analysis' figures and the Utilization page's (hour_facts.window_use)
            bad = compared(con, q, now, facts, use=True)
            assert not bad, (q, "\n".join(bad))
        # the job list alone under a filter on the jobs (a team's, a user's: its rows of the fleet's list)
        for f in team_filters(con):
            q = replace(p, filters=f)
            an = Analysis(con, q, now=now, raw=True, detail=True)
            try:
                bad = mismatches({"jobs": job_summaries(an)}, {"jobs": fact_window.window_jobs(con, q, now, finder(facts))})
            finally:
                an.con.close()
            assert not bad, (f, "\n".join(bad))


def test_golden_hours_analysis_from_their_facts(tmp_path):
    """The golden scenario (MIG slices, shared GPUs, jobs across hours, an idle job): every figure
    of the Bundle, and the golden file's hand-worked idle stretches: 101's 45 min, 103's hour,
    104's 100 minutes from 09:00, 40 of them in the window - a stretch across an hour's edge -,
    pod p2's hour on a 3/7 MIG instance, the array's 45 and 30 minutes (the minimum counts)."""
    golden(tmp_path / "store")
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    with ONE_HOUR_BUCKETS:
        write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(13))])
        for lo, hi in ((T(10), T(12)), (T(9), T(13)), (T(11), T(12))):
            bad = compared(con, Params(lo, hi), T(20), tmp_path / "facts")
            assert not bad, (lo, hi, "\n".join(bad))
        fw, _ = fact_window.window_analysis(con, Params(T(10), T(12)), T(20), finder(tmp_path / "facts"))
        jobs = job_summaries(fw)
        fw.con.close()
        idle = dict(jobs.filter(pl.col("idle_gpu_h") > 0).select("job_id", "idle_gpu_h").iter_rows())
        assert idle == pytest.approx({"101": 0.75, "103": 1.0, "104": 40 / 60, "p2": 3 / 7, "200_1": 0.75, "200_2": 0.5})


def test_a_stretch_one_hour_off_fails_the_comparison(tmp_path):
    """The comparison can see a misplaced stretch: 10:00's idle GPU-seconds written as 11:00's
    (the window 11:00-12:00 then shows idle time its analysis does not have)."""
    golden(tmp_path / "store")
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    with ONE_HOUR_BUCKETS:
        files = write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(13))])
        ten, eleven = pl.read_parquet(files[T(10)]), pl.read_parquet(files[T(11)])
        moved = ten.filter((pl.col("kind") == "alloc") & (pl.col("idle_s") > 0)).with_columns(
            pl.lit(T(11)).alias("hour"), pl.lit(0.0).alias("data_s"), pl.lit(0.0).alias("busy_s"), pl.lit(0, dtype=pl.Int64).alias("pieces"))
        assert moved.height
        pl.concat([eleven, moved]).write_parquet(files[T(11)])
        p = Params(T(11), T(12))
        bad = compared(con, p, T(20), tmp_path / "facts", waste=False)
        assert any(b.startswith("totals.idle_allocated_gpu_h") for b in bad) and any(b.startswith("jobs:") for b in bad)
        assert any(b.startswith("jobs (alone)") for b in bad)
        # the Waste page's figures alone: stretches of jobs the window has not are seen (no figures:
        # the whole analysis' are shown), and those of its jobs are compared
        assert fact_window.window_waste(con, p, T(20), finder(tmp_path / "facts"), 25) is None
        in_window = moved.join(eleven.filter(pl.col("kind") == "alloc").select("jh").unique(), on="jh", how="semi")
        assert 0 < in_window.height < moved.height
        pl.concat([eleven, in_window]).write_parquet(files[T(11)])
        got = fact_window.window_waste(con, p, T(20), finder(tmp_path / "facts"), 25)
        assert any(b.startswith("totals (waste).idle_allocated_gpu_h") for b in waste_mismatches(oracle(con, p, T(20))[0], got, p))


def test_a_late_sample_renames_the_neighbouring_hours_facts(tmp_path):
    """Idle stretches are judged by their whole length, through the hours around: late samples
    for 10:00 rename the facts of 9:00 and 11:00 too (not 12:00's), and rebuilt they give the new
    figures."""
    golden(tmp_path / "store")
    facts = tmp_path / "facts"
    facts.mkdir()
    with ONE_HOUR_BUCKETS:
        con = open_reader(tmp_path / "store")
        before = hour_facts.current_keys(con, Params(T(9), T(13)), T(20))
        write_facts(con, Params(T(9), T(13)), T(20), facts, [(T(9), T(13))])
        late_samples(tmp_path / "store", util=0.0)
        con = open_reader(tmp_path / "store")
        after = hour_facts.current_keys(con, Params(T(9), T(13)), T(20))
        assert [h for h in before if before[h] != after[h]] == [T(9), T(10), T(11)]
        assert fact_window.window_analysis(con, Params(T(11), T(12)), T(20), finder(facts)) is None
        write_facts(con, Params(T(9), T(13)), T(20), facts, [(T(9), T(12))])
        assert not compared(con, Params(T(9), T(13)), T(20), facts)


def test_the_previous_window_s_totals_from_its_facts(tmp_path, monkeypatch):
    """The Waste page's comparison base (analytics/trends.py previous_totals): summed from the
    previous window's facts where they answer it - its analysis' totals, none computed - and
    computed where they do not."""
    from gpufleet.analytics import trends

    golden(tmp_path / "store")
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    with ONE_HOUR_BUCKETS:
        write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(13))])
        want = Analysis(con, Params(T(10), T(11)), now=T(20)).totals()
        with monkeypatch.context() as m:
            m.setattr(trends, "Analysis", None)  # (no analysis may be made)
            got = trends.previous_totals(con, Params(T(11), T(12)), now=T(20), facts=finder(tmp_path / "facts"))
        assert not mismatches({"totals": asdict(want)}, {"totals": asdict(got)})
        assert got.idle_allocated_gpu_h == pytest.approx(want.idle_allocated_gpu_h) and got.idle_allocated_gpu_h > 0
        # 08:00-09:00 has no facts: computed
        before = trends.previous_totals(con, Params(T(9), T(10)), now=T(20), facts=finder(tmp_path / "facts"))
        assert asdict(before) == asdict(Analysis(con, Params(T(8), T(9)), now=T(20)).totals())


def exporter_only(f: Fleet, job_key: str, gpus: list[tuple[str, str]], seen: tuple) -> None:
    """A job only the exporter saw (a pod the accounting lacks) on `gpus` (host, uuid), at `seen`."""
    for host, uuid in gpus:
        for t in seen:
            f._allocs.append(dict(ts=t, cluster="c1", scheduler="k8s", job_key=job_key, host=host, gpu_uuid=uuid,
                                  gpu_instance=-1, gpu=None, source="exporter"))


def store_with_facts(tmp_path, f: Fleet, *extra):
    """The fleet written, `extra` batches committed, compacted at 20:00, and the hour facts of
    09:00-13:00 built in two runs (call under ONE_HOUR_BUCKETS); the store's reader."""
    f.write()
    w = StoreWriter(tmp_path / "store")
    for batch in extra:
        w.commit(batch)
    compact(w, T(20))
    w.close()
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(11)), (T(11), T(13))])
    return con


def test_mfu_from_facts_names_every_job_it_held_and_counts_gpus_without_samples(tmp_path, monkeypatch):
    """MFU read from facts (mfu_window: by the job's hash, not the allocations table) has the
    analysis' rows where the allocations are least like the samples: a GPU held for hours it has
    no sample in (its held time still counts), a GPU the inventory has never seen (its model
    missing), a job the accounting lacks (named by its allocations), a GPU shared by two jobs, a
    job that only reports its throughput, and one whose accounting says 0 GPUs."""
    from test_analytics_mfu import report_batch

    f = Fleet(tmp_path / "store")
    f.gpu_series("n1", "GPU-A", T(9), T(13), util=90.0, tensor=0.4, sm_clock=1700)
    f.gpu_series("n1", "GPU-B", T(9), T(10), util=80.0, tensor=0.2, gpu=1)  # then silent, still held
    f.job("1", account="a", user="u", start=T(9, 10), end=T(12, 40), gpus=1, placements=[("n1", "GPU-A")])
    f.job("2", account="b", user="v", start=T(9, 30), end=T(12, 30), gpus=1, placements=[("n1", "GPU-B")])
    f.job("3", account="b", user="v", start=T(10), end=T(12), gpus=0, placements=[("n1", "GPU-B")])
    # a job only the exporter saw: on A beside job 1, and on a GPU never inventoried
    exporter_only(f, "ghost", [("n1", "GPU-A"), ("n2", "GPU-C")], (T(10, 5), T(11, 35)))
    with ONE_HOUR_BUCKETS:
        con = store_with_facts(tmp_path, f, report_batch("reports", "9", 4e14, 2, "flops", [T(10), T(11)]))
        for lo, hi in ((T(9), T(13)), (T(10), T(12)), (T(11), T(12))):
            p = Params(lo, hi)
            want, _ = oracle(con, p, T(20))
            m = fact_window.mfu_window(con, p, T(20), finder(tmp_path / "facts"))
            assert m is not None, p
            try:
                got = job_mfu(m)
                bad = mismatches({"job_mfu": want["job_mfu"], "account_mfu": want["account_mfu"]},
                                 {"job_mfu": got, "account_mfu": account_mfu(m, got)})
            finally:
                m.con.close()
            assert not bad, (p, "\n".join(bad))
            if hi - lo == 4 * HOUR:
                rows = {r["job_key"]: r for r in got.iter_rows(named=True)}
        # two of the window's jobs of one hash: no MFU from facts (the caller computes the analysis')
        monkeypatch.setattr(fact_window.sql, "JOB_HASH_CLASHES", "SELECT 1 AS n")
        assert fact_window.mfu_window(con, Params(T(9), T(13)), T(20), finder(tmp_path / "facts")) is None
    assert set(rows) == {"1", "2", "3", "ghost", "9"}
    assert rows["2"]["gpu_h"] == pytest.approx(3.0)  # (B silent from 10:00 on, held until 12:30)
    assert rows["ghost"]["job_id"] == "ghost" and rows["ghost"]["gpus"] == 2 and rows["ghost"]["reason"] == MODEL_MISSING
    assert rows["ghost"]["peak_tflops"] == pytest.approx(989.0 / 2)  # (its GPU C has no model, so no peak: half its GPU-time)
    assert rows["3"]["account"] == "b" and rows["3"]["gpus"] == 1 and "reports its throughput" in rows["9"]["reason"]


def test_waste_from_facts_names_a_job_the_accounting_lacks(tmp_path):
    """A pod only the exporter saw (no accounting row), idle on its GPU: the Waste page's figures
    from facts (window_waste) name it by its allocations, as the analysis does (its job id its
    key, no account or user), instead of giving up for the whole analysis."""
    f = Fleet(tmp_path / "store")
    f.gpu_series("n1", "GPU-A", T(9), T(13), util=0.0)
    f.gpu_series("n1", "GPU-B", T(9), T(13), util=0.0, gpu=1)
    f.job("1", account="a", user="u", start=T(9, 10), end=T(12, 40), gpus=1, placements=[("n1", "GPU-A")])
    exporter_only(f, "ghost", [("n1", "GPU-B")], (T(9, 20), T(12, 10)))
    with ONE_HOUR_BUCKETS:
        con = store_with_facts(tmp_path, f)
        for lo, hi in ((T(9), T(13)), (T(10), T(12))):
            p = Params(lo, hi)
            want, _ = oracle(con, p, T(20))
            got = fact_window.window_waste(con, p, T(20), finder(tmp_path / "facts"), 25)
            bad = waste_mismatches(want, got, p)
            assert not bad, (p, "\n".join(bad))
    top = {r["job_key"]: r for r in got.top_jobs.iter_rows(named=True)}
    assert top["ghost"]["job_id"] == "ghost" and top["ghost"]["account"] is None and top["1"]["account"] == "a"
