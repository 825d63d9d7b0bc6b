"""The dashboards' hour facts (dashboards/facts.py over gpufleet.analytics.hour_facts): the served
dashboard's warmer builds the closed hours' facts into `[dashboard] facts_dir`; the Utilization
and Teams pages of a window of whole hours typed in are then summed from them - the same figures
as the window's analysis -, and so are the Jobs, MFU and Waste pages' figures, each read from the
facts alone (gpufleet.analytics.fact_window), started meanwhile in the background for them, and
the window's whole Bundle where asked; a window facts
cannot answer (a filter, an edge inside an hour) is computed as before; a failing build is
logged and shown on the Health page, never a wrong figure."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

from gpufleet.analytics.params import Filters  # noqa: E402
from gpufleet.collector.maintenance import compact  # noqa: E402
from gpufleet.collector.store import StoreWriter  # noqa: E402
from gpufleet.dashboards import data, figures  # noqa: E402
from gpufleet.dashboards import facts as dfacts  # noqa: E402
from gpufleet.dashboards import ui  # noqa: E402
from gpufleet.dashboards.figures import FACTS, Warmer  # noqa: E402
from tests.test_analytics_properties import TOL, frames_equal  # noqa: E402
from tests.test_dashboard_analytics import T, build  # noqa: E402

APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
NOW = T(23)  # the scenario's hours (10:00-13:00) closed, summarised, within facts_days


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The scenario's store, compacted (its hours summarised), a config whose facts_dir is under
    tmp_path; the pages' caches cleared."""
    root = Path(build(tmp_path / "store").root)
    w = StoreWriter(root)
    compact(w, NOW)
    w.close()
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(f'[dashboard]\nfacts_dir = "{tmp_path / "facts"}"\nrefresh_seconds = 0\n')
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.setenv("GPUFLEET_CONFIG", str(cfg))
    monkeypatch.setattr(data, "utcnow", lambda: NOW)
    # the scenario's few hours as a long window's: a timeline of 1-hour buckets (a window over 12 h has them)
    for module in ("hour_facts", "timeline", "core"):
        monkeypatch.setattr(f"gpufleet.analytics.{module}.timeline_bucket", lambda p: timedelta(hours=1))
    caches = (data.settings, data.window_bundle, data.window_use, data.window_fairness, data.window_mfu, data.window_jobs, data.window_waste)
    for cached in caches:
        cached.clear()
    yield tmp_path
    background_done()  # (a window's reading ahead must not run on into the next test's store)
    for cached in caches:
        cached.clear()


def background_done() -> None:
    """Wait for the dashboard's threads that read figures ahead (figures._prefetch) to end."""
    deadline = time.monotonic() + 60
    while any(t.name.startswith(figures.THREAD) for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.1)


def window(lo: datetime, hi: datetime, filters: Filters = Filters()) -> data.Window:
    return data.make_window(data.current_settings(), preset=None, start=lo, end=hi, filters=filters, now=NOW)


def same_view(x: data.UseView, y: data.UseView) -> list[str]:
    bad = [f"totals.{k}" for k in ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_gpu_h", "utilization_pct")
           if getattr(x.totals, k) != pytest.approx(getattr(y.totals, k), **TOL)]
    bad += [f"utilization[{by}]" for by in ("fleet", "cluster", "model", "partition", "account", "user_name")
            if not frames_equal(x.utilization[by], y.utilization[by])]
    return bad + [f"timeline[{by}]" for by in x.timeline if not frames_equal(x.timeline[by], y.timeline[by])]


def computed_bundle(key: tuple, monkeypatch) -> data.Bundle:
    """The window's Bundle computed from the store (no facts), the cache left as it was."""
    data.window_bundle.clear()
    with monkeypatch.context() as m:
        m.setattr(data, "facts_dir", lambda s: None)
        out = data.window_bundle(key)
    data.window_bundle.clear()
    return out


def same_bundle(x: data.Bundle, y: data.Bundle, y_mfu: dict) -> list[str]:
    """What differs between two Bundles' figures (the Jobs, Waste and MFU pages' too; y's MFU
    figures given apart)."""
    bad = same_view(data.UseView.of(x), data.UseView.of(y))
    bad += [f"totals.{k}" for k in ("idle_allocated_gpu_h", "idle_allocated_cost", "no_process_gpu_h", "no_process_cost", "stranded_gpu_h",
                                    "stranded_cost") if getattr(x.totals, k) != pytest.approx(getattr(y.totals, k), **TOL)]
    bad += [f"waste{k}" for k in x.waste if not frames_equal(x.waste[k], y.waste[k])]
    bad += [name for name in ("top_jobs", "jobs") if not frames_equal(getattr(x, name), getattr(y, name))]
    return bad + [f"mfu[{k}]" for k in x.mfu if not frames_equal(x.mfu[k], y_mfu[k])]


