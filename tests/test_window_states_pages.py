"""The window's states on the pages (AppTest, the scenario of tests/test_dashboard_pages.py): the
Jobs page's largest-loss column and the Teams page's per-team breakdown are
gpufleet.analytics.window_states' figures for the same window."""

from __future__ import annotations

import json

import polars as pl
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")

from gpufleet.analytics.jobs import job_summaries  # noqa: E402
from gpufleet.analytics.states import Thresholds  # noqa: E402
from gpufleet.analytics.window_states import window_states  # noqa: E402
from tests.test_dashboard_pages import W, a, assert_table, con, frame, goto, open_app, store, use_store  # noqa: E402,F401


def test_jobs_list_shows_each_jobs_largest_loss(store, a, use_store):
    use_store(store)
    at = goto(open_app(), "jobs")
    ws = window_states(a, Thresholds.of(W, {}))
    want = ws.with_largest_loss(job_summaries(a))
    assert want["largest_loss"].is_not_null().any()  # (the scenario has jobs that lose time)
    assert_table(frame(at, "jobs_list"), want, ["job_id", "largest_loss"])


def test_a_jobs_largest_loss_is_written_for_the_jobs_asked_alone(monkeypatch):
    """The Jobs page words the largest loss of the rows it shows, not of every job in the window (744k labels at 16,384
    GPUs took 2 s): each row's label is its row of the whole table's, and only those rows are written (counted)."""
    from gpufleet.analytics import vocabulary as words
    from gpufleet.analytics.window_states import WindowStates

    n = 100
    states = pl.DataFrame({"cluster": ["c"] * n, "scheduler": ["slurm"] * n, "job_key": [str(i) for i in range(n)],
                           "largest_loss": [("idle", "startup", None)[i % 3] for i in range(n)],
                           "largest_loss_share_pct": [i / 7 if i % 3 < 2 else None for i in range(n)]})
    ws = WindowStates(jobs=states, teams=pl.DataFrame(), fleet={})
    jobs = states.select("cluster", "scheduler", "job_key", pl.col("job_key").alias("job_id"))
    whole = ws.with_largest_loss(jobs)
    some = jobs.filter(pl.col("job_key").is_in(["3", "49", "51", "98"]))  # three with a loss (idle, startup, idle), one without
    written = []
    real = words.pct
    monkeypatch.setattr(words, "pct", lambda *args, **kw: written.append(args) or real(*args, **kw))
    got = ws.with_largest_loss(some)
    assert len(written) == 3  # 3, 49, 51 have a loss; 98 none
    assert got.to_dicts() == whole.filter(pl.col("job_key").is_in(["3", "49", "51", "98"])).to_dicts()
    assert got.filter(pl.col("job_key") == "3")["largest_loss"].item() == f"{words.state('idle')} {real(3 / 7)}"


def test_teams_page_shows_each_teams_breakdown(store, a, use_store):
    use_store(store)
    at = goto(open_app(), "teams")
    ws = window_states(a, Thresholds.of(W, {}))
    assert not ws.teams.is_empty()
    assert_table(frame(at, "team_states"), ws.teams)
    assert any("Checkpoint stalls, pauses and straggler shortfall: unknown at this grain, their time inside the busy states "
               "(input-bound to busy, not resolved): open the job." in c.value for c in at.caption)
    # a state's column is headed by the state, never by the figure of the same key: the state's idle is not "idle allocated"
    (table,) = at.container("team_states").dataframe
    heads = {name: c.get("label") for name, c in json.loads(table.proto.columns).items()}
    assert (heads["idle_gpu_h"], heads["idle_cost"], heads["no_process_gpu_h"]) == ("idle GPU-h", "idle $", "no process GPU-h")
    assert not [h for h in heads.values() if "idle allocated" in (h or "") or "waste" in (h or "")], heads
    assert any("counts once, in the first state that matches" in c.value for c in at.caption)
    # its rows by cluster, then account (the k8s teams after the hpc ones), and its caption says so (it said "by account")
    assert any(c.value.startswith("Sorted by cluster and account;") for c in at.container("team_states").caption)
    # each state one colour on every chart (ui.STATE_COLORS: compute green, not the default scheme's red), the legend the
    # states the chart shows
    from gpufleet.analytics import vocabulary as words
    from gpufleet.dashboards import ui

    assert set(ui.STATE_COLORS) == set(words.STATES) and ui.STATE_COLORS["compute"] == "#2ca02c"
    (chart,) = [c for c in at.get("vega_lite_chart") if json.loads(c.proto.spec)["encoding"]["color"]["field"] == "state"]
    scale = json.loads(chart.proto.spec)["encoding"]["color"]["scale"]
    key = {words.state(s): s for s in words.STATES}
    assert scale["domain"] and set(scale["domain"]) == set(ws.team_shares()["state"])
    assert all(color == ui.STATE_COLORS[key[state]] for state, color in zip(scale["domain"], scale["range"]))


def test_a_jobs_bar_stacks_its_states_in_the_legends_order():
    """The job page's bar reads left to right as its legend and the Teams page's bars (the states' own order), while its
    table lists them largest first: it stacked by the table's rows (idle | compute | checkpoint stalls | startup) beside a
    legend of startup, idle, checkpoint stalls, compute."""
    import polars as pl

    from gpufleet.analytics import vocabulary as words
    from gpufleet.dashboards.views.jobs import states_chart

    largest_first = pl.DataFrame({"state": [words.state(s) for s in ("idle", "compute", "checkpoint", "startup")],
                                  "share_pct": [66.2, 32.9, 0.9, 0.03], "gpu_h": [237.0, 117.7, 3.1, 0.1], "evidence": ["", "", "", ""]})
    spec = states_chart(largest_first).to_dict()
    legend = spec["encoding"]["color"]["scale"]["domain"]
    assert legend == [words.state(s) for s in ("startup", "idle", "checkpoint", "compute")]
    assert spec["encoding"]["order"]["field"] == "order"
    rows = next(iter(spec["datasets"].values()))
    assert [r["state"] for r in sorted(rows, key=lambda r: r["order"])] == legend


def test_teams_page_says_a_model_filter_does_not_narrow_fairness(store, a, use_store):
    """Under a GPU model filter the Teams page showed every team's fairness over every model without a word."""
    from gpufleet.analytics import vocabulary as words
    from gpufleet.analytics.params import Filters
    from gpufleet.analytics.scope import fairness_model_note

    use_store(store)
    model = a.utilization("model")["model"].drop_nulls()[0]
    at = goto(open_app(model=model), "teams")
    assert words.sentence(fairness_model_note(Filters(model=model))) in [c.value for c in at.caption]
    assert not any("does not narrow it" in c.value for c in goto(open_app(), "teams").caption)
