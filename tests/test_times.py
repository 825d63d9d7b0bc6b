"""The kernel's rounding of times to a step (gpufleet.times floor_time and ceil_time): the two
sides of a window read over whole buckets (reliability's evidence over whole hours)."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, strategies as st

from gpufleet.times import ceil_time, floor_time

EPOCH = datetime(1970, 1, 1)


def test_by_hand():
    h = timedelta(hours=1)
    assert ceil_time(datetime(2026, 3, 9, 0, 2), h) == datetime(2026, 3, 9, 1)  # 00:02 + 2 min grace -> the next hour
    assert ceil_time(datetime(2026, 3, 9), h) == datetime(2026, 3, 9)  # on the grid: itself
    assert ceil_time(datetime(2026, 3, 9, 0, 0, 0, 1), h) == datetime(2026, 3, 9, 1)  # 1 microsecond past: a whole step up
    assert floor_time(datetime(2026, 3, 1, 23, 50), h) == datetime(2026, 3, 1, 23)  # 00:00 - 10 min of hardware window


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
       st.sampled_from([timedelta(minutes=5), timedelta(hours=1), timedelta(days=1), timedelta(seconds=7)]))
def test_floor_and_ceil_are_the_grid_points_around_a_time(t, step):
    lo, hi = floor_time(t, step), ceil_time(t, step)
    assert lo <= t <= hi and hi - lo in (timedelta(0), step)
    assert (lo - EPOCH) % step == timedelta(0) == (hi - EPOCH) % step
    assert (lo == hi) == ((t - EPOCH) % step == timedelta(0))
