"""The one comparison rule (analytics/trends.py): against an empty or partial previous window
every change is "no data"; a percent change against a zero base is never a number."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpufleet.analytics.core import Totals
from gpufleet.analytics.trends import NO_DATA, ZERO_BASE, compare, no_comparison_reason

PREV_START = datetime(2026, 11, 9)


def totals(**kw) -> Totals:
    base = dict(capacity_gpu_h=100.0, data_gpu_h=100.0, no_data_gpu_h=0.0, busy_gpu_h=50.0, utilization_pct=50.0, allocated_gpu_h=80.0,
                idle_allocated_gpu_h=10.0, idle_allocated_cost=30.0, no_process_gpu_h=4.0, no_process_cost=12.0, stranded_gpu_h=20.0,
                stranded_cost=60.0, unpriced_models=())
    return Totals(**{**base, **kw})


def by_figure(df):
    return {r["figure"]: r for r in df.to_dicts()}


def test_empty_previous_window_is_no_data_for_every_figure():
    # jobs ran (allocated 23,788.1 GPU-h from accounting) but no sample: still no base
    prev = totals(data_gpu_h=0.0, busy_gpu_h=0.0, utilization_pct=None, idle_allocated_gpu_h=0.0, stranded_gpu_h=0.0, allocated_gpu_h=0.0)
    reason = no_comparison_reason(prev, PREV_START, datetime(2026, 11, 1))
    assert reason == "empty: no GPU samples in the previous window"
    rows = compare(totals(allocated_gpu_h=23788.1), prev, reason).to_dicts()
    assert [(r["change"], r["change_pct"], r["change_missing"], r["change_pct_missing"]) for r in rows] == [(None, None, NO_DATA, NO_DATA)] * len(rows)
    assert by_figure(compare(totals(), prev, reason))["allocated_gpu_h"]["previous"] == 0.0  # the value stays, the change goes


def test_history_starting_inside_the_previous_window_is_partial():
    first = datetime(2026, 11, 9, 10)
    reason = no_comparison_reason(totals(), PREV_START, first)
    assert reason == "partial: the store's history starts 2026-11-09 10:00 UTC, inside the previous window from 2026-11-09 00:00 UTC"
    assert by_figure(compare(totals(idle_allocated_gpu_h=5934.4 + 10), totals(), reason))["idle_allocated_gpu_h"]["change_missing"] == NO_DATA
    assert no_comparison_reason(totals(), PREV_START, None).startswith("partial: the store's history has no GPU sightings")


def test_full_previous_window_compares_with_the_arithmetic_shown():
    assert no_comparison_reason(totals(), PREV_START, PREV_START) is None  # history starts exactly at the window start
    cur, prev = totals(allocated_gpu_h=100.0, idle_allocated_cost=None), totals(allocated_gpu_h=80.0)
    t = by_figure(compare(cur, prev, None))
    a = t["allocated_gpu_h"]
    assert (a["current"], a["previous"], a["change"], a["change_pct"]) == (100.0, 80.0, 20.0, pytest.approx(20.0 / 80.0 * 100))  # +25 %
    assert (a["change_missing"], a["change_pct_missing"]) == (None, None)
    assert t["utilization_pct"]["change"] == 0.0 and t["utilization_pct"]["change_pct"] == 0.0
    assert (t["idle_allocated_cost"]["change"], t["idle_allocated_cost"]["change_missing"]) == (None, "unknown")  # no price


def test_a_percent_change_against_a_zero_base_is_never_a_number():
    # 1.7e-9 GPU-h of float dust as the base once gave 172879177185.5 %
    t = by_figure(compare(totals(stranded_gpu_h=3.0, no_process_gpu_h=2.0), totals(stranded_gpu_h=0.0, no_process_gpu_h=1.7e-9), None))
    for key in ("stranded_gpu_h", "no_process_gpu_h"):
        assert t[key]["change_pct"] is None and t[key]["change_pct_missing"] == ZERO_BASE and t[key]["change_missing"] is None
    assert t["stranded_gpu_h"]["change"] == 3.0


def test_a_cost_moving_against_its_gpu_hours_says_why():
    """The issue's case (#53.7): idle GPU-hours +2.10 beside idle cost -$15.96 - the idle time moved
    from H100s ($4.00/GPU-h) to cheaper A100s: the change says so, with the mean price either side."""
    prev = totals(idle_allocated_gpu_h=10.0, idle_allocated_cost=40.0)  # $4.00 per GPU-hour
    cur = totals(idle_allocated_gpu_h=12.1, idle_allocated_cost=24.04)  # ~$1.99 per GPU-hour
    t = by_figure(compare(cur, prev))
    assert t["idle_allocated_cost"]["change"] == pytest.approx(-15.96)
    assert t["idle_allocated_cost"]["reason"] == ("the GPU-hours went up 2.10 while the cost went down $15.96: the time moved to cheaper "
                                                 "GPU models (mean price per GPU-hour $4.00 before, $1.99 now)")
    # hours flat, cost up: dearer models
    up = by_figure(compare(totals(stranded_cost=75.0), totals()))["stranded_cost"]["reason"]
    assert up == ("the GPU-hours did not change while the cost went up $15.00: the time moved to dearer GPU models "
                  "(mean price per GPU-hour $3.00 before, $3.75 now)")
    # the same direction, no comparison, an unknown side, or a GPU-hour figure: no reason
    same = by_figure(compare(totals(idle_allocated_gpu_h=20.0, idle_allocated_cost=50.0), prev))
    assert all(r["reason"] is None for r in same.values())
    assert by_figure(compare(cur, prev, NO_DATA))["idle_allocated_cost"]["reason"] is None
    assert by_figure(compare(totals(idle_allocated_cost=None), prev))["idle_allocated_cost"]["reason"] is None


def test_under_a_job_filter_capacity_and_stranded_read_not_attributable_not_unknown():
    """The Waste page filtered to a team said "Stranded: not attributable" above a comparison whose row said "unknown"."""
    from gpufleet.analytics.trends import people_rows

    why = "unallocated capacity has no account: capacity and stranded time are not attributable to account=a"
    team = dict(capacity_gpu_h=None, stranded_gpu_h=None, stranded_cost=None, scope="account=a", not_attributable_reason=why)
    rows = {r["figure"]: r for r in people_rows(compare(totals(**team), totals(**team)))}
    for label in ("stranded (unallocated) GPU-hours", "cost of stranded capacity $"):
        assert rows[label]["this window"] == rows[label]["previous window"] == "not attributable", rows[label]
    assert rows["GPU-hours busy"]["this window"] == "50.0 GPU-h"
    # without a filter a missing figure stays unknown
    fleet = {r["figure"]: r for r in people_rows(compare(totals(stranded_cost=None), totals()))}
    assert fleet["cost of stranded capacity $"]["this window"] == "unknown"
