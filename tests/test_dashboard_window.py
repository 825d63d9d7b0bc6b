"""A relative dashboard window ("the last 24 h") starts on the store's 5-minute summary grain,
or on the hour when its timeline's buckets are whole hours.

Its figures are computed at the first ask in a reuse period (gpufleet.dashboards.data.step_for)
and reused until the period ends; the window ends at that moment (the open hour: read raw
anyway) and starts at the summary bucket edge (or hour) at or before "length ago", so its
timeline's bucket edges fall on summary edges and the dashboards' analysis answers them from the
per-GPU summaries, reading no bucket raw for the timeline's sake - and, where they fall on hour
edges, each closed hour inside from its joined segments.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from test_analytics_golden import build_golden
from test_analytics_properties import frames_equal
from test_analytics_summaries import compare

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.summaries import SummaryTime
from gpufleet.analytics.timeline import default_bucket, utilization_timelines
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.dashboards import config as dconfig
from gpufleet.dashboards.data import Window

NOW = datetime(2026, 11, 16, 20, 7, 13, 250_000)


def window(preset: str) -> Window:
    return Window("/store", preset, None, None, Filters(), "fp", 0)


def test_a_relative_window_starts_on_the_summary_grain_and_ends_now():
    for preset, length in dconfig.WINDOWS.items():
        r = window(preset).resolve(NOW)
        now = NOW.replace(microsecond=0)
        assert (r.end, r.as_of) == (now, now), preset
        # every preset is whole 5-minute steps long, so (20:07:13 - length) floored to 5 min = 20:05 - length;
        # those whose timeline buckets are whole hours (24 h and longer: 1, 3 and 12 h) start on the hour
        hourly = length >= timedelta(hours=24)
        assert r.start == datetime(2026, 11, 16, 20, 0 if hourly else 5) - length, preset
        assert r.start.minute % 5 == 0 and (r.start.minute == 0 or not hourly), preset
        assert default_bucket(r.length) == default_bucket(length), preset  # its timeline keeps the preset's bucket
    fixed = Window("/store", None, datetime(2026, 11, 16, 10, 0, 1), datetime(2026, 11, 16, 12, 0, 1), Filters(), "fp", None)
    r = fixed.resolve(NOW)
    assert (r.start, r.end) == (fixed.start, fixed.end)  # a window someone typed is taken as typed


def test_the_last_24h_and_its_timeline_answer_from_summaries(tmp_path):
    """The golden store compacted: the 24 h window as the dashboard resolves it needs no bucket
    read raw for its timeline; the same window starting to the second (as it was resolved before)
    looks up inside summarised buckets and builds the line again with those read raw. Same figures."""
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
    # the window starts on the hour and its timeline's edges are hours: its closed hours with
    # joined segments (those of the golden day, but the window's last) are read from them
    assert r.start.minute == 0 and a.gt.coarse_hours > 0, (r.start, a.gt.coarse_hours)
    raw = Analysis(con, p, now=r.as_of, raw=True)
    assert all(frames_equal(lines[by], t) for by, t in utilization_timelines(raw).items())
    to_the_second = Analysis(con, Params(r.end - timedelta(hours=24), r.end), now=NOW, detail=True)
    utilization_timelines(to_the_second)
    assert to_the_second.gt._refined is not None
