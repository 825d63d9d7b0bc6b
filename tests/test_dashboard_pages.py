"""Every dashboard page under streamlit.testing's AppTest: no exception, no error, and the figures
shown are the analytics' figures for the same window (values asserted, not just "it renders").

The store is the scenario of tests/test_dashboard_analytics.py (window 10:00-12:00, hostile job
names); the dashboard reads it through its real path (settings from the environment, the reader
connection, the cached loaders).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd
import polars as pl
from polars.testing import assert_frame_equal
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

from gpufleet.analytics import vocabulary as words  # noqa: E402
from gpufleet.analytics import fleet_now as fn  # noqa: E402
from gpufleet.analytics import health as ahealth  # noqa: E402
from gpufleet.analytics.core import Analysis  # noqa: E402
from gpufleet.analytics.jobs import job_report, job_summaries  # noqa: E402
from gpufleet.analytics.params import Filters, Params  # noqa: E402
from gpufleet.analytics.timeline import utilization_timeline  # noqa: E402
from gpufleet.analytics.trends import NO_DATA, compare, previous_baseline  # noqa: E402
from gpufleet.collector.store import StoreWriter, open_reader  # noqa: E402
from gpufleet.dashboards import ui  # noqa: E402
from gpufleet.analytics.states import STATE_OPTIONS, Thresholds, job_breakdown  # noqa: E402
from tests.test_dashboard_analytics import EVE, HOSTILE, QUOTE_ACCOUNT, T, W, build  # noqa: E402

APP = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
WINDOW = {"from": "2026-11-16T10:00", "to": "2026-11-16T12:00"}
PAGES = ("fleet_now", "utilization", "jobs", "teams", "waste", "health", "mfu", "reliability")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return Path(build(tmp_path_factory.mktemp("dash-pages")).root)


@pytest.fixture(scope="module")
def con(store):
    return open_reader(store)


@pytest.fixture(scope="module")
def a(con):
    return Analysis(con, W, now=T(12))


@pytest.fixture
def use_store(monkeypatch):
    def use(path, config: Path | None = None) -> None:
        monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(path))
        if config is None:
            monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
        else:
            monkeypatch.setenv("GPUFLEET_CONFIG", str(config))
    return use


# --- helpers ---


def clean(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def open_app(**query) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({**WINDOW, **query})
    return clean(at.run())


def goto(at: AppTest, page: str) -> AppTest:
    return clean(at.switch_page(f"views/{page}.py").run())


def opened(at: AppTest, *keys: str) -> AppTest:
    """The page with its detail expanders `keys` opened (ui.details: their tables are made only then), as a click does."""
    for key in keys:
        at.session_state[ui.details_key(key)] = True
    return clean(at.run())


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def frame(at: AppTest, key: str) -> pd.DataFrame:
    block = at.container(key)
    assert len(block.dataframe) == 1, f"table {key} not shown: {[c.value for c in block.caption]}"
    return block.dataframe[0].value


def same(x, y) -> bool:
    nx = x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NaT or x is pd.NA  # (pd.NA: a table with durations)
    ny = y is None or (isinstance(y, float) and math.isnan(y)) or y is pd.NaT or y is pd.NA
    if nx or ny:
        return nx and ny
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(x, pd.Timestamp):
        x = x.to_pydatetime()
    if isinstance(y, pd.Timestamp):
        y = y.to_pydatetime()
    return x == y


def as_page(df: pl.DataFrame) -> pl.DataFrame:
    """A table by team, user or partition as the page shows it: without its count of jobs of unknown
    GPU count where that is 0 on every row (ui.unknown_gpu_counts_note)."""
    return df.drop("gpus_unknown_jobs") if "gpus_unknown_jobs" in df.columns and not df["gpus_unknown_jobs"].sum() else df


def assert_table(shown: pd.DataFrame, expected: pl.DataFrame, columns: list[str] | None = None) -> None:
    """The shown table holds the analytics frame's values, row for row, column for column, as the
    one table formatter writes them (ui.people: durations written out, verdicts in words, ...), without a job key
    that only repeats the job id (ui.without_repeated_keys)."""
    expected = ui.without_repeated_keys(expected)
    columns = [c for c in columns or expected.columns if c in expected.columns]
    assert "job_key" not in shown.columns or "job_key" in expected.columns
    expected = ui.people(expected)
    assert len(shown) == expected.height, (len(shown), expected.height)
    for col in columns:
        got, want = shown[col].tolist(), expected[col].to_list()
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if not same(g, w)]
        assert not bad, f"column {col}: (row, shown, analytics) {bad[:5]}"


# --- every page shows the analytics' figures ---


def test_fleet_now(store, con, use_store):
    use_store(store)
    at = open_app()
    states = fn.gpu_states(con, W, T(12))
    s = fn.summarize(states, W, T(12))
    m = metrics(at)
    # physical GPUs: F's MIG instance is part of GPU-F; D is lost and C silent, so not reporting
    assert m["GPUs reporting"] == f"{s.reporting} of {s.gpus}" == "4 of 6"
    # GPU equivalents, said once above the figures (labels with the unit were cut in the browser): A + B + E + F's 3g.40gb slice (3/7)
    assert "Held, free, unsliced, idle and no-process figures are in GPU equivalents: a MIG instance counts as its share" in at.caption[0].value
    assert m["Held by jobs"] == ui.gpus(s.held) == "3.43"
    assert m["Free (reporting, not held)"] == ui.gpus(s.free) == "0"
    assert m["Mean utilization"] == ui.pct(s.mean_utilization_pct)
    assert m["Idle allocated now"] == "1"
    assert m["Idle allocated cost"] == "$3.00/h" == f"{ui.usd(s.idle_allocated_usd_per_h)}/h"
    assert m["Held with no process"] == "1"
    assert m["Lost / error / no data (GPUs)"] == f"{s.lost} / {s.error} / {s.no_data}" == "1 / 0 / 1"
    # the table of every GPU is made once its expander is opened
    with pytest.raises(KeyError):
        at.container("fleet_gpus")
    opened(at, "fleet_gpus")
    assert_table(frame(at, "fleet_gpus"), states.rename({"util": "utilization_pct"}), ["host", "gpu", "gi", "status", "utilization_pct", "job_ids",
                                                                                      "job_names", "user_names", "accounts", "held", "compute_processes"])
    assert frame(at, "fleet_gpus")["compute_processes"].dropna().tolist() == [1, 0, 1, 1]
    for key in ("fleet_gpus", "fleet_idle"):  # process counts are integers, shown as 1, not 1.00
        cfg = json.loads(at.container(key).dataframe[0].proto.columns)["compute_processes"]["type_config"]
        assert cfg["format"] == "localized", (key, cfg)
    for key in ("fleet_gpus", "fleet_idle", "fleet_no_process"):  # utilization headed and written as every table's: "utilization %", 0.0 %
        column = json.loads(at.container(key).dataframe[0].proto.columns)["utilization_pct"]
        assert (column["label"], column["type_config"]["format"]) == ("utilization %", "%.1f %%"), (key, column)
    idle = frame(at, "fleet_idle")
    assert idle["host"].tolist() == ["n1"] and idle["job_ids"].tolist() == ["102"] and idle["cost_usd_per_h"].tolist() == [3.0]
    # B was never busy in the look-back: idle since before its first sample, at least 2 h
    assert idle["idle_since_text"].tolist() == ["before 2026-11-16 10:00:00 UTC"] and idle["idle_for_s"].tolist() == [7200.0]  # a number (sorts by value), written "2 h" (ui.display_text)
    assert frame(at, "fleet_no_process")["job_ids"].tolist() == ["102"]
    problems = frame(at, "fleet_problems")
    assert sorted(zip(problems["host"], problems["gpu"], problems["status"])) == [("n2", 0, "no data"), ("n2", 1, "lost")]
    assert problems.set_index("status").loc["lost", "last_xid"] == "79"
    assert m["Exporters silent"] == "0 of 4"  # n2's D is lost but still reporting


def test_utilization(store, a, use_store):
    use_store(store)
    at = goto(open_app(), "utilization")
    t = a.totals()
    m = metrics(at)
    assert m["Utilization"] == ui.pct(t.utilization_pct)
    assert m["Busy"] == ui.gpu_h(t.busy_gpu_h)
    assert m["Allocated"] == ui.gpu_h(t.allocated_gpu_h)
    assert m["Capacity"] == ui.gpu_h(t.capacity_gpu_h)
    assert m["With data"] == ui.gpu_h(t.data_gpu_h)
    assert m["No data"] == ui.gpu_h(t.no_data_gpu_h)
    assert_table(frame(at, "util_by"), a.utilization("fleet"))
    opened(at, "util_timeline")
    assert_table(frame(at, "util_timeline"), utilization_timeline(a, "fleet"))
    for choice, by in (("account", "account"), ("user", "user_name"), ("model", "model"), ("partition", "partition")):
        at.button_group(key="by").set_value(choice).run()
        clean(at)
        u = a.utilization(by)
        rank = "capacity_gpu_h" if "capacity_gpu_h" in u.columns else "allocated_gpu_h"
        assert_table(frame(at, "util_by"), as_page(u.sort(rank, descending=True, nulls_last=True)))
        assert_table(frame(at, "util_timeline"), utilization_timeline(a, by))


def test_jobs_list_and_reports(store, con, a, use_store):
    from gpufleet.analytics.jobs import job_not_in_window

    use_store(store)
    at = goto(open_app(), "jobs")
    jobs = job_summaries(a)
    assert_table(frame(at, "jobs_list"), jobs, ["job_id", "name", "user_name", "account", "runtime_h", "allocated_gpu_h",
                                                "mean_utilization_pct", "idle_gpu_h", "no_process_gpu_h", "verdict"])
    assert metrics(at)["Jobs"] == f"{jobs.height} of {jobs.height}"
    full = Analysis(con, W, now=T(12))  # the report on the whole window; the page narrows it to the job
    for job_id in ("102", "101", "103", "105", "p1"):
        at.text_input(key="job").set_value(job_id).run()
        clean(at)
        r = job_report(full, job_id)
        m = metrics(at)
        assert m["Verdict"] == words.verdict(r.verdict)
        assert m["Allocated"] == ui.gpu_h(r.allocated_gpu_h)
        assert m["Mean utilization"] == ui.pct(r.mean_utilization_pct)
        assert m["Idle (stretches)"] == ui.gpu_h(r.idle_gpu_h)
        assert m["Held with no process"] == ui.gpu_h(r.no_process_gpu_h)
        assert m["Runtime in window"] == ui.duration(r.runtime_h * 3600)
        assert f"Rule: {r.rule}" in [t.value for t in at.text]
        assert_table(frame(at, "job_gpus"), r.per_gpu)
        if r.idle_stretches.is_empty():
            assert not at.container("job_idle").dataframe
        else:
            assert_table(frame(at, "job_idle"), r.idle_stretches)
        # where the time went: the analytics' breakdown of the job (gpufleet.analytics.states)
        js = job_breakdown(con, W, r.job["job_key"], Thresholds.of(W, {o.key: o.default for o in STATE_OPTIONS}))
        if js is None or js.data_s == 0:
            assert not at.container("job_states").dataframe
        else:
            assert_table(frame(at, "job_states"), js.table().with_columns(pl.col("state").replace(words.STATES)))  # states in words
            assert not set(frame(at, "job_states")["state"]) & set(words.STATES) - set(words.STATES.values())
            assert sum(frame(at, "job_states")["share_pct"]) == pytest.approx(100)
            assert any("counts once, in the first state that matches (startup, no process, idle," in c.value for c in at.caption)
        foreign = "Other jobs' processes on this job's GPUs: " + ("n1:0 (up to 2)" if job_id == "101" else "none reported")
        assert foreign in [t.value for t in at.text], job_id
    # a job typed that is not in the window: the page says whether the store has it (it said "No job with that id in this window")
    at.text_input(key="job").set_value("nosuchjob").run()
    assert [i.value for i in clean(at).info] == [words.sentence(job_not_in_window(con, W, "nosuchjob"))]
    assert at.info[0].value.startswith("Job nosuchjob: the store has no job of that id or key")


def test_a_job_s_report_is_drawn_above_the_window_s_list_and_a_row_selected_names_its_job(store, a, use_store):
    """The job asked for (typed, in the URL, or a row selected) has its report at the top, read for it alone before the
    window's list is computed (at 16,384 GPUs in a real browser: its report at 1.4-3.3 s, the list at ~39 s; it came after
    the list, at ~35 s); a row selected in the list puts its job id in the report's box (jobs.pick_row, on_select)."""
    from gpufleet.dashboards.views import jobs as page

    use_store(store)
    at = goto(open_app(), "jobs")
    assert [h.value for h in at.subheader] == ["Jobs in the window", "Idle-GPU policy"]
    at.text_input(key="job").set_value("101").run()
    heads = [h.value for h in clean(at).subheader]
    assert heads[0] == "Job report" and heads.index("Job report") < heads.index("Jobs in the window") < heads.index("Idle-GPU policy")
    assert "Job: 101" in [t.value for t in at.text]
    # the list's on_select: the selected row's job id into the box and its key beside it (a job id two clusters share
    # reports the row's job); no selection, or a stale one past the rows, leaves both
    row = {"job_id": "103", "cluster": "c2", "scheduler": "slurm", "job_key": "103"}
    shown = [{"job_id": "102", "cluster": "c1", "scheduler": "slurm", "job_key": "102"}, {**row, "cluster": "c1"}, row]
    state = {page.SHOWN_KEY: shown, page.ROWS_KEY: {"selection": {"rows": [2], "columns": []}}, "job": "101"}
    page.pick_row(state)
    assert state["job"] == "103" and state[page.PICKED_KEY] == row
    for selection in ({"selection": {"rows": [], "columns": []}}, {"selection": {"rows": [7], "columns": []}}, None):
        state = {page.SHOWN_KEY: shown[:1], page.ROWS_KEY: selection, "job": "101"}
        page.pick_row(state)
        assert state["job"] == "101" and page.PICKED_KEY not in state
    # the page reports the picked row's job by its key while the box names it; a key no longer in the window (the window
    # moved since) falls back to the name
    at.session_state[page.PICKED_KEY] = {**row, "job_id": "101"}
    at.run()
    assert "Job: 101" in [t.value for t in clean(at).text]
    real = job_summaries(a).filter(pl.col("job_id") == "103").select(page.JOB_IDENTITY).row(0, named=True)
    at.session_state[page.PICKED_KEY] = real
    at.text_input(key="job").set_value("103").run()
    assert "Job: 103" in [t.value for t in clean(at).text]