def read_ahead(key: tuple, monkeypatch, hours: int) -> None:
    """Once the background's work is done: every page's figures of the window are cached, read
    from its `hours` hours' facts (asked again, nothing is read or computed)."""
    from gpufleet.analytics import fact_window, hour_facts

    background_done()
    with monkeypatch.context() as m:
        for name in ("window_jobs", "mfu_window", "window_waste", "window_analysis"):
            m.setattr(fact_window, name, lambda *a, **k: pytest.fail("not computed ahead"))
        m.setattr(hour_facts, "window_use", lambda *a, **k: pytest.fail("not computed ahead"))
        m.setattr(data, "Analysis", lambda *a, **k: pytest.fail("computed"))
        assert data.window_use(key).facts_hours == data.window_jobs(key).facts_hours == data.window_mfu(key).facts_hours == hours
        assert data.window_waste(key) is not None


def test_the_warmer_builds_the_facts_and_a_typed_window_of_whole_hours_is_summed_from_them(store, monkeypatch):
    s = data.current_settings()
    w = Warmer([], clock=lambda: NOW)
    w.refresh_facts(s)
    row = next(r for r in w.status() if r["preset"] == FACTS)
    assert row["error"] is None and row["computed_at"] is not None
    built = sorted(p.name for p in data.facts_dir(s).path.rglob("*.parquet"))
    assert [n[:3] for n in built] == ["09-", "10-", "11-", "12-"]  # the hours with samples (the allocations reach 09:xx and 13:00)
    w.refresh_facts(s)  # nothing new: nothing rebuilt
    assert sorted(p.name for p in data.facts_dir(s).path.rglob("*.parquet")) == built
    # a file of another name beside an hour's current one (a pass that died between writing and
    # removing): the next pass removes it, so the hour's current facts are the ones found
    stale = next(data.facts_dir(s).path.rglob("10-*.parquet"))
    (stale.parent / "10-0000stale.parquet").write_bytes(stale.read_bytes())
    w.refresh_facts(s)
    assert sorted(p.name for p in data.facts_dir(s).path.rglob("*.parquet")) == built

    for lo, hi in ((T(10), T(12)), (T(9), T(13)), (T(11), T(12))):
        view = data.window_use(window(lo, hi).key)
        assert view.facts_hours == (hi - lo) // timedelta(hours=1)
        computed = computed_bundle(window(lo, hi).key, monkeypatch)
        assert computed.facts_hours == 0 and computed.jobs.height
        bad = same_view(data.UseView.of(computed), view)
        assert not bad, (lo, hi, bad)
        bundle = data.window_bundle(window(lo, hi).key)  # the Jobs, Waste and MFU pages' figures: from facts too
        assert bundle.facts_hours == view.facts_hours and not computed.mfu_apart
        # ... its job list read from the facts alone first (data.window_jobs: the Jobs page's)
        listed = data.window_jobs(window(lo, hi).key)
        assert listed.facts_hours == view.facts_hours and listed.jobs.equals(bundle.jobs)  # (the list the Bundle took)
        # ... MFU apart, read from the facts alone (data.window_mfu: the MFU page's)
        assert bundle.mfu_apart and bundle.mfu is None
        mfu = figures.mfu_for(window(lo, hi))
        assert mfu.error is None and mfu.facts_hours == view.facts_hours
        bad = same_bundle(computed, bundle, mfu.figures)
        assert not bad, (lo, hi, bad)
        # the Teams page's fairness from the accounting alone: the analysis' figures (the Bundle
        # from facts takes them)
        report, error = data.window_fairness(window(lo, hi).key)
        assert error is None and frames_equal(report.per_account, computed.fairness.per_account)
        assert (report.jain_index, report.gini_users) == pytest.approx((computed.fairness.jain_index, computed.fairness.gini_users), **TOL)
        assert frames_equal(bundle.fairness.per_account, report.per_account)
    # facts cannot answer: an account filter, a window edge inside an hour
    filtered = data.window_use(window(T(10), T(12), Filters(account="physics")).key)
    assert filtered.facts_hours == 0 and filtered.facts_missed.startswith("a filter other than the cluster's")
    inside = data.window_use(window(T(10, 30), T(12)).key)
    assert inside.facts_hours == 0 and inside.facts_missed == "the window starts or ends inside an hour"
    # an hour without facts yet (the warmer has not built it): said, and computed
    for f in data.facts_dir(s).path.rglob("11-*.parquet"):
        f.unlink()
    data.window_use.clear()
    missing = data.window_use(window(T(10), T(12)).key)
    assert missing.facts_hours == 0 and missing.facts_missed.startswith("not every hour of it has current facts yet")


