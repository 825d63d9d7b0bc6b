"""A relative dashboard window ("the last 24 h") ends where its reuse period starts.

Its figures are computed once per period (gpufleet.dashboards.data.step_for) and reused until the
period ends; ending the window at the period's start makes every session in the period see the
same figures and puts a window of a day or more - and its timeline's buckets - on the store's
5-minute summary grain, so the dashboards' analysis answers from the per-GPU summaries without
reading any bucket raw for the timeline's sake.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from test_analytics_golden import build_golden
from test_analytics_properties import frames_equal
from test_analytics_summaries import compare

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.summaries import SummaryTime
from gpufleet.analytics.timeline import utilization_timelines
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.dashboards import config as dconfig
from gpufleet.dashboards.data import Window, step_for

NOW = datetime(2026, 11, 16, 20, 7, 13, 250_000)


def window(preset: str) -> Window:
    return Window("/store", preset, None, None, Filters(), "fp", 0)


def test_a_relative_window_ends_where_its_reuse_period_starts():
    expect = {"1h": datetime(2026, 11, 16, 20, 7), "6h": datetime(2026, 11, 16, 20, 7), "24h": datetime(2026, 11, 16, 20, 5),
              "7d": datetime(2026, 11, 16, 20, 0), "30d": datetime(2026, 11, 16, 20, 0)}
    assert set(expect) == set(dconfig.WINDOWS)
    for preset, end in expect.items():
        r = window(preset).resolve(NOW)
        assert (r.start, r.end, r.as_of) == (end - dconfig.WINDOWS[preset], end, end), preset
        # later in the same period: the same window, so the same cached figures
        later = window(preset).resolve(end + step_for(dconfig.WINDOWS[preset]) - timedelta(microseconds=1))
        assert later.key == r.key, preset
    fixed = Window("/store", None, datetime(2026, 11, 16, 10, 0, 1), datetime(2026, 11, 16, 12, 0, 1), Filters(), "fp", None)
    r = fixed.resolve(NOW)
    assert (r.start, r.end) == (fixed.start, fixed.end)  # a window someone typed is taken as typed


def test_the_last_24h_and_its_timeline_answer_from_summaries(tmp_path):
    """The golden store compacted: the 24 h window as the dashboard resolves it needs no bucket
    read raw for its timeline; the same window to the second (as it was resolved before) looks up
    inside summarised buckets and builds the line again with those read raw. Same figures."""
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, NOW)
    w.close()
    con = open_reader(tmp_path)
    r = window("24h").resolve(NOW)
    p = Params(r.start, r.end)
    bad, _ = compare(con, p, r.as_of, detail=True)
    assert not bad, bad
    a = Analysis(con, p, now=r.as_of, detail=True)
    lines = utilization_timelines(a)
    assert isinstance(a.gt, SummaryTime) and a.gt.summary_buckets > 0 and a.gt._refined is None
    raw = Analysis(con, p, now=r.as_of, summaries=False)
    assert all(frames_equal(lines[by], t) for by, t in utilization_timelines(raw).items())
    to_the_second = Analysis(con, Params(NOW.replace(microsecond=0) - timedelta(hours=24), NOW.replace(microsecond=0)), now=NOW, detail=True)
    utilization_timelines(to_the_second)
    assert to_the_second.gt._refined is not None
