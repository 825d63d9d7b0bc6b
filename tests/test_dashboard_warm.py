"""The presets' figures computed ahead (gpufleet.dashboards.figures): once per reuse period, into the
cache the pages read, so a page's first load of a warmed preset computes nothing (the Health page's
GPU health too); the previous period's figures served while the current ones are being computed,
never for a filtered or unwarmed window; a failing pass logged and kept, the other presets warmed
(and a failing GPU health leaves the other pages' figures warmed)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

from gpufleet.analytics import health as ahealth  # noqa: E402
from gpufleet.analytics.core import Analysis  # noqa: E402
from gpufleet.analytics.params import Filters, Params  # noqa: E402
from gpufleet.dashboards import config as dconfig  # noqa: E402
from gpufleet.dashboards import data, ui  # noqa: E402
from gpufleet.dashboards import figures  # noqa: E402
from gpufleet.dashboards.figures import Warmer  # noqa: E402
from tests.test_dashboard_analytics import T, build  # noqa: E402

APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
NOW = T(12, 7, 13)  # 24 h back reaches the whole 10:00-12:00 scenario


class Clock:
    def __init__(self, t: datetime) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The scenario's store as the served app sees it, its clock at NOW; counts every Analysis."""
    root = Path(build(tmp_path / "store").root)
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    clock = Clock(NOW)
    monkeypatch.setattr(data, "utcnow", clock)
    made = []

    class Counted(Analysis):
        def __init__(self, *a, **k):
            made.append(a[1])
            super().__init__(*a, **k)

    monkeypatch.setattr(data, "Analysis", Counted)
    real_health = ahealth.window_health

    def counted_health(*a, **k):
        made.append("health")
        return real_health(*a, **k)

    monkeypatch.setattr(ahealth, "window_health", counted_health)
    for cached in (data.window_bundle, data.previous_baseline, data.health):
        cached.clear()
    yield clock, made
    for cached in (data.window_bundle, data.previous_baseline, data.health):
        cached.clear()


def preset(name: str, clock: Clock, filters: Filters = Filters()) -> data.Window:
    return data.make_window(data.current_settings(), preset=name, start=None, end=None, filters=filters, now=clock())


def test_a_preset_is_computed_once_per_period_into_the_pages_cache(served):
    clock, made = served
    w = Warmer(["24h"], clock)
    assert w.warm(data.current_settings()) == ["24h"] and made.count("health") == 1
    made.remove("health")
    assert len(made) == 1
    b = data.window_bundle(preset("24h", clock).key)  # what a page asks: cached, nothing computed
    assert len(made) == 1 and b.window.relative and b.window.end == NOW and b.totals.allocated_gpu_h > 0
    assert data.health_for(preset("24h", clock)) is not None and len(made) == 1  # the Health page's: cached too
    want = Analysis(data.reader(data.current_settings().store), Params(b.window.start, b.window.end), now=NOW).totals()
    assert b.totals == want
    assert w.warm(data.current_settings()) == []  # the same period: nothing to do
    clock.t = NOW + timedelta(minutes=5)  # the 24 h view's next period (data.step_for)
    assert w.warm(data.current_settings()) == ["24h"] and len(made) == 3  # its figures and its GPU health
    assert w.serve(preset("24h", clock)).window.end == NOW + timedelta(minutes=5)


def test_the_previous_periods_figures_only_while_the_current_are_computed(served):
    clock, _ = served
    w = Warmer(["24h"], clock)
    w.warm(data.current_settings())
    first = w.serve(preset("24h", clock))
    assert first is not None and first.window.end == NOW
    assert w.serve(preset("24h", clock, Filters(account="acct-a"))) is None  # a filtered window: computed when asked
    assert w.serve(preset("6h", clock)) is None  # not warmed
    clock.t = NOW + timedelta(minutes=5)
    later = preset("24h", clock)
    assert w.serve(later) is None  # nothing is computing it: the page computes (and waits for) it
    w._busy.add((later.root, later.fingerprint, "24h"))
    assert w.serve(later) is first  # being computed: the previous period's, which says its window
    clock.t = NOW + timedelta(minutes=10)
    assert w.serve(preset("24h", clock)) is None  # two periods old: never


