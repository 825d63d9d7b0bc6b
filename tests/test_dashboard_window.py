"""A relative dashboard window ("the last 24 h") starts on the store's 5-minute facts grain,
or on the hour when its timeline's buckets are whole hours.

Its figures are computed at the first ask in a reuse period (gpufleet.dashboards.data.step_for)
and reused until the period ends; the window ends at that moment (the open hour: read raw
anyway) and starts at the facts' bucket edge (or hour) at or before "length ago", so its
timeline's bucket edges fall on the facts' and the dashboards' analysis answers them from the
facts, reading no minute raw for the timeline's sake.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from test_analytics_golden import build_golden
from test_analytics_properties import frames_equal

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.timeline import default_bucket, utilization_timelines
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.dashboards import config as dconfig
from gpufleet.dashboards.data import Window
from tests.support.raw_analysis import RawAnalysis

NOW = datetime(2026, 11, 16, 20, 7, 13, 250_000)


def window(preset: str) -> Window:
    return Window("/store", preset, None, None, Filters(), "fp", 0)


def test_a_relative_window_starts_on_the_facts_grain_and_ends_now():
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


def test_a_relative_window_s_caption_says_its_whole_length(monkeypatch):
    """The last 24 h at 20:07:13 starts on the hour, 20:00 the day before: the caption says 1 d 7 min, not "1 d"."""
    from gpufleet.dashboards import ui

    shown = []
    monkeypatch.setattr(ui.st, "text", shown.append)
    monkeypatch.setattr(ui.data, "edge_warnings", lambda key: [])
    ui.window_caption(window("24h").resolve(NOW))
    assert shown == ["Window 2026-11-15 20:00 UTC to 2026-11-16 20:07 UTC (the last 1 d 7 min, moving with now)"]


def test_the_last_24h_and_its_timeline_answer_from_facts(tmp_path):
    """The golden store with its facts: the 24 h window as the dashboard resolves it reads its
    settled buckets from facts, and its timelines equal the raw path's; so does the same window
    starting to the second (its parts cut at its own timeline's bucket edges)."""
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, NOW, facts_hours=None)
    w.close()
    con = open_reader(tmp_path)
    r = window("24h").resolve(NOW)
    for p in (Params(r.start, r.end), Params(r.end - timedelta(hours=24), r.end)):
        a = Analysis(con, p, now=r.as_of)
        want = utilization_timelines(RawAnalysis(con, p, now=r.as_of))
        assert all(frames_equal(want[by], t) for by, t in utilization_timelines(a).items()), p
        assert a.fw.tiles.get(3600, 0) > 0, a.fw.tiles  # (the golden day is open at 20:07: its hours from their own files)
        # buckets from an origin before the window's start (the report's days from a local midnight)
        origin = p.start - timedelta(hours=5, minutes=30, seconds=7)
        raw = RawAnalysis(con, p, now=r.as_of)
        for bucket in (timedelta(hours=1), timedelta(hours=7)):
            want = utilization_timelines(raw, bucket=bucket, origin=origin)
            got = utilization_timelines(a, bucket=bucket, origin=origin)
            assert all(frames_equal(want[by], t) for by, t in got.items()), (p, bucket)
            assert got["fleet"]["bucket"][0] == origin and got["fleet"]["bucket"][-1] < p.end, (p, bucket)