def test_the_utilization_and_teams_pages_from_facts_and_the_rest_computed_meanwhile(store, monkeypatch):
    from gpufleet.analytics import fact_window

    reads = []  # the windows whose whole analysis was read from facts (fact_window.window_analysis)
    real_read = fact_window.window_analysis
    monkeypatch.setattr(fact_window, "window_analysis", lambda con, p, *a, **k: reads.append((p.start, p.end)) or real_read(con, p, *a, **k))
    s = data.current_settings()
    dfacts.refresh(data.reader(s.store), data.facts_dir(s), data.params_for(s, *dfacts.horizon(NOW, 8), Filters()), NOW)
    from gpufleet.analytics import hour_facts

    checked = []  # the hours' names checked against the store: once for the window's pages (data.fact_names)
    real_keys = hour_facts.hour_keys
    monkeypatch.setattr(hour_facts, "hour_keys", lambda cur, bind, lo, hi: checked.append((lo, hi)) or real_keys(cur, bind, lo, hi))
    w = window(T(10), T(12))
    q = {"from": "2026-11-16T10:00:00", "to": "2026-11-16T12:00:00"}
    for page in ("utilization", "teams"):
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update(q)
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, at.exception
    assert any("Summed from the hour facts of the window's 2 hours" in c.value for c in at_utilization_captions(q))
    q_inside = {"from": "2026-11-16T10:30:00", "to": "2026-11-16T12:00:00"}
    assert any("could not - the window starts or ends inside an hour." in c.value for c in at_utilization_captions(q_inside))
    # the Jobs, MFU and Waste pages' figures, read from the facts in the background - not the
    # window's whole analysis, which none of them needs
    read_ahead(w.key, monkeypatch, hours=2)
    assert reads == []
    assert checked == [(T(10), T(12))]  # the Utilization page's, then known to the others
    for page in ("jobs", "waste", "mfu"):
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update(q)
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, at.exception
        assert any("Summed from the hour facts of the window's 2 hours" in c.value for c in at.caption), page


def test_the_warmer_rolls_up_the_days_and_windows_read_them(store, monkeypatch):
    """The warmer writes each day's roll-up once its hours all have facts (here days of 2 hours:
    hour_facts.ROLLUP_HOURS), and a window over whole days reads those instead of the hours'
    files: the same figures as computed, for every page."""
    from gpufleet.analytics import hour_facts

    monkeypatch.setattr(hour_facts, "ROLLUP_HOURS", 2)
    s = data.current_settings()
    p = data.params_for(s, *dfacts.horizon(NOW, 1), Filters())
    done = dfacts.refresh(data.reader(s.store), data.facts_dir(s), p, NOW)
    assert done.days_rolled == 1  # 10:00-12:00 (the hours with facts are 09:00-12:00)
    again = dfacts.refresh(data.reader(s.store), data.facts_dir(s), p, NOW)
    assert (again.hours_built, again.days_rolled) == (0, 0)
    hours_read = []
    real = dfacts.FactsDir.present
    monkeypatch.setattr(dfacts.FactsDir, "present",
                        lambda self, h, kind=dfacts.FactsDir.HOUR: (kind == dfacts.FactsDir.HOUR and hours_read.append(h)) or real(self, h, kind))
    key = window(T(10), T(12)).key
    computed = computed_bundle(key, monkeypatch)
    bundle = data.window_bundle(key)
    assert bundle.facts_hours == 2 and hours_read == []  # the roll-up alone
    mfu = figures.mfu_for(window(T(10), T(12)))
    assert mfu.error is None and not same_bundle(computed, bundle, mfu.figures)
    assert not same_view(data.UseView.of(computed), data.window_use(key))
    assert frames_equal(data.window_jobs(key).jobs, computed.jobs) and hours_read == []


