"""The dashboard under a job filter and with unknown filter values (issue #13.2), under AppTest.

Same store as tests/test_dashboard_pages.py (window 10:00-12:00). With ?account=physics every
figure shown is physics' own: its busy time and utilization, its idle time, its cost; capacity
and stranded time have no account and say "not attributable". An account the store does not
know, or a window that does not exist, is a visible warning - never silently the whole fleet.
"""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")

from gpufleet.analytics import vocabulary as words  # noqa: E402
from gpufleet.analytics.core import Analysis  # noqa: E402
from gpufleet.analytics.params import Filters, Params  # noqa: E402
from gpufleet.dashboards import ui  # noqa: E402
from tests.test_dashboard_analytics import T  # noqa: E402
from tests.test_dashboard_pages import clean, con, goto, metrics, open_app, store, use_store  # noqa: E402,F401 - fixtures


def texts(at) -> list[str]:
    return [t.value for t in at.text]


def test_account_filter_narrows_every_figure(store, con, use_store):
    use_store(store)
    fleet = Analysis(con, Params(T(10), T(12)), now=T(12))
    physics = Analysis(con, Params(T(10), T(12), filters=Filters(account="physics")), now=T(12))
    t, f = physics.totals(), fleet.totals()
    rows = fleet.utilization("account").filter(account="physics")
    # the filtered figures are physics' row of the fleet's table, and not the fleet's figures:
    # GPU-A 80 % for 2 h; GPU-C 50 % for 1 h 15 s (job 103 held it until 11:30; its last sample,
    # 10:59:45, holds max_gap = 30 s, to 11:00:15)
    c_h = 1 + 15 / 3600
    assert t.busy_gpu_h == pytest.approx(rows["busy_gpu_h"].sum()) == pytest.approx(0.8 * 2 + 0.5 * c_h)
    assert t.data_gpu_h == pytest.approx(rows["data_gpu_h"].sum()) == pytest.approx(2 + c_h)
    assert t.utilization_pct == pytest.approx((1.6 + 0.5 * c_h) / (2 + c_h) * 100)
    assert t.busy_gpu_h < f.busy_gpu_h
    assert t.capacity_gpu_h is None and t.stranded_gpu_h is None and t.stranded_cost is None
    assert t.scope == "account=physics" and "no account" in t.not_attributable_reason

    at = open_app(account="physics")
    assert not at.warning
    goto(at, "utilization")
    m = metrics(at)
    assert m["Utilization"] == ui.pct(t.utilization_pct) == "70.0 %"
    assert m["Busy"] == ui.gpu_h(t.busy_gpu_h) == "2.1 GPU-h"  # not the fleet's
    assert m["With data"] == ui.gpu_h(t.data_gpu_h)
    assert m["Allocated"] == ui.gpu_h(t.allocated_gpu_h)
    assert m["Capacity"] == words.NOT_ATTRIBUTABLE
    assert any(x.startswith("Figures for account=physics only; unallocated capacity has no account") for x in texts(at))
    goto(at, "waste")
    m = metrics(at)
    assert m["Idle allocated"] == ui.gpu_h(t.idle_allocated_gpu_h)
    assert m["Stranded (unallocated)"] == m["Stranded cost"] == words.NOT_ATTRIBUTABLE
    assert any(x.startswith("Not shown: unallocated capacity has no account") for x in texts(at))


def test_teams_page_under_a_filter_shows_its_row_of_the_fleets_fairness(store, con, use_store):
    """?account=physics: physics' row of the whole fleet's fairness (its used share of the fleet,
    its ratio, its fair-share factor) and the fleet's Jain's index - not a fleet of one team with
    ratio 1 and Jain's index 1 (issue #53.2)."""
    from gpufleet.analytics import fairness
    from tests.test_dashboard_pages import as_page, assert_table, frame

    use_store(store)
    fleet = fairness.fairness(Analysis(con, Params(T(10), T(12)), now=T(12)), None)
    physics = fleet.per_account.filter(account="physics")
    assert physics.height == 1 and fleet.per_account.height > 1
    at = goto(open_app(account="physics"), "teams")
    assert metrics(at)["Jain's index"] == f"{fleet.jain_index:.3f}"
    assert_table(frame(at, "fair_accounts"), as_page(physics))
    assert any(c.value.startswith("Showing account=physics's row of the fleet's fairness") for c in at.caption)


def test_fleet_scope_unchanged(store, con, use_store):
    use_store(store)
    t = Analysis(con, Params(T(10), T(12)), now=T(12)).totals()
    assert t.scope == "fleet" and t.not_attributable_reason is None
    at = goto(open_app(), "utilization")
    assert metrics(at)["Capacity"] == ui.gpu_h(t.capacity_gpu_h)
    assert not any(x.startswith("Figures for") for x in texts(at))


def test_unknown_account_is_a_warning_not_the_fleet(store, use_store):
    use_store(store)
    at = open_app(account="nosuchteam")
    assert at.selectbox(key="account").value == "nosuchteam"
    assert any("does not know" in w.value for w in at.warning)
    assert any(x.startswith("unknown account 'nosuchteam'") for x in texts(at))
    for page in ("utilization", "waste", "jobs"):
        goto(at, page)
        assert any("does not know" in w.value for w in at.warning), page
        # nothing matches: an empty window, not the fleet's figures
        assert "Busy" not in metrics(at) or metrics(at)["Busy"] == ui.gpu_h(0.0), page


def test_unknown_window_is_a_warning(store, use_store):
    use_store(store)
    at = clean(open_app(window="bogus"))
    assert any("Unknown time window" in w.value for w in at.warning)
    assert "window=bogus" in texts(at)
    assert at.selectbox(key="window").value != "bogus"
