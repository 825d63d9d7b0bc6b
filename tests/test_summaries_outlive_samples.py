"""Summaries kept after their raw samples are retired ([collector.retention] summary_days).

Retention retires sample files older than raw_days; with summary_days longer, the summaries of
their hours stay (marked raw_retired) and stand for those hours alone, as a long-term store's
downsampled data does. A window whose edges fall on bucket edges then gets the figures it had
while the samples were there (the idle stretches' starts and ends before and after the window,
which the analysis looks for inside a reach that does not fall on a bucket edge, aside); a window
cut inside a bucket has no data for that part, and every figure still adds up. Upkeep neither
drops nor rebuilds such a summary (it could not: the samples are gone) until summary_days pass;
with summary_days no longer than raw_days the summaries go with their samples, as before.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_analytics_golden import A100, T, build_golden
from test_analytics_properties import MAX_GAP, SETTINGS, TOL, at, fleets, scratch
from test_analytics_summaries import figures, mismatches, params, split

from gpufleet.analytics.cli import build_report
from gpufleet.analytics.core import Analysis, summary_only_edges
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.summaries import SummaryTime
from gpufleet.collector.maintenance import apply_retention, compact
from gpufleet.collector.store import StoreWriter, open_reader, summary_backlog
from gpufleet.collector.summaries import SummaryParams

# columns of an idle stretch that lie outside the window: found inside the analysis' reach
OUTSIDE = ("s0", "s1")


def _inside(fig: dict) -> dict:
    """The figures, the idle stretches' starts and ends (outside the window, see OUTSIDE) left out."""
    return {k: (v.drop(OUTSIDE) if k in ("idle", "no_process") else v) for k, v in fig.items()}


def _retire_raw(root, now, summary_days: int, p: SummaryParams | None = None) -> StoreWriter:
    """Retention at `now` with raw_days = 1, then an upkeep pass, as the collector runs them."""
    w = StoreWriter(root, clock=lambda: now)
    apply_retention(w, now, raw_days=1, summary_days=summary_days)
    compact(w, now, p)
    return w


def _manifest(root) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _adds_up(t: dict) -> None:
    assert t["data_gpu_h"] + t["no_data_gpu_h"] == pytest.approx(t["capacity_gpu_h"], **TOL)
    assert t["busy_gpu_h"] <= t["data_gpu_h"] + 1e-9
    assert t["idle_allocated_gpu_h"] <= t["allocated_gpu_h"] + 1e-9


def test_hours_kept_as_summaries_give_their_figures_without_samples(tmp_path):
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    windows = [(T(10), T(12)), (T(10, 20), T(12)), (T(9), T(13))]
    filters = (Filters(), Filters(account="biology"), Filters(model=A100))
    con = open_reader(tmp_path)
    before = {(lo, hi, f): figures(Analysis(con, Params(lo, hi, filters=f), now=T(20))) for lo, hi in windows for f in filters}
    cut = Params(T(10, 2, 30), T(11, 57, 1))  # edges inside buckets
    before_cut = figures(Analysis(con, cut, now=T(20)))
    hours = con.execute("SELECT count(*) FROM summary_hours").fetchone()[0]
    assert summary_only_edges(con, cut.start, cut.end) == []  # (the samples are there)
    con.close()

    later = T(20) + timedelta(days=3)
    _retire_raw(tmp_path, later, summary_days=90).close()
    m = _manifest(tmp_path)
    assert m["samples"] == [] and len(m["summaries"]) == hours and all(e["raw_retired"] for e in m["summaries"])
    assert summary_backlog(m["summaries"])["summaries_only"] == hours
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM summary_hours").fetchone()[0] == hours
    raw = Analysis(con, Params(T(10), T(12)), now=T(20), summaries=False).totals()
    assert raw.data_gpu_h == 0 and raw.allocated_gpu_h > 0  # no sample left: the figures below are the summaries'
    for (lo, hi, f), want in before.items():
        got = figures(Analysis(con, Params(lo, hi, filters=f), now=T(20)))
        assert not mismatches(_inside(want), _inside(got)), (lo, hi, f)
    # a window cut inside buckets: those parts have no data, and the figures add up
    got = figures(Analysis(con, cut, now=T(20)))["totals"]
    want = before_cut["totals"]
    assert got["capacity_gpu_h"] == pytest.approx(want["capacity_gpu_h"], **TOL)
    assert got["allocated_gpu_h"] == pytest.approx(want["allocated_gpu_h"], **TOL)
    assert got["data_gpu_h"] < want["data_gpu_h"] and got["no_data_gpu_h"] > want["no_data_gpu_h"]
    _adds_up(got)
    # ... and says so, naming the edges (gpufleet analyze's warnings; the dashboards' for a typed window)
    said = summary_only_edges(con, cut.start, cut.end)
    assert [w[:19] for w in said] == ["2026-11-16T10:02:30", "2026-11-16T11:57:01"] and "has no data" in said[0]
    assert summary_only_edges(con, T(10), T(12)) == []  # edges on the grid get every figure
    assert build_report(con, cut, "account", 5, None, now=T(20))["warnings"] == said
    con.close()

    # another idle threshold: nothing can rebuild those hours - they stay, and the new threshold's
    # analysis has no data for them (never the old threshold's figures)
    other = SummaryParams(idle_threshold=20.0)
    w = _retire_raw(tmp_path, later + timedelta(hours=1), summary_days=90, p=other)
    w.close()
    assert [e["file"] for e in _manifest(tmp_path)["summaries"]] == [e["file"] for e in m["summaries"]]
    con = open_reader(tmp_path)
    t = Analysis(con, Params(T(10), T(12), idle_threshold=20.0), now=T(20)).totals()
    assert t.data_gpu_h == 0 and t.allocated_gpu_h == raw.allocated_gpu_h
    con.close()

    # summary_days later they go; the window is then all no data, and says so
    _retire_raw(tmp_path, T(14, 1) + timedelta(days=90), summary_days=90).close()
    assert _manifest(tmp_path)["summaries"] == []
    con = open_reader(tmp_path)
    t = Analysis(con, Params(T(10), T(12)), now=T(20)).totals()
    assert t.data_gpu_h == 0 and t.no_data_gpu_h == pytest.approx(t.capacity_gpu_h, **TOL)