def test_teams_and_fairness(store, a, use_store):
    from gpufleet.analytics import fairness

    use_store(store)
    at = goto(open_app(), "teams")
    f = fairness.fairness(a, None)
    m = metrics(at)
    assert m["Jain's index"] == f"{f.jain_index:.3f}"
    assert m["Gini of GPU-hours over users"] == f"{f.gini_users:.3f}"
    assert m["Jobs pending now"] == ui.count(f.pending.height)
    assert_table(frame(at, "fair_accounts"), as_page(f.per_account))
    assert_table(frame(at, "fair_wait"), f.wait_by_size)
    if f.pending.height:
        assert_table(frame(at, "fair_pending"), ui.without_repeated_keys(f.pending))


def test_waste_and_cost(store, con, a, use_store):
    use_store(store)
    at = goto(open_app(), "waste")
    t, base = a.totals(), previous_baseline(con, W)
    m = metrics(at)
    assert m["Idle allocated"] == ui.gpu_h(t.idle_allocated_gpu_h)
    assert m["Idle allocated cost"] == ui.usd(t.idle_allocated_cost)
    assert m["Held with no process"] == ui.gpu_h(t.no_process_gpu_h)
    assert m["No-process cost"] == ui.usd(t.no_process_cost)
    assert m["Stranded (unallocated)"] == ui.gpu_h(t.stranded_gpu_h)
    assert m["Stranded cost"] == ui.usd(t.stranded_cost)
    # the previous window [08:00, 10:00) has no samples (the store starts at 10:00): no data, not +2.00 GPU-h
    assert base.no_comparison == "empty: no GPU samples in the previous window"
    deltas = {x.label: x.delta for x in at.metric}
    for label in ("Idle allocated", "Idle allocated cost", "Held with no process", "No-process cost", "Stranded (unallocated)", "Stranded cost"):
        assert deltas[label] == "no data for the previous window", label
    assert "No data to compare against: empty: no GPU samples in the previous window" in [x.value for x in at.text]
    trend = frame(at, "waste_trend")
    assert_table(trend, ui.trend_table(compare(t, base.totals, base.no_comparison)))
    # no previous figure, no change: "no data" in their place, never 0 beside it
    assert set(trend["previous window"]) == set(trend["change"]) == set(trend["change %"]) == {NO_DATA}
    assert_table(frame(at, "waste_by_account"), a.waste_by("account", "idle"))
    assert_table(frame(at, "waste_by_user"), a.waste_by("user_name", "idle"))
    assert_table(frame(opened(at, "waste_np"), "waste_np_account"), a.waste_by("account", "no_process"))
    assert_table(frame(at, "waste_top_jobs"), a.top_wasteful_jobs(25).drop(["scheduler"], strict=False))
    assert frame(at, "waste_top_jobs")["job_id"].tolist()[0] == "102"  # 2 h idle with no process
    # the goodput waterfall: analytics.goodput's steps, the fleet's capacity and allocated the totals'
    from gpufleet.analytics import goodput

    g = goodput.compute(a, con, W, as_of=T(12))
    fall = frame(at, "waste_waterfall")
    assert list(fall["step"]) == [goodput.STEP_LABELS[s] for s in goodput.STEPS]
    assert_table(fall, pl.DataFrame(goodput.chart_rows(g["fleet"])), ["step", "gpu_h", "cost"])
    # what went between steps: none before the first (a dash, not "unknown"), then each drop in GPU-hours
    assert list(fall["dropped_gpu_h"]) == [words.NONE, *(words.gpu_h(r["dropped_gpu_h"]) for r in goodput.chart_rows(g["fleet"])[1:])]
    assert [r["gpu_h"] for r in g["fleet"][:2]] == [t.capacity_gpu_h, pytest.approx(t.allocated_gpu_h)]
    assert len(frame(at, "waste_waterfall_teams")) == len(g["teams"])