def test_a_failing_preset_is_logged_and_the_others_warmed(served, monkeypatch, caplog):
    clock, _ = served
    real = data.window_bundle

    def failing(key):
        if key[2] == "24h":
            raise OSError("parquet file vanished")
        return real(key)

    monkeypatch.setattr(data, "window_bundle", failing)
    w = Warmer(["24h", "7d"], clock)
    assert w.warm(data.current_settings()) == ["7d"]
    assert w.errors == {"24h": "OSError: parquet file vanished"} and "24h window's figures ahead failed" in caplog.text
    assert [(r["preset"], r["error"], r["took_s"] is not None) for r in w.status()] == [
        ("24h", "OSError: parquet file vanished", False), ("7d", None, True)]  # what the Health page shows
    monkeypatch.setattr(data, "window_bundle", real)
    assert w.warm(data.current_settings()) == ["24h"] and w.errors == {}


def test_a_failing_gpu_health_leaves_the_other_pages_figures_warmed(served, monkeypatch, caplog):
    clock, _ = served

    def failing(w):
        raise OSError("health file vanished")

    monkeypatch.setattr(data, "health_for", failing)
    w = Warmer(["24h"], clock)
    assert w.warm(data.current_settings()) == ["24h"]
    assert w.serve(preset("24h", clock)) is not None and w.serve_health(preset("24h", clock)) is None
    assert w.errors == {"24h": "GPU health: OSError: health file vanished"} and "24h window's GPU health ahead failed" in caplog.text


def test_the_page_shows_the_warmed_figures_without_computing(served, monkeypatch):
    clock, made = served
    w = Warmer(["24h"], clock)
    w.warm(data.current_settings())
    monkeypatch.setattr(dconfig, "warm_asked", lambda argv=None: True)
    monkeypatch.setattr(figures, "_warmer", lambda presets: w)
    n = len(made)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({"window": "24h"})
    at.run()
    at = at.switch_page("views/utilization.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    b = w.serve(preset("24h", clock))
    assert {m.label: m.value for m in at.metric}["Allocated"] == ui.gpu_h(b.totals.allocated_gpu_h)
    assert len(made) == n  # the page computed nothing
    at = at.switch_page("views/health.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert len(made) == n  # nor the Health page: its GPU health was computed ahead too
    shown = at.container("health_warm").dataframe[0].value
    # as the one table formatter writes them: no failure is a dash, the end a UTC time
    assert shown["preset"].tolist() == ["24h"] and shown["error"].tolist() == [ui.people(pl.DataFrame({"error": [None]}, schema={"error": pl.Utf8}))["error"][0]]
    assert shown["end"].iloc[0] == f"{b.window.end:%Y-%m-%d %H:%M:%S}"


def test_periods_and_settings():
    w = Warmer(["24h", "7d", "24h"])
    assert w.presets == ("24h", "7d")
    assert w.seconds_to_next_period(datetime(2026, 11, 16, 12, 7, 13)) == 168.0  # 12:10:00 for 24 h (5-minute periods): 167 s, +1
    with pytest.raises(ValueError, match="warm windows"):
        Warmer(["2d"])
    assert dconfig.warm_asked(["--store", "s", "--warm"]) and not dconfig.warm_asked(["--store", "s"])
    assert dconfig.load({}, None)["warm_windows"] == ["24h", "7d"]
    with pytest.raises(dconfig.ConfigError, match="warm_windows"):
        dconfig.load({"dashboard": {"warm_windows": ["2d"]}}, None)


def test_no_store_yet_is_a_warning_then_warmed_once_it_is_there(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(tmp_path / "store"))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    clock = Clock(NOW)
    monkeypatch.setattr(data, "utcnow", clock)
    data.window_bundle.clear()
    w = Warmer(["24h"], clock)
    assert w.warm(data.current_settings()) == [] and w.errors["24h"].startswith("StoreError: no store at")
    assert "not computed ahead" in caplog.text and "Traceback" not in caplog.text
    build(tmp_path / "store")
    assert w.warm(data.current_settings()) == ["24h"] and w.errors == {}
    data.window_bundle.clear()