def test_without_summary_days_the_summaries_go_with_their_samples(tmp_path):
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    _retire_raw(tmp_path, T(20) + timedelta(days=3), summary_days=0).close()
    assert _manifest(tmp_path)["summaries"] == []


def test_a_late_batch_for_an_hour_kept_as_a_summary_leaves_it(tmp_path):
    """Samples that old are the next retention pass's to retire; the summary, which nothing could
    rebuild, stays listed meanwhile (and after a restart)."""
    f = build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    later = T(20) + timedelta(days=3)
    _retire_raw(tmp_path, later, summary_days=90).close()
    kept = _manifest(tmp_path)["summaries"]
    w = StoreWriter(tmp_path, clock=lambda: later)
    w.commit(f.batch("late"))  # the same samples again under another key: late data for those hours
    w.publish()
    w.close()
    w = StoreWriter(tmp_path, clock=lambda: later)  # a restart checks the summaries against the sample files
    compact(w, later)
    w.close()
    assert [e["file"] for e in _manifest(tmp_path)["summaries"]] == [e["file"] for e in kept]


@SETTINGS
@given(fleets(), st.sampled_from([60, 300]))
def test_figures_of_hours_kept_as_summaries_add_up_and_keep_their_whole_buckets(fleet, bucket_s):
    """Random fleets (MIG, gaps, jobs across buckets): after the samples are retired, a window on
    bucket edges keeps its figures; any window's figures add up, with no more data than before."""
    a, m, b = fleet["cuts"]
    every_hour = fleet["now"] + 2 * 3600
    p = SummaryParams(max_gap_s=MAX_GAP, bucket_s=bucket_s, keep_s=30)  # (inner idle runs down to 30 s: any idle_min)
    aligned = (a // bucket_s * bucket_s, -(-b // bucket_s) * bucket_s)
    with scratch() as tmp:
        w = StoreWriter(tmp)
        for batch in split(fleet, 1, False):
            w.commit(batch)
        compact(w, at(every_hour), p)
        w.close()
        con = open_reader(tmp)
        now = at(fleet["now"])
        before, took_summaries = {}, {}
        for win in ((a, b), (a, m), aligned):
            an = Analysis(con, params(fleet, *win), now=now)
            before[win], took_summaries[win] = figures(an), isinstance(an.gt, SummaryTime)
        con.close()
        _retire_raw(tmp, at(every_hour) + timedelta(days=2), 90, p).close()
        assert _manifest(Path(tmp))["samples"] == []
        con = open_reader(tmp)
        for win, want in before.items():
            got = figures(Analysis(con, params(fleet, *win), now=now))
            t, w0 = got["totals"], want["totals"]
            _adds_up(t)
            assert t["capacity_gpu_h"] == pytest.approx(w0["capacity_gpu_h"], **TOL)
            assert t["allocated_gpu_h"] == pytest.approx(w0["allocated_gpu_h"], **TOL)
            assert t["data_gpu_h"] <= w0["data_gpu_h"] + 1e-9 and t["busy_gpu_h"] <= w0["busy_gpu_h"] + 1e-9
            by_account = got["by_account"]
            assert by_account["allocated_gpu_h"].sum() == pytest.approx(t["allocated_gpu_h"], **TOL)
            if win == aligned:
                event(f"the window on bucket edges read from summaries: {took_summaries[win]}")
            if win == aligned and took_summaries[win]:  # (else read raw: no hour summarised where the window reads)
                assert not mismatches(_inside(want), _inside(got)), win
        con.close()


def test_summary_days_is_a_collector_retention_setting():
    from gpufleet.collector import config
    from gpufleet.config import ConfigError

    assert config.load({}, None)["retention"]["summary_days"] == 90
    assert config.load({"collector": {"retention": {"summary_days": 0}}}, None)["retention"]["summary_days"] == 0
    with pytest.raises(ConfigError, match=r"summary_days = -1: expected an integer >= 0"):
        config.load({"collector": {"retention": {"summary_days": -1}}}, "c.toml")