def opened_from_facts_alone(page: str, monkeypatch) -> AppTest:
    """The page of the window 10:00-12:00 opened first, once the hour facts are built, with the
    window's whole analysis (from facts or computed) failing the test if read: it shows that it
    was summed from the facts, and the background has read every page's figures from them."""
    from gpufleet.analytics import fact_window

    monkeypatch.setattr(fact_window, "window_analysis", lambda *a, **k: pytest.fail("the whole analysis was read"))
    monkeypatch.setattr(data, "Analysis", lambda *a, **k: pytest.fail("the window was computed"))
    s = data.current_settings()
    dfacts.refresh(data.reader(s.store), data.facts_dir(s), data.params_for(s, *dfacts.horizon(NOW, 8), Filters()), NOW)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update({"from": "2026-11-16T10:00:00", "to": "2026-11-16T12:00:00"})
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    assert any("Summed from the hour facts of the window's 2 hours" in c.value for c in at.caption)
    read_ahead(window(T(10), T(12)).key, monkeypatch, hours=2)  # (the others' figures meanwhile: none of them the whole analysis)
    return at


def test_the_jobs_page_of_a_typed_window_lists_its_jobs_from_facts_alone(store, monkeypatch):
    """Opened first, the Jobs page of a window of whole hours lists its jobs from the hour facts
    without the window's whole analysis (what the Waste and MFU pages read): every job of the
    computed Bundle's list, the same figures (test_the_warmer_builds_the_facts...); under an
    account filter too, the filtered window's computed list."""
    real = data.Analysis
    at = opened_from_facts_alone("jobs", monkeypatch)
    listed = data.window_jobs(window(T(10), T(12)).key)
    assert listed.jobs.height and at.metric[0].value == f"{listed.jobs.height:,} of {listed.jobs.height:,}"
    assert set(at.container("jobs_list").dataframe[0].value["job_id"]) == set(listed.jobs["job_id"])
    # ... a team's too (an account filter: its rows of the fleet's list), and a window of 2 hours
    # whose timeline would be of minutes (the list has none)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update({"from": "2026-11-16T10:00:00", "to": "2026-11-16T12:00:00", "account": "physics"})
    at.switch_page("views/jobs.py").run()
    assert not at.exception, at.exception
    assert any("Summed from the hour facts of the window's 2 hours" in c.value for c in at.caption)
    team = data.window_jobs(window(T(10), T(12), Filters(account="physics")).key).jobs
    assert team.height and frames_equal(team, listed.jobs.filter(pl.col("account") == "physics"))
    with monkeypatch.context() as m:
        m.setattr("gpufleet.analytics.hour_facts.timeline_bucket", lambda p: timedelta(minutes=5))
        assert data.window_jobs(window(T(10), T(12), Filters(user_name="alice")).key) is not None
    monkeypatch.setattr(data, "Analysis", real)  # the team's window computed: the same list
    computed = computed_bundle(window(T(10), T(12), Filters(account="physics")).key, monkeypatch)
    assert frames_equal(team, computed.jobs)


def test_the_waste_page_of_a_typed_window_from_facts_alone(store, monkeypatch):
    """Opened first, the Waste page of a window of whole hours reads its figures from the hour
    facts (the allocations with stretches, fact_window.window_waste) without the window's whole
    analysis, which the background then computes for the MFU page (not here): the computed
    Bundle's totals, waste by account and user and top jobs."""
    real = data.Analysis
    at = opened_from_facts_alone("waste", monkeypatch)
    key = window(T(10), T(12)).key
    got = data.window_waste(key)
    assert got is not None and got.totals.idle_allocated_gpu_h > 0 and got.top_jobs.height
    assert at.metric[0].value == ui.gpu_h(got.totals.idle_allocated_gpu_h)
    monkeypatch.setattr(data, "Analysis", real)
    computed = computed_bundle(key, monkeypatch)
    bad = [f"totals.{k}" for k in ("idle_allocated_gpu_h", "idle_allocated_cost", "no_process_gpu_h", "no_process_cost", "stranded_gpu_h",
                                   "stranded_cost", "allocated_gpu_h", "capacity_gpu_h") if getattr(computed.totals, k) != pytest.approx(getattr(got.totals, k), **TOL)]
    bad += [f"waste{k}" for k in computed.waste if not frames_equal(computed.waste[k], got.waste[k])]
    assert not bad and frames_equal(computed.top_jobs, got.top_jobs), bad