def test_a_team_s_waterfall_starts_at_its_allocated_time(store, use_store):
    """Under a team filter capacity is not attributable: the waterfall starts at allocated (it read "unknown" for capacity
    and for what went before allocated), and the comparison says "not attributable" for stranded, as the metrics do."""
    from gpufleet.analytics import goodput

    use_store(store)
    at = goto(open_app(account="physics"), "waste")
    fall = frame(at, "waste_waterfall")
    assert list(fall["step"]) == [goodput.STEP_LABELS[s] for s in goodput.STEPS[1:]]
    assert fall["dropped_gpu_h"].tolist()[0] == words.NONE
    assert any(c.value.startswith("It starts at allocated: unallocated capacity has no account") for c in at.caption)
    trend = frame(at, "waste_trend").set_index("figure")
    assert trend.loc["stranded (unallocated) GPU-hours", "this window"] == "not attributable"


def test_health(store, con, use_store):
    use_store(store)
    at = goto(open_app(), "health")
    s = fn.summarize(fn.gpu_states(con, W, T(12)), W, T(12))
    ev = ahealth.events(con, W)
    m = metrics(at)
    assert m["Lost now"] == ui.count(s.lost) == "1"
    assert m["Erroring now"] == ui.count(s.error)
    assert m["Silent now (no data)"] == ui.count(s.no_data) == "1"
    assert m["Events in window"] == ui.count(ev.height) == "3"
    # a lost GPU's samples name no model: its event takes the inventory's, as its other events have it
    assert ev["model"].null_count() == 0 and "gpu_lost" in ev["kind"].to_list()
    assert m["Hottest GPU"] == "85 °C"
    assert m["GPUs throttled"] == "1"
    # the temperature map's colours on a fixed scale, not the window's own range (a healthy 70 C read alarm red)
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert spec["encoding"]["color"]["scale"] == {"scheme": "redyellowblue", "reverse": True, "domain": [30, 90], "clamp": True}
    shown = frame(at, "health_events")
    assert_table(shown, ui.with_event_codes(ev), ["ts", "host", "gpu", "kind", "code", "samples", "detail"])
    # each kind in words; an XID's code; a dash, not "unknown", for the kinds that have none (this store has XIDs and other kinds)
    assert {"XID"} < set(shown["kind"]) and set(shown["kind"]) == {words.EVENTS[k] for k in ev["kind"]}
    assert {k: set(shown[shown["kind"] == words.EVENTS[k]]["code"]) for k in set(ev["kind"])} == {
        k: ({str(c) for c in ev.filter(pl.col("kind") == k)["code"]} if k == "xid" else {words.NONE}) for k in set(ev["kind"])}
    assert frame(at, "health_throttle")["host"].tolist() == ["n2"]
    foreign = ahealth.foreign_processes(con, W)
    assert foreign.select("host", "gpu_uuid", "foreign_processes_max", "samples").rows() == [("n1", "GPU-A", 2.0, 20)]
    assert_table(frame(at, "health_foreign"), foreign)
    assert_table(frame(opened(at, "health_gpus"), "health_gpus"), ahealth.gpu_health(con, W).with_columns(
        pl.col("xids").cast(pl.List(pl.Utf8)).list.join(", ")))


def test_fleet_now_and_health_of_one_moment_share_the_gpu_states(store, use_store, monkeypatch):
    """The states at a fixed window's end are computed once for both pages (at 16,384 GPUs they
    are a third of the Health page's first load), and the key holds all they depend on."""
    import streamlit as st_

    calls = []
    real = fn.gpu_states
    monkeypatch.setattr(fn, "gpu_states", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    st_.cache_data.clear()
    use_store(store)
    at = open_app(to="2026-11-16T11:30")
    goto(at, "utilization")
    goto(at, "health")
    assert calls == [T(11, 30)]
    assert metrics(at)["Lost now"] == ui.count(fn.summarize(real(open_reader(store), W, T(11, 30)), W, T(11, 30)).lost)


def test_health_lists_the_inputs_the_collector_did_not_recognize(tmp_path, use_store):
    from gpufleet.collector.schema import Unrecognized

    w = StoreWriter(tmp_path / "s", clock=lambda: T(11))
    w.note_unrecognized("scrape", [Unrecognized("http://n9:9100/metrics", "no_gpu_rows", "121 bytes, no GPU series; families: node_load1")])
    w.publish()
    w.close()
    use_store(tmp_path / "s")
    at = goto(open_app(), "health")
    shown = frame(at, "health_unrecognized")
    assert shown[["source", "input", "kind", "count"]].values.tolist() == [["scrape", "http://n9:9100/metrics", "no_gpu_rows", 1]]
    assert "node_load1" in shown["detail"][0] and shown["last_seen"][0] == f"{T(11):%Y-%m-%d %H:%M:%S}"  # (UTC, said in the header)
    assert "Inputs the collector did not recognize" in [h.value for h in at.subheader]


def test_mfu(store, a, use_store):
    use_store(store)
    at = goto(open_app(), "mfu")
    from gpufleet.analytics import mfu

    jobs = mfu.job_mfu(a)
    # most GPU-hours first (the page shows the first ui.MAX_ROWS)
    shown = frame(at, "mfu_jobs")
    assert_table(shown, jobs.sort("gpu_h", descending=True, nulls_last=True, maintain_order=True),
                 ["job_id", "account", "mfu", "method", "reason"])
    # the column it is sorted by stands before the method's long text (at a page's width it was off to the right)
    assert list(shown.columns).index("gpu_h") < list(shown.columns).index("mfu") < list(shown.columns).index("method")
    assert_table(frame(at, "mfu_accounts"), mfu.account_mfu(a, jobs), ["account", "jobs", "mfu", "method"])



def test_a_page_computes_the_window_s_figures_it_shows_alone(store, use_store, monkeypatch):
    """Each page's bundle holds the figures it shows (data.PAGE_FIGURES) and no other page's, so a page's first load does
    not wait for the others'; where two pages show a figure, both bundles hold the same. The window's job attempts are
    read for the Waste page's goodput waterfall alone (counted), and the window's Analysis once for every page (counted),
    closed when the cache lets it go; a figure two pages show is computed once."""
    import duckdb

    from gpufleet.dashboards import data

    use_store(store)
    data.settings.clear()
    data.window_bundle.clear()
    data.window_analysis.clear()
    data.reliability_read.clear()
    reads, analyses = [], []
    real = data.reliability_read
    monkeypatch.setattr(data, "reliability_read", lambda key: reads.append(key) or real(key))
    analysis = data.Analysis
    monkeypatch.setattr(data, "Analysis", lambda *a, **k: analyses.append(a[1]) or analysis(*a, **k))
    w = data.make_window(data.current_settings(), preset=None, start=T(10), end=T(12), filters=Filters())
    figures = {"totals", "utilization", "timeline", "waste", "top_jobs", "jobs", "fairness", "mfu", "goodput", "states", "previous",
               "queue_gaps"}
    needs = {"goodput": {"mfu", "states"}}  # (the waterfall takes them in)
    bundles, attempts_read = {}, 0
    for page, shows in data.PAGE_FIGURES.items():
        b = bundles[page] = data.window_bundle(w.key, page)
        made = shows | {n for f in shows for n in needs.get(f, ())}
        assert {f for f in figures if getattr(b, f) is not None} == made, page
        attempts_read += page == "waste"
        assert len(reads) == attempts_read, (page, reads)
    assert len(analyses) == 1, analyses
    shared = data.window_analysis(w.key)
    data.window_analysis.clear()
    with pytest.raises(duckdb.ConnectionException):
        shared.analysis.con.execute("SELECT 1")
    for f in ("totals", "utilization", "states"):
        held = [b for b in bundles.values() if getattr(b, f) is not None]
        assert len(held) >= 2, f
        for x in held[1:]:
            assert getattr(x, f) is getattr(held[0], f), f  # (computed once, on the window's one Analysis)
            if f == "totals":
                assert x.totals == held[0].totals
            elif f == "states":
                assert_frame_equal(x.states.jobs, held[0].states.jobs)
            else:
                for by, frame_ in held[0].utilization.items():
                    assert_frame_equal(x.utilization[by], frame_)


def test_two_pages_of_one_window_computed_at_once_take_turns_on_its_analysis(store, use_store):
    """Two sessions opening the Jobs and Teams pages of one window at once compute on its one Analysis in turn (its lock:
    one cursor, one statement at a time): both succeed, with one set of window states."""
    from concurrent.futures import ThreadPoolExecutor

    from gpufleet.dashboards import data

    use_store(store)
    data.settings.clear()
    data.window_bundle.clear()
    data.window_analysis.clear()
    w = data.make_window(data.current_settings(), preset=None, start=T(10), end=T(12), filters=Filters())
    with ThreadPoolExecutor(2) as pool:
        jobs, teams = pool.map(lambda page: data.window_bundle(w.key, page), ["jobs", "teams"])
    assert jobs.states_error is None and teams.fairness_error is None
    assert teams.states is jobs.states and not jobs.jobs.is_empty()


# imported by AppTest's run alone: Streamlit's server scans for components when its runtime starts, before it listens
APP_TEST_ONLY = {"streamlit.components.v2.manifest_scanner"}
FIRST_VISIT = f"""
import os, sys
from gpufleet.dashboards import serve
serve.preload([n for n in (*serve.page_imports(), *serve.ALSO) if not n.startswith(serve.OWN)])
from streamlit.testing.v1 import AppTest
at = AppTest.from_file({str(APP)!r}, default_timeout=600)
at.query_params.update({WINDOW!r})
before = set(sys.modules)
for page in {PAGES!r}:
    at.switch_page(f"views/{{page}}.py").run()
    assert not at.exception, (page, at.exception)
print(" ".join(sorted(m for m in set(sys.modules) - before if not m.startswith("gpufleet."))))
"""


def test_the_server_has_imported_what_every_page_s_first_visit_imports(store):
    """serve.py's preload (the pages' imports and ALSO) leaves a first visitor's pages nothing to import but gpufleet's
    own page modules: a table's pandas Styler compiling its templates, Altair reading a polars frame, a first page paid
    for them (~0.1 s of Fleet now's first load in Chromium). A library that moves its lazy imports fails this, naming them."""
    import subprocess
    import sys

    env = {**os.environ, "GPUFLEET_DASHBOARD_STORE": str(store)}
    env.pop("GPUFLEET_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", FIRST_VISIT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(done.stdout.split()) - APP_TEST_ONLY
    assert not imported, f"a first visit imported {sorted(imported)}: add them to dashboards/serve.py's ALSO"


def test_a_job_s_report_gives_its_row_of_the_window_s_mfu(store, use_store):
    """The Jobs page's report computes a job's figures on the job's own run (data.job_report), its
    MFU too - not waiting for the window's: each job's MFU there is its row of the MFU page's."""
    from gpufleet.dashboards import data

    use_store(store)
    data.settings.clear()
    w = data.make_window(data.current_settings(), preset=None, start=T(10), end=T(12), filters=Filters())
    b = data.window_bundle(w.key, "jobs")
    per_job = data.window_bundle(w.key, "mfu").mfu["jobs"]
    fields = ("cluster", "scheduler", "job_key", "job_id", "account", "user_name", "partition", "start", "end")
    seen = 0
    for job in b.jobs.iter_rows(named=True):
        res = data.job_report(b.window.key, {k: job.get(k) for k in fields})
        want = per_job.filter((pl.col("cluster") == job["cluster"]) & (pl.col("scheduler") == job["scheduler"])
                              & (pl.col("job_key") == job["job_key"]))
        if res is None:  # (no GPU inside the window)
            continue
        assert res["mfu_error"] is None
        assert (res["mfu"] is None) == want.is_empty(), job["job_id"]
        if res["mfu"] is not None:
            seen += 1
            for k, v in want.row(0, named=True).items():
                got = res["mfu"][k]
                assert same(got, v), (job["job_id"], k, v, got)
    assert seen >= 2


def test_reliability(tmp_path, use_store):
    from gpufleet.analytics import reliability_store, vocabulary as words
    from gpufleet.analytics.params import Filters
    from gpufleet.analytics.scope import reliability_model_note
    from tests.test_reliability import _t, build_store

    f = build_store(tmp_path / "rel")
    use_store(f.root)
    at = goto(open_app(**{"from": "2026-11-16T00:00", "to": "2026-11-16T09:00"}), "reliability")
    rel = reliability_store.report(f.reader(), Params(_t(0), _t(9)), as_of=_t(9))
    assert metrics(at)["Interruptions"] == "2" and metrics(at)["Hardware"] == "1"
    # a GPU model filter selects no attempt: the page says so under one (the report's model_note), and nothing without
    assert not any("does not narrow it" in c.value for c in at.caption)
    by_model = goto(open_app(**{"from": "2026-11-16T00:00", "to": "2026-11-16T09:00", "model": "A100"}), "reliability")
    assert words.sentence(reliability_model_note(Filters(model="A100"))) in [c.value for c in by_model.caption]
    assert metrics(by_model)["Interruptions"] == "2"
    shown = frame(at, "reliability_interrupted")
    assert list(shown["job_id"]) == [a["job_id"] for a in rel["interrupted_attempts"]] == ["1", "2"]
    assert "XID 79 (GPU fell off the bus) on n1 GPU 1" in shown["reason"].iloc[0]
    assert dict(zip(frame(at, "reliability_causes")["cause"], frame(at, "reliability_causes")["attempts"])) == {
        "completed": 1, "user error": 1, "hardware": 1, "node failure": 1, "cancelled by gpufleet policy": 1, "not ended": 1}
    assert list(frame(at, "reliability_mttf")["size"]) == [row["size"] for row in rel["figures"]["mttf_by_size"]]
    # goodput: the report's ETTR (3 / 11), the waterfall of allocated GPU-hours (lost by cause, the rest), the chains that lost most
    assert metrics(at)["Fleet ETTR"] == "27.3 %" == ui.pct(100 * rel["goodput"]["ettr"])
    fall = frame(at, "reliability_waterfall")
    assert list(fall["part"]) == ["allocated", "lost: hardware", "lost: node failure", "not lost"]
    assert list(fall["gpu_hours"]) == pytest.approx([10, -4, -1, 5])
    assert [c.split(", ") for c in frame(at, "reliability_chains")["job_ids"]] == [ch["job_ids"] for ch in rel["chains"]]
    assert set(frame(at, "reliability_chains")["lost_basis"]) == {"upper bound"}  # no job reported a checkpoint
    # checkpoint advice for the largest chains: none without a reported checkpoint cost, and the page says why
    advice = frame(at, "reliability_advice")
    assert [c.split(", ") for c in advice["job_ids"]] == [x["job_ids"] for x in rel["checkpoint_advice"]] and len(advice)
    assert set(advice["advice"]) == {"no advice: no checkpoint reports: the job's checkpoint cost is unknown"}


def test_long_tables_show_their_first_rows_and_say_so(store, a, use_store, monkeypatch):
    """A table longer than ui.MAX_ROWS shows its first rows in the page's order and says how many
    there are and how to see the others (the jobs list and MFU's per-job table)."""
    from gpufleet.analytics import mfu
    from gpufleet.dashboards import ui

    monkeypatch.setattr(ui, "MAX_ROWS", 2)
    use_store(store)
    at = goto(open_app(), "mfu")
    jobs = mfu.job_mfu(a).sort("gpu_h", descending=True, nulls_last=True, maintain_order=True)
    assert jobs.height > 2
    assert_table(frame(at, "mfu_jobs"), jobs.head(2), ["job_id", "gpu_h"])
    assert f"The first 2 of {jobs.height} (most GPU-hours first); filter by account or user to see others." in [c.value for c in at.caption]
    at = goto(at, "jobs")
    assert len(frame(at, "jobs_list")) == 2
    assert any(c.value.startswith("The first 2 of ") and "narrow the search" in c.value for c in at.caption)

# --- hostile text ---

MARKDOWN_LIKE = ("title", "header", "subheader", "markdown", "caption", "info", "warning", "success")


def markdown_texts(at: AppTest) -> list[str]:
    out = []
    for kind in MARKDOWN_LIKE:
        out += [str(e.value) for e in getattr(at, kind)]
    return out + [m.label for m in at.metric] + [str(m.value) for m in at.metric]


def test_the_reliability_page_and_the_goodput_waterfall_read_the_window_s_attempts_once(tmp_path, use_store, monkeypatch):
    """A window's job attempts are read once (data.reliability_read) for both that show them: the Waste page's bundle
    (the goodput waterfall) and then the Reliability page, of one resolved window (data.resolved: the seconds alike)."""
    from gpufleet.analytics import reliability_store
    from tests.test_reliability import build_store

    f = build_store(tmp_path / "rel")
    use_store(f.root)
    reads = []
    real = reliability_store.read
    monkeypatch.setattr(reliability_store, "read", lambda con, p, *a, **k: reads.append((p.start, p.end)) or real(con, p, *a, **k))
    at = goto(open_app(**{"from": "2026-11-16T00:00", "to": "2026-11-16T09:00"}), "waste")
    assert len(reads) == 1, reads
    goto(at, "reliability")
    assert metrics(at)["Interruptions"] == "2"
    assert len(reads) == 1, reads


def test_hostile_names_are_shown_verbatim_and_harmless(store, use_store):
    use_store(store)
    at = goto(open_app(), "jobs")
    names = dict(zip(frame(at, "jobs_list")["job_id"], frame(at, "jobs_list")["name"]))
    for job_id, name in HOSTILE.items():
        assert names[job_id] == name  # exactly: quotes, pipes, newline, tab, HTML
    users = frame(at, "jobs_list")["user_name"].tolist()
    assert EVE in users and QUOTE_ACCOUNT in frame(at, "jobs_list")["account"].tolist()
    # the report puts the name in plain text (st.text), never in Markdown
    for job_id in ("101", "103", "105"):
        at.text_input(key="job").set_value(job_id).run()
        clean(at)
        assert f"Name: {HOSTILE[job_id]}" in [t.value for t in at.text]
    at.text_input(key="job").set_value("102").run()
    texts = [t.value for t in at.text]
    assert f"Name: {HOSTILE['102']}" in texts
    for text in markdown_texts(at):
        for needle in ("<script", "DROP TABLE", "**bold**", "onerror", "javascript:", "second line"):
            assert needle not in text, (needle, text)
    # searching for SQL finds the job whose name it is, and nothing else happens
    at.text_input(key="q").set_value("'; DROP TABLE").run()
    clean(at)
    assert frame(at, "jobs_list")["job_id"].tolist() == ["102"]
    at.text_input(key="q").set_value("<script>").run()
    assert frame(at, "jobs_list")["job_id"].tolist() == ["101"]


def test_hostile_filter_values_are_bound_parameters(store, con, a, use_store):
    use_store(store)
    at = open_app(account=QUOTE_ACCOUNT)
    assert at.selectbox(key="account").value == QUOTE_ACCOUNT
    states = frame(opened(at, "fleet_gpus"), "fleet_gpus")
    assert states["gpu_uuid"].tolist() == ["GPU-E"] and states["accounts"].tolist() == [QUOTE_ACCOUNT]
    goto(at, "jobs")
    assert frame(at, "jobs_list")["job_id"].tolist() == ["105"]
    at = open_app(user=EVE)
    goto(at, "utilization")
    filtered = Analysis(con, Params(T(10), T(12), filters=Filters(user_name=EVE)), now=T(12))
    assert metrics(at)["Allocated"] == ui.gpu_h(filtered.totals().allocated_gpu_h) == "2.0 GPU-h"
    # a value that is in no list: it stays the filter (a bound parameter, never SQL text), matches
    # nothing, and says so - never silently the whole fleet (issue #13.2)
    at = open_app(account="x' OR '1'='1")
    assert at.selectbox(key="account").value == "x' OR '1'='1"
    assert any("does not know" in w.value for w in at.warning)
    assert fn.gpu_states(con, Params(T(10), T(12), filters=Filters(account="x' OR '1'='1")), T(12)).is_empty()


# --- filters carried across pages, in the URL ---


def test_filters_follow_the_user_across_pages(store, use_store):
    use_store(store)
    at = open_app(cluster="c1", account="physics")
    for page in PAGES[1:]:
        goto(at, page)
        assert at.query_params["account"] == "physics" and at.query_params["cluster"] == "c1"
        assert at.query_params["from"] == WINDOW["from"] and at.query_params["to"] == WINDOW["to"]
        assert any("filters: cluster=c1, account=physics" in t.value for t in at.text), page
    goto(at, "jobs")
    assert set(frame(at, "jobs_list")["account"]) == {"physics"}
    # (the browser writes a bound widget's new value into the URL; AppTest has no browser)
    at.selectbox(key="account").set_value(ui.ALL).run()
    assert set(frame(at, "jobs_list")["account"]) == {"physics", "biology", QUOTE_ACCOUNT, "ml"}


# --- empty stores and windows: messages, never tracebacks ---


def test_allocated_beyond_capacity_is_said_wherever_the_totals_are(tmp_path, use_store):
    """Jobs held GPUs no exporter reports: accounting's allocated exceeds the inventory's capacity, and capacity, stranded
    and no data count only the reported GPUs. `gpufleet analyze`, the Utilization and Waste pages and the weekly report say
    so (core.capacity_warnings); the goodput waterfall's note is the same words; a fleet whose GPUs are all reported says nothing."""
    from gpufleet.analytics import cli, goodput
    from gpufleet.analytics.core import capacity_warnings
    from gpufleet.report.model import gather
    from gpufleet.report.window import span_window
    from tests.support.fleet import Fleet

    f = Fleet(tmp_path / "store")
    f.gpu_series("n1", "GPU-a", T(10), T(12), util=50.0)
    f.job("1", account="physics", user="u", start=T(10), end=T(12), gpus=1, placements=[("n1", "GPU-a")])
    f.job("2", account="physics", user="u", start=T(10), end=T(12), gpus=2, placements=[])  # on n2, which has no exporter
    f.write()
    con = open_reader(f.root)
    t = Analysis(con, W, now=T(13)).totals()
    assert (t.allocated_gpu_h, t.capacity_gpu_h) == (pytest.approx(6.0), pytest.approx(2.0))
    (said,) = capacity_warnings(t)
    assert "exceeds capacity" in said and "6.0 GPU-h" in said and "2.0 GPU-h" in said
    assert said in cli.build_report(con, W, "account", 5, None, now=T(13))["warnings"]
    assert words.sentence(said) in gather(con, W, span_window(W.start, W.end), now=T(13)).notices
    assert goodput.compute(Analysis(con, W, now=T(13)), con, W, as_of=T(13))["notes"][0] == said
    use_store(f.root)
    at = open_app()
    for page in ("utilization", "waste"):
        at = goto(at, page)
        assert [w.value for w in at.warning if "exceeds capacity" in w.value] == [words.sentence(said)], page
        # said once: the goodput waterfall's caption (Waste) does not repeat it
        assert not [c.value for c in at.caption if "exceeds capacity" in c.value], page
    # under a job filter capacity is not attributable: nothing to compare
    assert not capacity_warnings(Analysis(con, Params(W.start, W.end, filters=Filters(account="physics")), now=T(13)).totals())


def test_a_fleet_whose_gpus_are_all_reported_has_no_capacity_warning(store, con):
    from gpufleet.analytics.core import capacity_warnings

    assert not capacity_warnings(Analysis(con, W, now=T(12)).totals())


def test_empty_store_every_page(tmp_path, use_store):
    StoreWriter(tmp_path / "empty").close()
    use_store(tmp_path / "empty")
    at = open_app()
    assert any("No GPU" in i.value for i in at.info)
    for page in PAGES[1:]:
        goto(at, page)
        assert at.info, page


def test_no_store_every_page(tmp_path, use_store):
    use_store(tmp_path / "nothing-here")
    at = open_app()
    assert any("No store to read yet" in i.value for i in at.info)
    for page in PAGES[1:]:
        goto(at, page)
        assert any("No store to read yet" in i.value for i in at.info), page


def test_window_without_data_every_page(store, use_store):
    use_store(store)
    at = open_app(**{"from": "2020-01-01T00:00", "to": "2020-01-02T00:00"})
    assert at.info
    for page in PAGES[1:]:
        goto(at, page)
        assert at.info, page


def test_bad_custom_window_falls_back_with_a_warning(store, use_store):
    use_store(store)
    at = open_app(**{"from": "yesterday", "to": "2026-11-16T12:00"})
    assert any("ISO 8601" in w.value for w in at.warning)


# --- configuration and sign-in ---


def test_config_error_is_a_message(tmp_path, store, use_store):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[dashboard]\nrefresh_seconds = "often"\n')
    use_store(store, cfg)
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The dashboard's configuration is not valid:"]
    assert "refresh_seconds = 'often': expected an integer number of seconds >= 0" in at.code[0].value


AUTH = """
[dashboard]
allowed_domains = ["example.org"]
[dashboard.auth]
redirect_uri = "http://localhost:8501/oauth2callback"
cookie_secret = "not-a-real-secret-but-long-enough-0123456789"
client_id = "gpufleet"
client_secret = "secret"
server_metadata_url = "https://id.example.org/.well-known/openid-configuration"
"""


def test_sign_in_gate(tmp_path, store, use_store):
    cfg = tmp_path / "auth.toml"
    cfg.write_text(AUTH)
    use_store(store, cfg)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.user = {"is_logged_in": False}
    at.run()
    assert not at.exception and [b.label for b in at.button] == ["Sign in"] and not at.metric
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.user = {"is_logged_in": True, "email": "mallory@elsewhere.net"}
    at.run()
    assert at.warning and not at.metric and "Signed in as: mallory@elsewhere.net" in [t.value for t in at.text]
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.user = {"is_logged_in": True, "email": "ops@example.org"}
    at.query_params.update(WINDOW)
    at.run()
    clean(at)
    assert metrics(at)["GPUs reporting"] == "4 of 6"
    assert "Signed in as ops@example.org" in [t.value for t in at.sidebar.text]


# --- issue #13.6: one money format on the dashboards ---

USD = re.compile(r"^\u2212?\$(0|[1-9]\d{0,2}(,\d{3})*)\.\d\d$")


def test_dashboard_money_has_one_format_with_cents():
    assert ui.usd(4724) == "$4,724.00" and ui.usd(945.527) == "$945.53" and ui.usd(-3) == "\u2212$3.00"
    assert ui.usd(None) == ui.usd(float("nan")) == "unknown"
    assert ui.USD_COLUMN == "dollar"  # tables: Streamlit's "$1,234.57", the same format
    assert ui.USD_D3 == "$,.2f"  # chart tooltips: d3's "$1,234.57"


@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_dashboard_money_format_is_cents_and_reads_back(v):
    s = ui.usd(v)
    assert USD.match(s), s
    assert abs(float(s.replace("\u2212", "-").replace("$", "").replace(",", "")) - v) <= 0.005 + 1e-9 * abs(v)


def test_every_amount_on_the_pages_has_the_one_format(store, use_store):
    use_store(store)
    at = open_app()
    seen, money_columns = [], []
    for page in PAGES:
        at = goto(at, page)
        for m in at.metric:
            for amount in re.findall(r"-?\$\d[\d,]*(?:\.\d+)?", f"{m.value} {m.delta or ''}"):
                seen.append(amount)
                assert USD.match(amount), (page, m.label, m.value)
        for df in at.dataframe:  # money columns are formatted as dollars ("$1,234.57")
            for name, c in json.loads(df.proto.columns or "{}").items():
                if any(k in name for k in ("cost", "usd", "price")):
                    money_columns.append(name)
                    assert (c.get("type_config") or {}).get("format") == ui.USD_COLUMN, (page, name, c)
    assert seen and money_columns  # Fleet now's idle cost, Waste's costs; their tables


def _duration_table_app():
    import polars as pl

    from gpufleet.dashboards import ui

    ui.table(pl.DataFrame({"host": ["a", "b", "c"], "idle_for_s": [7200.0, None, 46.0], "runtime_h": [2.8, 0.5, 10.0],
                           "idle_gpu_h": [1.25, None, 3.0]}), key="t")


def test_durations_sort_by_value_and_read_in_words():
    """A duration cell keeps its number (the grid sorts a header's column by its cells' data: 46 s
    before 2 h, where the text would sort "2 h" before "46 s") and shows the words: the pandas
    Styler's display text, which the grid shows for a number column without a format."""
    import pyarrow as pa

    at = AppTest.from_function(_duration_table_app).run()
    assert not at.exception, at.exception
    proto = at.container("t").dataframe[0].proto
    data = pa.ipc.open_stream(proto.arrow_data.data).read_all()
    shown = pa.ipc.open_stream(proto.arrow_data.styler.display_values).read_all()
    assert data.column("idle_for_s").to_pylist() == [7200.0, None, 46.0] and data.column("runtime_h").to_pylist() == [2.8, 0.5, 10.0]
    assert shown.column("idle_for_s").to_pylist() == ["2 h", words.UNKNOWN, "46 s"]
    assert shown.column("runtime_h").to_pylist() == ["2 h 48 min", "30 min", "10 h"]
    cfg = {k: v.get("type_config", {}) for k, v in json.loads(proto.columns).items() if v}
    assert "format" not in cfg["idle_for_s"] and "format" not in cfg["runtime_h"]  # (a format would hide the words)
    assert cfg["idle_gpu_h"]["format"] == "%,.1f" and data.column("idle_gpu_h").to_pylist() == [1.25, None, 3.0]


def _long_duration_table_app():
    import polars as pl

    from gpufleet.dashboards import ui

    n = 16_384  # a 16,384-GPU fleet's per-GPU table, 21 columns, one a duration: over the Styler's 262,144 cells
    ui.table(pl.DataFrame({"host": [f"h{i}" for i in range(n)], "idle_for_s": [float(i) for i in range(n)],
                           **{f"c{k}": list(range(n)) for k in range(19)}}), key="t", sort="most idle first")


def test_a_table_longer_than_its_rows_shows_the_first_and_says_so():
    """A table a page did not cut (Fleet now's and Health's per-GPU tables) shows its first
    MAX_ROWS rows and says how many there are: 16,384 GPUs' rows broke both pages (the pandas
    Styler that writes durations out refuses more than 262,144 cells)."""
    at = AppTest.from_function(_long_duration_table_app).run()
    assert not at.exception, at.exception
    assert at.container("t").dataframe[0].value.shape[0] == ui.MAX_ROWS
    assert f"The first {ui.MAX_ROWS:,} of 16,384 (most idle first); narrow the filters to see the others." in [
        c.value for c in at.container("t").caption]


def test_last_xid_is_none_when_reported_and_unknown_when_not():
    states = pl.DataFrame({"last_xid": [79, None, None], "xid_last": [0, 0, None]}, schema={"last_xid": pl.Int64, "xid_last": pl.Int64})
    assert ui.with_last_xid(states)["last_xid"].to_list() == ["79", "none", words.UNKNOWN]


def test_a_job_key_that_repeats_the_job_id_is_not_shown():
    """A Slurm job's key is its id (the same number in two columns); a pod's key is namespace/name, its id the name: kept."""
    slurm = pl.DataFrame({"job_key": ["101", "102"], "job_id": ["101", "102"], "gpus": [1, 2]})
    mixed = pl.DataFrame({"job_key": ["101", "research/nb-1"], "job_id": ["101", "nb-1"], "gpus": [1, 2]})
    assert ui.without_repeated_keys(slurm).columns == ["job_id", "gpus"]
    assert ui.without_repeated_keys(mixed).equals(mixed)
    assert ui.without_repeated_keys(slurm.drop("job_id")).columns == ["job_key", "gpus"]  # (no id: the key is the job's name)
    no_id = slurm.with_columns(pl.Series("job_id", ["101", None]))
    assert ui.without_repeated_keys(no_id).equals(no_id)  # a row without an id keeps its key