def test_any_page_of_a_typed_window_starts_reading_its_figures_ahead(store, monkeypatch):
    """The Health page (which reads none of them) of a window of whole hours starts the
    background's reading of every page's figures from the facts (figures.compute_ahead); a
    window facts cannot answer (an account filter) starts nothing."""
    s = data.current_settings()
    dfacts.refresh(data.reader(s.store), data.facts_dir(s), data.params_for(s, *dfacts.horizon(NOW, 8), Filters()), NOW)
    started = []
    real = figures._prefetch
    monkeypatch.setattr(figures, "_prefetch", lambda key: started.append(key) or real(key))
    for q in ({"account": "physics"}, {}):
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update({"from": "2026-11-16T10:00:00", "to": "2026-11-16T12:00:00", **q})
        at.switch_page("views/health.py").run()
        assert not at.exception, at.exception
    key = window(T(10), T(12)).key
    assert started == [key]
    read_ahead(key, monkeypatch, hours=2)


def at_utilization_captions(q: dict):
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update(q)
    at.switch_page("views/utilization.py").run()
    return at.caption


def test_a_failing_build_is_shown_on_the_health_page_and_the_pages_compute_their_windows(store, monkeypatch):
    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(dfacts, "refresh", broken)
    w = Warmer([], clock=lambda: NOW)
    w.refresh_facts(data.current_settings())
    row = next(r for r in w.status() if r["preset"] == FACTS)
    assert "disk full" in row["error"]
    assert data.window_use(window(T(10), T(12)).key).facts_hours == 0


def test_one_window_is_computed_in_the_background_at_a_time(monkeypatch):
    """An operator stepping through typed windows starts one background analysis, not one each."""
    started, release = [], threading.Event()

    def slow(key):
        started.append(key)
        release.wait(10)

    monkeypatch.setattr(data, "window_use", slow)
    figures._prefetch(("a",))
    figures._prefetch(("b",))  # while a's runs: not started
    release.set()
    deadline = time.monotonic() + 10
    while figures._PREFETCHING and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == [("a",)]
    figures._prefetch(("b",))  # a's done: b's starts
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == [("a",), ("b",)]


def test_a_job_s_report_gives_its_row_of_the_window_s_mfu(store, monkeypatch):
    """The Jobs page's report computes a job's figures on the job's own run (data.job_report), its
    MFU too - not waiting for the window's: each job's MFU there is its row of the MFU page's."""
    w = window(T(10), T(12))
    computed = computed_bundle(w.key, monkeypatch)
    per_job = computed.mfu["jobs"]
    fields = ("cluster", "scheduler", "job_key", "job_id", "account", "user_name", "partition", "start", "end")
    seen = 0
    for job in computed.jobs.iter_rows(named=True):
        res = data.job_report(computed.window.key, {k: job.get(k) for k in fields})
        want = per_job.filter((pl.col("cluster") == job["cluster"]) & (pl.col("scheduler") == job["scheduler"])
                              & (pl.col("job_key") == job["job_key"]))
        if res is None:  # (no GPU inside the window)
            continue
        assert res["mfu_error"] is None
        assert (res["mfu"] is None) == want.is_empty(), job["job_id"]
        if res["mfu"] is not None:
            seen += 1
            w_row = want.row(0, named=True)
            for k, v in w_row.items():
                got = res["mfu"][k]
                assert (got == pytest.approx(v, **TOL)) if isinstance(v, float) else got == v, (job["job_id"], k, v, got)
    assert seen >= 2


def test_a_larger_fleet_s_facts_are_built_fewer_hours_at_a_time(store, monkeypatch):
    """One build analyses up to a day of 32,768 GPUs' hours (hour_facts.build_hours), so its
    memory does not grow with the fleet: here the limit as if the scenario's GPUs were many - two
    hours a build - and the same facts (the figures from them are still the computed ones)."""
    from gpufleet.analytics import hour_facts

    s = data.current_settings()
    gpus = data.reader(s.store).execute("SELECT count(*) FROM gpus").fetchone()[0]
    monkeypatch.setattr(hour_facts, "BUILD_GPU_HOURS", gpus * 2)
    assert hour_facts.build_hours(data.reader(s.store)) == 2
    spans = []
    real = hour_facts.build
    monkeypatch.setattr(hour_facts, "build", lambda con, p, now: spans.append(p.end - p.start) or real(con, p, now))
    dfacts.refresh(data.reader(s.store), data.facts_dir(s), data.params_for(s, *dfacts.horizon(NOW, 1), Filters()), NOW)
    assert spans and max(spans) == timedelta(hours=2)
    key = window(T(10), T(12)).key
    assert data.window_use(key).facts_hours == 2
    bad = same_view(data.UseView.of(computed_bundle(key, monkeypatch)), data.window_use(key))
    assert not bad, bad
