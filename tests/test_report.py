"""The weekly waste report (issue #7): every printed figure is the analytics' figure, hostile names
are escaped, no data is said as such, configuration errors name key, value and expectation.

The store: weeks 2026-W46 and 2026-W47 (UTC), samples every 15 s (H100 $3.00, A100 $1.80):

W47, Monday 2026-11-16
GPU        host  samples                                   holder
GPU-A      n1    09-13 h: 80 %, 0 % in [10:30, 11:15); 1 proc  job 101 physics/alice [10:30, 11:30)  name <script>...
GPU-C      n2    10-12 h: 0 %, no process                   job 103 "<b>bio</b> & co"/'"><img ...>' [10, 11)
GPU-F/1    n4    10-12 h: 60 % (A100 MIG 3g.40gb)           pod ml/p1 [10, 12)
GPU-G1     n5    10-12 h: 90 %, tensor active 0.4, 2 procs  job 106 physics/alice [10, 12), submitted 09:30
GPU-H      n7    10-12 h: 0 %, 1 proc                       job 107 physics/"eve\r\nBcc: ..." [10, 12)
W46, Monday 2026-11-09
GPU-A      n1    10-12 h: 30 %, 1 proc                      job 90 physics/alice [10, 12)
"""

from __future__ import annotations

import argparse
import io
import re
from dataclasses import replace
from datetime import datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.jobs import job_summaries
from gpufleet.analytics.params import Filters, Params
from gpufleet.report import fmt, model, pipeline, render
from gpufleet.report.config import load as load_report_config
from gpufleet.report.model import daily_points, gather
from gpufleet.report.window import last_complete_week, parse_week, span_window, week_window
from gpufleet.analytics.trends import NO_DATA, previous_baseline
from gpufleet.config import ConfigError
from tests.support.fleet import Fleet

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
NOW = datetime(2026, 11, 30, 12)  # after both weeks
HOSTILE_JOB = "<script>alert('x')</script>"
HOSTILE_USER = '"><img src=x onerror=alert(1)>'
HOSTILE_ACCOUNT = "<b>bio</b> & co"
CRLF_USER = "eve\r\nBcc: victim@evil.example"


def T(h: int, m: int = 0, day: int = 16) -> datetime:
    return datetime(2026, 11, day, h, m)


def between(a, b, inside, outside):
    return lambda t: inside if a <= t < b else outside


def build_store(root: Path) -> Fleet:
    f = Fleet(root)
    f.gpu_series("n1", "GPU-A", T(9), T(13), util=between(T(10, 30), T(11, 15), 0.0, 80.0), procs=1)
    f.gpu_series("n2", "GPU-C", T(10), T(12), util=0.0, procs=0, gpu=1)
    f.gpu_series("n4", "GPU-F", T(10), T(12), util=60.0, model=A100, gi=1, mig_profile="3g.40gb", procs=1)
    f.gpu_series("n5", "GPU-G1", T(10), T(12), util=90.0, procs=2, tensor=0.4)
    f.gpu_series("n7", "GPU-H", T(10), T(12), util=0.0, procs=1)
    f.job("101", account="physics", user="alice", start=T(10, 30), end=T(11, 30), gpus=1, placements=[("n1", "GPU-A")], name=HOSTILE_JOB)
    f.job("103", account=HOSTILE_ACCOUNT, user=HOSTILE_USER, start=T(10), end=T(11), gpus=1, placements=[("n2", "GPU-C")])
    f.job("ml/p1", account="ml", user="", start=T(10), end=T(12), gpus=1, gpu_type="mig-3g.40gb", scheduler="kubernetes",
          partition="ml", job_id="p1", placements=[("n4", "GPU-F", 1)])
    f.job("106", account="physics", user="alice", start=T(10), end=T(12), gpus=1, placements=[("n5", "GPU-G1")], submit=T(9, 30), name="train")
    f.job("107", account="physics", user=CRLF_USER, start=T(10), end=T(12), gpus=1, placements=[("n7", "GPU-H")], name="notebook")
    f.gpu_series("n1", "GPU-A", T(10, day=9), T(12, day=9), util=30.0, procs=1)
    f.job("90", account="physics", user="alice", start=T(10, day=9), end=T(12, day=9), gpus=1, placements=[("n1", "GPU-A")])
    f.write()
    return f


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Fleet:
    return build_store(tmp_path_factory.mktemp("report-store"))


def settings_for(root, **report) -> pipeline.Settings:
    return pipeline.load_settings({"collector": {"store": str(root)}, "report": report}, "test.toml")


@pytest.fixture(scope="module")
def w47():
    return week_window(2026, 47, "UTC")


@pytest.fixture(scope="module")
def outputs(store, w47):
    s = settings_for(store.root, team_recipients={"physics": ["lead@physics.example.org"]})
    return pipeline.make(s, w47, now=NOW, pdf=False)


class Figures(HTMLParser):
    """Collects the text of every element with data-fig, all start tags and attributes, and text."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.figs: dict[str, list[str]] = {}
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self._open: list[list] = []  # [key, depth, parts]
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.extend(attrs)
        for o in self._open:
            o[1] += 1
        key = dict(attrs).get("data-fig")
        if key is not None:
            self._open.append([key, 0, []])

    def handle_endtag(self, tag):
        for o in list(self._open):
            o[1] -= 1
            if o[1] < 0:
                self._open.remove(o)
                self.figs.setdefault(o[0], []).append("".join(o[2]).strip())

    def handle_data(self, data):
        self.text.append(data)
        for o in self._open:
            o[2].append(data)

    def one(self, key: str) -> str:
        vals = self.figs.get(key)
        assert vals, f"no figure {key!r} in the HTML; have {sorted(self.figs)[:40]}"
        assert len(set(vals)) == 1, (key, vals)
        return vals[0]


# --- every figure is the analytics' figure ---


def test_headline_equals_analytics_trend(store, w47, outputs):
    con = store.reader()
    params = Params(w47.start, w47.end)
    a = Analysis(con, params, now=NOW)
    cur = a.totals()
    base = previous_baseline(con, params, now=NOW)
    # W46 is only partly in the store (its history starts Monday 10:00): its figures are shown, no change against them
    assert base.no_comparison == "partial: the store's history starts 2026-11-09 10:00 UTC, inside the previous window from 2026-11-09 00:00 UTC"
    expected = base.compare(cur).to_dicts()
    report = outputs[0].report
    figs = Figures(outputs[0].html)
    text = outputs[0].text
    units = {h.figure: h.unit for h in report.headline}
    assert [h.figure for h in report.headline] == [r["figure"] for r in expected]
    for r, h in zip(expected, report.headline):
        key, unit = r["figure"], units[r["figure"]]
        assert h.missing is None and h.previous_missing is None, key
        assert h.current == pytest.approx(r["current"]) and h.previous == pytest.approx(r["previous"]), key
        assert (h.change, h.change_pct, h.change_missing, r["change"]) == (None, None, NO_DATA, None), key
        assert figs.one(f"headline.{key}.current") == fmt.value(r["current"], unit)
        assert figs.one(f"headline.{key}.previous") == fmt.value(r["previous"], unit)
        assert figs.one(f"headline.{key}.change") == NO_DATA
        assert figs.one(f"headline.{key}.change_pct") == ""
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(h.label))
        assert fmt.value(r["current"], unit) in line and fmt.value(r["previous"], unit) in line and NO_DATA in line, line
        assert "%" not in line.split(fmt.value(r["previous"], unit))[-1], line  # no percent change
    # the cards repeat four of them
    for key in ("idle_allocated_cost", "idle_allocated_gpu_h", "utilization_pct", "stranded_gpu_h"):
        assert figs.one(f"card.{key}") == fmt.value(getattr(cur, key), units[key])
        assert figs.one(f"card.{key}.change") == "vs last week: no data"
    assert any(n.startswith("No comparison with last week (2026-W46): partial: the store's history starts 2026-11-09 10:00 UTC")
               for n in report.notices), report.notices
    # worked by hand, so the formatter is not checking itself: idle = 101's 45 min + 103's 1 h + 107's 2 h
    assert cur.idle_allocated_gpu_h == pytest.approx(0.75 + 1 + 2)
    assert figs.one("headline.idle_allocated_gpu_h.current") == "3.8"
    assert figs.one("headline.idle_allocated_cost.current") == "$11.25"
    assert figs.one("headline.allocated_gpu_h.previous") == "2.0"  # job 90: 2 h on one GPU
    assert figs.one("headline.utilization_pct.previous") == "30.0 %"


def test_team_table_equals_analytics_by_account(store, w47, outputs):
    from gpufleet.analytics.fairness import fairness

    a = Analysis(store.reader(), Params(w47.start, w47.end), now=NOW)
    util = {r["account"]: r for r in a.utilization("account").to_dicts()}
    idle = {r["account"]: r for r in a.waste_by("account", "idle").to_dicts()}
    fair = {r["account"]: r for r in fairness(a, None).per_account.to_dicts()}
    figs = Figures(outputs[0].html)
    teams = outputs[0].report.teams
    assert {t.account for t in teams} == {"physics", HOSTILE_ACCOUNT, "ml"}
    # sorted by cost of idle time: physics (101 + 107: 2.75 h x $3) > bio (1 h x $3) > ml ($0)
    assert [t.account for t in teams] == ["physics", HOSTILE_ACCOUNT, "ml"]
    for t in teams:
        k = f"team.{t.account}"
        u, f = util[t.account], fair[t.account]
        i = idle.get(t.account, {"gpu_h": 0.0, "cost": 0.0})
        assert t.allocated_gpu_h == pytest.approx(u["allocated_gpu_h"]) and t.utilization_pct == pytest.approx(u["utilization_pct"])
        assert t.idle_gpu_h == pytest.approx(i["gpu_h"]) and t.idle_cost == pytest.approx(i["cost"])
        assert figs.one(f"{k}.allocated_gpu_h") == fmt.hours(u["allocated_gpu_h"])
        assert figs.one(f"{k}.utilization_pct") == fmt.pct(u["utilization_pct"])
        assert figs.one(f"{k}.idle_gpu_h") == fmt.hours(i["gpu_h"])
        assert figs.one(f"{k}.idle_cost") == fmt.usd(i["cost"])
        assert figs.one(f"{k}.entitled_share") == fmt.share(f["entitled_share"])
        assert figs.one(f"{k}.used_share") == fmt.share(f["used_share"])
        assert figs.one(f"{k}.ratio") == fmt.ratio(f["ratio"])
        assert figs.one(f"{k}.wait_p50_s") == fmt.duration(f["wait_p50_s"])
        assert figs.one(f"{k}.wait_p95_s") == fmt.duration(f["wait_p95_s"])
    assert figs.one("team.physics.idle_cost") == "$8.25"
    assert figs.one("team.physics.wait_p95_s") == fmt.duration(fair["physics"]["wait_p95_s"]) != "\u2013"
    assert figs.one("fairness.jain_index") == fmt.ratio(fairness(a, None).jain_index)


def test_wasteful_and_no_process_jobs_equal_analytics(store, w47, outputs):
    a = Analysis(store.reader(), Params(w47.start, w47.end), now=NOW)
    top = a.top_wasteful_jobs(10).to_dicts()
    names = {r["job_id"]: r["name"] for r in job_summaries(a).to_dicts()}
    report, figs = outputs[0].report, Figures(outputs[0].html)
    assert [j.job_id for j in report.wasteful_jobs] == [r["job_id"] for r in top] == ["107", "103", "101"]
    for r, j in zip(top, report.wasteful_jobs):
        k = f"job.c1/{r['job_id']}"
        assert (j.gpu_h, j.cost, j.gpus, j.user_name, j.account, j.name) == (r["idle_gpu_h"], r["idle_cost"], r["gpus"], r["user_name"], r["account"], names[r["job_id"]])
        assert figs.one(f"{k}.idle_gpu_h") == fmt.hours(r["idle_gpu_h"])
        assert figs.one(f"{k}.idle_cost") == fmt.usd(r["idle_cost"])
        assert figs.one(f"{k}.gpus") == str(r["gpus"])
        assert figs.one(f"{k}.runtime_h") == fmt.duration(r["runtime_h"] * 3600)
    assert figs.one("job.c1/103.idle_cost") == "$3.00"
    nop = a.waste_by("job", "no_process").to_dicts()
    assert [j.job_id for j in report.no_process_jobs] == [r["job_id"] for r in nop] == ["103"]
    assert figs.one("noproc.c1/103.gpu_h") == fmt.hours(nop[0]["gpu_h"]) == "1.0"
    assert figs.one("noproc.c1/103.cost") == "$3.00"
    # the text summary lists the same jobs with the same figures
    text = outputs[0].text
    for r in top:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(r["job_id"] + " "))
        assert fmt.hours(r["idle_gpu_h"]) in line and fmt.usd(r["idle_cost"]) in line


def test_the_no_process_list_is_cut_with_a_count_of_the_rest(store, w47, monkeypatch):
    """Only the first NO_PROCESS_LIST jobs are listed (and looked up in the job list); the rest
    are counted in "and N more jobs", so the listed and the more add up to every such job."""
    from gpufleet.report import model

    a = Analysis(store.reader(), Params(w47.start, w47.end), now=NOW)
    every = a.waste_by("job", "no_process").height
    for limit in (0, 1):
        monkeypatch.setattr(model, "NO_PROCESS_LIST", limit)
        listed, jobs = model.no_process_jobs(a, job_summaries(a))
        assert (len(listed), jobs) == (min(limit, every), every) == (limit, 1)
        report = gather(store.reader(), Params(w47.start, w47.end), w47, now=NOW)
        assert (len(report.no_process_jobs), report.no_process_more) == (limit, every - limit)


def test_mfu_daily_and_method_equal_analytics(store, w47, outputs):
    from gpufleet.analytics.mfu import account_mfu

    a = Analysis(store.reader(), Params(w47.start, w47.end), now=NOW)
    report, figs = outputs[0].report, Figures(outputs[0].html)
    acct = {(r["cluster"], r["account"]): r for r in account_mfu(a).to_dicts()}
    assert {(m.cluster, m.account) for m in report.mfu} == set(acct)
    known = [m for m in report.mfu if m.mfu_pct is not None]
    assert [m.account for m in known] == ["physics"]  # only job 106 has tensor activity
    for m in report.mfu:
        r = acct[(m.cluster, m.account)]
        assert m.method == r["method"] and m.gpu_h == pytest.approx(r["gpu_h"])
        if r["mfu"] is not None:
            assert figs.one(f"mfu.{m.cluster}/{m.account}.mfu_pct") == fmt.pct(r["mfu"] * 100)
            assert r["method"] in outputs[0].html
    # daily trend: each day is the analytics' figure of that day
    assert [p.day.isoformat() for p in report.daily] == [f"2026-11-{d}" for d in range(16, 23)]
    monday = Analysis(store.reader(), Params(T(0), T(0, day=17)), now=NOW).totals()
    assert report.daily[0].utilization_pct == pytest.approx(monday.utilization_pct)
    assert all(p.utilization_pct is None for p in report.daily[1:])
    assert f"{monday.utilization_pct:.1f}% of" in outputs[0].html  # the bar's tooltip
    # method notes: thresholds, prices, data gaps
    t = a.totals()
    assert figs.one("method.no_data_gpu_h") == fmt.hours(t.no_data_gpu_h)
    assert figs.one("method.capacity_gpu_h") == fmt.hours(t.capacity_gpu_h)
    assert figs.one("method.idle_threshold_pct") == "5%"
    assert figs.one("method.idle_min_duration_s") == "30 min"
    assert figs.one(f"price.{H100}") == "$3.00" and figs.one(f"price.{A100}") == "$1.80"
    gaps = {r["host"]: r["no_data_gpu_h"] for r in a.utilization("host").to_dicts() if r["no_data_gpu_h"] > 0}
    for host, h in gaps.items():
        assert figs.one(f"gap.{host}") == fmt.hours(h)


def _same(x, y) -> bool:
    return x is None if y is None else x == pytest.approx(y)


def test_daily_points_are_each_days_analysis(store, tmp_path):
    """The trend chart's days (the window analysis' timeline from the first local midnight, summed
    per day) equal an analysis of each day: a week in a zone whose days start on the half hour, a
    UTC week with an account filter and a day not over yet, a week whose clocks go back (a 25-hour
    Sunday: hour buckets), and windows that start and end off the local midnights (`--last 7d`:
    its first and last days clipped, to the second and in a half-hour zone)."""
    back = Fleet(tmp_path)  # 2026-10-25 01:00 UTC: Berlin's clocks go back; its local days start at 22:00 and 23:00 UTC
    back.gpu_series("d1", "GPU-D", datetime(2026, 10, 24, 20), datetime(2026, 10, 25, 4), procs=1,
                    util=between(datetime(2026, 10, 24, 21, 30), datetime(2026, 10, 25, 1, 30), 0.0, 70.0))
    back.job("500", account="physics", user="bob", start=datetime(2026, 10, 24, 21), end=datetime(2026, 10, 25, 3), gpus=1,
             placements=[("d1", "GPU-D")])
    back.write()
    berlin = week_window(2026, 43, "Europe/Berlin")
    assert timedelta(hours=25) in [e - s for _, s, e in berlin.days()]
    odd = T(10, 47, day=13) + timedelta(seconds=13, microseconds=5)  # a Friday 10:47:13, as `--last 7d` gives
    cases = [(store, week_window(2026, 47, "Asia/Kolkata"), NOW, None), (store, week_window(2026, 47, "UTC"), T(11, 20), "physics"),
             (back, berlin, NOW, None), (store, span_window(odd, odd + timedelta(days=7), "UTC"), NOW, None),
             (store, span_window(odd, odd + timedelta(days=7), "Asia/Kolkata"), T(11, 5), "physics"),
             (back, span_window(datetime(2026, 10, 24, 21, 40), datetime(2026, 10, 25, 2, 10), "Europe/Berlin"), NOW, None)]
    for fleet, w, now, account in cases:
        con, f = fleet.reader(), Filters(account=account)
        points = daily_points(Analysis(con, Params(w.start, w.end, filters=f), now=now), w, now)
        assert [p.day for p in points] == [d for d, _, _ in w.days()]
        assert sum(p.data_gpu_h for p in points) > 0, (w.label, account)
        for p, (day, s, e) in zip(points, w.days()):
            if s >= now:
                assert p.future
                continue
            t = Analysis(con, Params(s, e, filters=f), now=now).totals()
            for got, want in ((p.utilization_pct, t.utilization_pct), (p.busy_gpu_h, t.busy_gpu_h), (p.data_gpu_h, t.data_gpu_h),
                              (p.allocated_gpu_h, t.allocated_gpu_h)):
                assert _same(got, want), (w.label, w.tz, account, day, got, want)


def test_every_tagged_figure_was_checked_somewhere(outputs):
    """The HTML has no figure kinds the tests above do not know about."""
    kinds = {re.sub(r"^(\w+)\..*$", r"\1", k) for k in Figures(outputs[0].html).figs}
    assert kinds == {"card", "headline", "team", "fairness", "job", "noproc", "mfu", "method", "price", "gap", "reliability", "held_back"}


def test_reliability_section_equals_the_reliability_report(store, w47, outputs):
    from gpufleet.analytics import reliability_store

    rel = reliability_store.report(store.reader(), Params(w47.start, w47.end), as_of=min(w47.end, NOW))
    figs, f = Figures(outputs[0].html), rel["figures"]
    assert outputs[0].report.reliability["figures"] == f
    # every job of the week completed: no interruption, a known 0 (GPU-hours were allocated), none lost
    assert figs.one("reliability.interruptions") == str(f["interruptions"]) == "0"
    assert figs.one("reliability.hardware") == "0" and figs.one("reliability.per_1000_gpu_days") == "0"
    assert figs.one("reliability.lost_gpu_h") == fmt.hours(f["lost_gpu_hours"])
    assert "Interrupted attempts: 0" in outputs[0].text
    # goodput: every chain completed at its first try, so the fleet's ETTR is 100 %, no chain listed
    assert rel["goodput"]["ettr"] == 1 and figs.one("reliability.ettr") == fmt.pct(100.0) and not rel["chains"]
    assert "Goodput: ETTR 100" in outputs[0].text
    # checkpoint advice for the week's largest jobs: none reported a checkpoint, so there is none, and it says why
    assert rel["checkpoint_advice"] and outputs[0].report.reliability["checkpoint_advice"] == rel["checkpoint_advice"]
    assert 'id="checkpoint-advice"' in outputs[0].html
    assert "no advice: no checkpoint reports: the job's checkpoint cost is unknown" in outputs[0].text


def test_a_chain_of_one_attempt_on_one_gpu_reads_in_the_singular(outputs):
    """The text report's chain lines: "1 attempt on 1 GPU", not "1 attempts on 1 GPUs"."""
    report = outputs[0].report
    chain = {"job_ids": ["7"], "attempts": 1, "gpus": 1, "ettr": 0.0, "lost_basis": "upper bound"}
    many = {**chain, "job_ids": ["8"], "attempts": 2, "gpus": 8}
    text = render.text(replace(report, reliability={**report.reliability, "chains": [chain, many]}))
    assert "chain 7: 1 attempt on 1 GPU, ETTR" in text and "chain 8: 2 attempts on 8 GPUs, ETTR" in text


def test_goodput_waterfall_is_the_analytics_one(store, w47, outputs):
    """The weekly report's waterfall (chart and text) is gpufleet.analytics.goodput's, computed on the
    report's own analysis: capacity and allocated are the week's totals."""
    from gpufleet.analytics import goodput

    o = outputs[0]
    a = o.report.extra["analysis"]
    want = goodput.compute(a, store.reader(), a.p, as_of=o.report.as_of)
    assert o.report.goodput["fleet"] == want["fleet"] and o.report.goodput["teams"] == want["teams"]
    t = o.report.totals
    assert [r["gpu_h"] for r in want["fleet"][:2]] == [t.capacity_gpu_h, pytest.approx(t.allocated_gpu_h)]
    assert 'id="chart-goodput"' in o.html and "Goodput waterfall" in o.html
    assert "GOODPUT WATERFALL" in o.text and f"capacity                   {fmt.hours(t.capacity_gpu_h)} GPU-h" in o.text
    useful = want["fleet"][-1]
    assert useful["step"] == "useful" and (useful["gpu_h"] is None or useful["unknown_teams"] >= 0)
    assert "not lost to interruptions" in o.text


def test_team_report_has_only_its_team(store, w47, outputs):
    team = outputs[1]
    assert team.report.team == "physics"
    figs = Figures(team.html)
    assert {k.split(".")[1] for k in figs.figs if k.startswith("team.")} == {"physics"}
    assert HOSTILE_ACCOUNT not in "".join(figs.text) and "ml" not in {m.account for m in team.report.mfu}
    # its jobs: the team's own, with the same figures as in the fleet report
    fleet_jobs = {j.job_id: j for j in outputs[0].report.wasteful_jobs}
    assert [j.job_id for j in team.report.wasteful_jobs] == ["107", "101"]
    for j in team.report.wasteful_jobs:
        assert (j.gpu_h, j.cost) == (fleet_jobs[j.job_id].gpu_h, fleet_jobs[j.job_id].cost)
    # the fleet headline for context, identical to the fleet report's
    assert figs.one("headline.idle_allocated_cost.current") == Figures(outputs[0].html).one("headline.idle_allocated_cost.current")
    assert team.subject.startswith("GPU waste report 2026-W47 \u2014 team physics: $8.25 idle")
    assert team.name == "gpufleet-report-2026-W47-team-physics"



def test_team_reports_equal_an_analysis_filtered_to_the_team(store, w47, outputs):
    """A team's lists are its rows of the fleet's figures; an analysis filtered to its account,
    what each team's report once ran, is the oracle: every team's lists equal its."""
    fleet = outputs[0].report
    a = fleet.extra["analysis"]
    teams = sorted({t.account for t in fleet.teams} | {"no-such-team"})
    assert HOSTILE_ACCOUNT in teams and fleet.wasteful_jobs and fleet.no_process_jobs
    for team in teams:
        mine = model.for_team(fleet, team)
        oracle = Analysis(store.reader(), replace(a.p, filters=replace(a.p.filters, account=team)), now=fleet.generated_at)
        summaries = job_summaries(oracle)
        assert mine.wasteful_jobs == model.wasteful_jobs(oracle, fleet.top_n, summaries), team
        assert (mine.no_process_jobs, mine.no_process_more + len(mine.no_process_jobs)) == model.no_process_jobs(oracle, summaries), team
        assert all(j.account == team for j in [*mine.wasteful_jobs, *mine.no_process_jobs])

# --- hostile names ---

ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "footer", "h1", "h2", "h3", "div", "span", "strong", "em",
                "p", "ul", "li", "code", "table", "thead", "tbody", "tr", "th", "td", "svg", "rect", "line", "text"}


def test_html_escapes_hostile_job_user_and_account_names(outputs):
    for o in outputs:
        html = o.html
        parsed = Figures(html)
        assert parsed.tags <= ALLOWED_TAGS, parsed.tags - ALLOWED_TAGS
        assert not [k for k, _ in parsed.attrs if k.lower().startswith("on")]
        assert "<script" not in html.lower() and "<img" not in html.lower() and "<b>bio" not in html
        text = "".join(parsed.text)
        assert HOSTILE_JOB in text  # shown, as text
    fleet = "".join(Figures(outputs[0].html).text)
    assert HOSTILE_USER in fleet and HOSTILE_ACCOUNT in fleet
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in outputs[0].html
    # the SVG charts name teams too, escaped the same way
    svg = re.findall(r"<svg.*?</svg>", outputs[0].html, re.S)
    assert len(svg) == 4 and any("&lt;b&gt;bio&lt;/b&gt; &amp; co" in s for s in svg)


def test_text_and_subject_carry_no_control_characters(outputs):
    for o in outputs:
        assert not any(ln.startswith("Bcc:") for ln in o.text.splitlines())
        assert "\r" not in o.text and "\x1b" not in o.text
        assert "\n" not in o.subject and "\r" not in o.subject
    assert "eve\ufffd\ufffdBcc: victim@evil.example" in outputs[0].text  # still legible, on its own line


def test_hostile_team_name_in_mail_headers_and_file_names(store, w47):
    team = "ops\r\nBcc: victim@evil.example"
    s = settings_for(store.root, team_recipients={team: ["ops@example.org"]})
    outs = pipeline.make(s, w47, now=NOW, pdf=False)
    assert outs[1].report.team == team
    assert "\n" not in outs[1].subject and "/" not in outs[1].name and "\r" not in outs[1].name
    msgs = pipeline.messages(outs, s.report)
    assert len(msgs) == 1 and msgs[0]["To"] == "ops@example.org"
    assert "victim" not in msgs[0].get_all("To")[0] and msgs[0].get_all("Bcc") is None
    assert "ran no GPU jobs" in outs[1].text
    # its own section says it of the team ("No team ran GPU jobs" read as if the fleet had none)
    assert "No team ran GPU jobs" not in outs[1].text and "No team ran GPU jobs" not in outs[1].html
    assert outs[1].text.count("ran no GPU jobs in this window") == 2  # the notice and the team's section


# --- no data, unreachable store ---


def test_week_without_data_says_so_and_shows_no_zeros(store):
    outs = pipeline.make(settings_for(store.root), week_window(2026, 49), now=NOW, pdf=False)
    r = outs[0]
    assert r.report.status == "no_data"
    assert "No data for this week" in r.html and "NO DATA FOR THIS WEEK" in r.text
    figs = Figures(r.html)
    assert not [k for k in figs.figs if k.startswith(("headline.", "card.", "team.", "job."))]
    assert "$0.00" not in r.html and "0.0 %" not in r.html
    assert r.subject == "GPU waste report 2026-W49: no data"


def test_an_empty_week_s_failed_attempts_read_is_an_error_not_dropped(store, monkeypatch):
    """The window's attempts are read beside its analysis, before the report knows the week is empty: a read that
    failed meanwhile fails the report (as in a week with data), never vanishes with the unused answer."""
    from gpufleet.analytics import reliability_store

    def broken(*args, **kwargs):
        raise RuntimeError("attempts unreadable")

    monkeypatch.setattr(reliability_store, "read", broken)
    with pytest.raises(RuntimeError, match="attempts unreadable"):
        pipeline.make(settings_for(store.root), week_window(2026, 49), now=NOW, pdf=False)


def test_jobs_without_samples_give_no_data_not_zero(tmp_path):
    f = Fleet(tmp_path)
    f.job("1", account="a", user="u", start=T(10), end=T(12), gpus=2, placements=[("x1", "GPU-X")])
    f.write()
    r = pipeline.make(settings_for(tmp_path), week_window(2026, 47), now=NOW, pdf=False)[0]
    figs = Figures(r.html)
    assert figs.one("headline.allocated_gpu_h.current") == "4.0"
    for key in ("utilization_pct", "idle_allocated_gpu_h", "idle_allocated_cost", "stranded_gpu_h"):
        assert figs.one(f"headline.{key}.current") == "no data", key
    assert figs.one("card.utilization_pct") == "no data"
    assert "No GPU samples in this window" in r.text
    assert figs.one("headline.allocated_gpu_h.previous") == "no data"  # nothing in W46 either


def test_unknown_gpu_counts_are_unknown_in_the_report_never_0(tmp_path):
    """Issue #51: a week whose jobs all have an unknown GPU count has allocated GPU-hours "unknown",
    not 0.0; one where some have is "at least" the known jobs' sum, said with how many are not."""
    f = Fleet(tmp_path / "none")
    f.gpu_series("n1", "GPU-A", T(10), T(12), util=50.0, procs=1)
    f.job("1", account="a", user="u", start=T(10), end=T(12), gpus=None, placements=[])
    f.write()
    r = pipeline.make(settings_for(f.root), week_window(2026, 47), now=NOW, pdf=False)[0]
    figs = Figures(r.html)
    assert figs.one("headline.allocated_gpu_h.current") == "unknown" and "allocated GPU-hours unknown" in r.subject
    row = next(h for h in r.report.headline if h.figure == "allocated_gpu_h")
    assert row.current is None and row.missing == "unknown" and "1 job of this window has an unknown GPU count" in row.reason
    assert f"GPU-hours allocated: {row.reason}" in " ".join(r.text.split())
    line = next(ln for ln in r.text.splitlines() if ln.strip().startswith("GPU-hours allocated"))
    assert "unknown" in line and "0.0" not in line, line

    f = Fleet(tmp_path / "some")
    f.gpu_series("n1", "GPU-A", T(10), T(12), util=50.0, procs=1)
    f.job("1", account="a", user="u", start=T(10), end=T(12), gpus=None, placements=[])
    f.job("2", account="a", user="u", start=T(10), end=T(12), gpus=1, placements=[("n1", "GPU-A")])
    f.write()
    r = pipeline.make(settings_for(f.root), week_window(2026, 47), now=NOW, pdf=False)[0]
    assert Figures(r.html).one("headline.allocated_gpu_h.current") == "2.0"  # the known part ...
    row = next(h for h in r.report.headline if h.figure == "allocated_gpu_h")
    assert "at least that much" in row.reason and "at least 2.0 GPU-h allocated" in r.subject  # ... said to be a lower bound
    assert next(t for t in r.report.teams if t.account == "a").allocated_gpu_h == pytest.approx(2.0)


def test_first_week_has_no_changes_against_an_empty_last_week(store):
    r = pipeline.make(settings_for(store.root), week_window(2026, 46), now=NOW, pdf=False)[0]
    assert r.report.status == "ok"
    figs = Figures(r.html)
    assert figs.one("headline.allocated_gpu_h.current") == "2.0"
    assert figs.one("headline.allocated_gpu_h.previous") == "no data"
    for row in r.report.headline:  # every comparison against the empty week says so: no number, no percent
        assert (row.change, row.change_pct, row.change_missing) == (None, None, NO_DATA), row.figure
        assert figs.one(f"headline.{row.figure}.change") == NO_DATA and figs.one(f"headline.{row.figure}.change_pct") == ""
    assert "No data for last week (2026-W45)" in r.text
    line = next(ln for ln in r.text.splitlines() if ln.strip().startswith("GPU-hours allocated"))
    assert line.split()[-4:] == ["no", "data", "no", "data"], line  # last week, change


def cli(argv: list[str]) -> tuple[int, str]:
    from gpufleet.report import cli as report_cli

    p = argparse.ArgumentParser()
    report_cli.add_arguments(p)
    out = io.StringIO()
    return report_cli.run(p.parse_args(argv), out=out), out.getvalue()


def test_cli_writes_files_and_reports_errors_with_exit_codes(store, tmp_path, capsys):
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{store.root}"\n[report]\ntop_jobs = 2\n')
    rc, out = cli(["--config", str(cfg), "--week", "2026-W47", "--out", str(tmp_path / "r"), "--no-pdf", "--team", "ml"])
    assert rc == 0, out
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "gpufleet-report-2026-W47-team-ml.html", "gpufleet-report-2026-W47-team-ml.txt",
        "gpufleet-report-2026-W47.html", "gpufleet-report-2026-W47.txt"]
    assert "THE 2 MOST WASTEFUL JOBS" in out
    rc, out = cli(["--config", str(cfg), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T12:00:00Z", "--out", str(tmp_path / "s"), "--no-pdf", "--quiet"])
    assert rc == 0 and "gpufleet-report-20261116T1000-20261116T1200.html" in out
    capsys.readouterr()
    assert cli(["--config", str(cfg), "--week", "2026-W54", "--no-pdf"])[0] == 2
    assert capsys.readouterr().err == ("gpufleet report: error: --week '2026-W54': 2026 has no week 54: expected an ISO week YYYY-Www, "
                                       "e.g. 2026-W46\n")  # one plain line, not a log record
    assert cli(["--config", str(cfg), "--week", "2026-W47", "--from", "2026-11-16", "--no-pdf"])[0] == 2
    assert cli(["--config", str(cfg), "--no-pdf"])[0] == 2
    assert cli(["--config", str(cfg), "--week", "2026-W47", "--send", "--no-pdf"])[0] == 2  # no recipients
    assert "has no recipients" in capsys.readouterr().err
    rc, _ = cli(["--config", str(cfg), "--store", str(tmp_path / "nowhere"), "--week", "2026-W47", "--out", str(tmp_path / "t"), "--no-pdf"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("gpufleet report: error: no report for 2026-W47: no store at")
    assert err.endswith("pass --config gpufleet.toml (its [collector] or [analytics] store) or --store DIR\n")
    assert not (tmp_path / "t").exists()


# --- configuration and windows ---


@pytest.mark.parametrize("report, expect", [
    ({"recipients": ["not an address"]}, "[report]: recipients = ['not an address']: expected a list of e-mail addresses"),
    ({"recipients": ["a@b.org\r\nBcc: x@y.org"]}, "recipients"),
    ({"from_address": "x"}, "from_address = 'x': expected an e-mail address"),
    ({"team_recipients": {"physics": "lead@x.org"}}, "[report.team_recipients]: physics = 'lead@x.org': expected a list of e-mail addresses"),
    ({"schedule": {"weekday": "monday"}}, "[report.schedule]: weekday = 'monday': expected one of mon, tue"),
    ({"schedule": {"hour": 24}}, "hour = 24: expected an integer hour 0..23"),
    ({"schedule": {"timezone": "Mars/Olympus"}}, "timezone = 'Mars/Olympus': expected an IANA time zone name"),
    ({"smtp": {"port": 0}}, "[report.smtp]: port = 0: expected a port number 1..65535"),
    ({"smtp": {"starttls": "yes"}}, "starttls = 'yes': expected true or false"),
    ({"smtp": {"starttls": True, "ssl": True}}, "expected at most one of them"),
    ({"smtp": {"username": "bot"}}, "username = 'bot' but password_file = \"\": expected a password_file"),
    ({"top_jobs": 0}, "top_jobs = 0: expected an integer >= 1"),
    ({"colour": "blue"}, "unknown key 'colour'"),
])
def test_config_errors_name_key_value_and_expectation(report, expect):
    with pytest.raises(ConfigError) as e:
        load_report_config({"report": report}, "g.toml")
    assert expect in str(e.value)
    assert "g.toml" in str(e.value)


def test_config_defaults_and_password_file(tmp_path):
    c = load_report_config({}, None)
    assert (c.schedule.weekday, c.schedule.hour, c.schedule.timezone, c.top_jobs, c.smtp.port) == ("mon", 7, "UTC", 10, 25)
    assert not c.has_recipients
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    c = load_report_config({"report": {"smtp": {"username": "bot", "password_file": str(pw)}}}, None)
    assert c.smtp.password() == "s3cret"
    c = replace(c, smtp=replace(c.smtp, password_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"password_file = '.*missing': cannot read it"):
        c.smtp.password()


def test_analytics_section_with_fairness_keys_feeds_the_report(store, w47):
    doc = {"collector": {"store": str(store.root)},
           "analytics": {"idle_threshold_percent": 5, "shares": {"physics": 3, "ml": 1}, "half_life_days": 7}}
    s = pipeline.load_settings(doc, "g.toml")
    assert s.shares == {"physics": 3.0, "ml": 1.0}
    r = pipeline.make(s, w47, now=NOW, pdf=False)[0]
    entitled = {t.account: t.entitled_share for t in r.report.teams}
    assert entitled["physics"] == pytest.approx(0.75) and entitled["ml"] == pytest.approx(0.25)
    assert entitled[HOSTILE_ACCOUNT] == 0.0  # demand but no share
    assert "share weights from" in r.html


def test_iso_weeks_in_a_time_zone():
    w = week_window(*parse_week("2026-W46"))
    assert (w.start, w.end, w.prev_start) == (datetime(2026, 11, 9), datetime(2026, 11, 16), datetime(2026, 11, 2))
    b = week_window(2026, 47, "Europe/Berlin")
    assert (b.start, b.end) == (datetime(2026, 11, 15, 23), datetime(2026, 11, 22, 23))
    dst = week_window(2026, 13, "Europe/Berlin")  # summer time starts Sunday 2026-03-29
    assert dst.hours == 167 and len(dst.days()) == 7 and dst.previous_label == "2026-W12"
    assert dst.prev_end - dst.prev_start == timedelta(hours=168)
    assert parse_week("2026W01") == (2026, 1)
    assert week_window(2026, 1).start == datetime(2025, 12, 29)  # ISO week 1 starts in the old year
    with pytest.raises(ConfigError, match="expected an ISO week YYYY-Www"):
        parse_week("2026-46")
    assert last_complete_week(datetime(2026, 11, 23, 6)) == (2026, 47)  # Monday 06:00 UTC
    assert last_complete_week(datetime(2026, 11, 22, 23, 30), "Europe/Berlin") == (2026, 47)  # already Monday in Berlin
    assert last_complete_week(datetime(2026, 11, 22, 23, 30), "UTC") == (2026, 46)
    s = span_window(datetime(2026, 11, 16, 10), datetime(2026, 11, 16, 12))
    assert (s.prev_start, s.prev_end) == (datetime(2026, 11, 16, 8), datetime(2026, 11, 16, 10))


def test_dst_week_compares_with_the_previous_calendar_week(store):
    """A report over a 167 h week takes last week's figures from that calendar week, via Analysis."""
    w = week_window(2026, 13, "Europe/Berlin")
    params = Params(w.start, w.end)
    r = gather(store.reader(), params, w, now=NOW)
    assert r.status == "no_data"  # nothing in March; the point is that it runs
    assert params.previous() != replace(params, start=w.prev_start, end=w.prev_end)


def test_unpriced_model_money_is_unknown_not_zero(tmp_path):
    f = Fleet(tmp_path)
    f.gpu_series("z1", "GPU-Z", T(10), T(12), util=0.0, model="NVIDIA Z9000", procs=1)
    f.job("900", account="physics", user="zed", start=T(10), end=T(11), gpus=1, placements=[("z1", "GPU-Z")])
    f.write()
    r = pipeline.make(settings_for(tmp_path), week_window(2026, 47), now=NOW, pdf=False)[0]
    figs = Figures(r.html)
    assert figs.one("headline.idle_allocated_cost.current") == "no price"
    assert figs.one("headline.idle_allocated_gpu_h.current") == "1.0"
    assert figs.one("team.physics.idle_cost") == "unknown"
    assert figs.one("price.NVIDIA Z9000") == "no price"
    assert "No price for NVIDIA Z9000" in r.text


def test_render_is_deterministic_for_the_same_figures(outputs):
    again = render.html(outputs[0].report)
    assert again == outputs[0].html
    assert isinstance(outputs[0].report.teams[0].idle_cost, float)
    assert pl.__version__  # polars is the analytics' frame library; the model holds plain values


def test_a_week_not_over_says_so_and_leaves_the_coming_days_blank(store, w47):
    r = pipeline.make(settings_for(store.root), w47, now=T(13), pdf=False)[0]
    assert [p.future for p in r.report.daily] == [False] + [True] * 6
    assert r.report.as_of == T(13)
    assert "This window is not over: figures cover it up to Mon 2026-11-16 13:00 (UTC)" in r.text
    assert r.html.count(">to come</text>") == 6
    a = Analysis(store.reader(), Params(w47.start, w47.end), now=T(13))
    assert Figures(r.html).one("headline.allocated_gpu_h.current") == fmt.hours(a.totals().allocated_gpu_h)


# --- issue #13.6: one money format; a "recompute with" command that runs as printed ---

MONEY = re.compile(r"[\u2212-]?\$\d[\d,]*(?:\.\d+)?")  # any amount, in any format
USD = re.compile(r"^\u2212?\$(0|[1-9]\d{0,2}(,\d{3})*)\.\d\d$")


def test_money_has_one_format_with_cents():
    assert fmt.usd(4724) == "$4,724.00" and fmt.usd(945.527) == "$945.53"  # the pair, now alike
    assert fmt.usd(1234567.891) == "$1,234,567.89" and fmt.usd(0) == "$0.00" and fmt.usd(-3) == "\u2212$3.00"
    assert fmt.usd(None) == fmt.usd(float("nan")) == "unknown"  # unknown money is never $0
    assert fmt.change(1500.0, "usd") == "+$1,500.00" and fmt.value(999.999, "usd") == "$1,000.00"


@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_money_format_is_cents_and_reads_back(v):
    s = fmt.usd(v)
    assert USD.match(s), s
    back = float(s.replace("\u2212", "-").replace("$", "").replace(",", ""))
    assert abs(back - v) <= 0.005 + 1e-9 * abs(v)


def test_every_amount_in_the_report_has_the_one_format(outputs):
    for o in outputs:
        amounts = MONEY.findall(o.text) + MONEY.findall("".join(Figures(o.html).text)) + MONEY.findall(o.subject)
        assert amounts, o.name
        bad = [a for a in amounts if not USD.match(a)]
        assert not bad, (o.name, bad)


def _recompute_lines(o) -> tuple[str, str]:
    import html as html_mod

    text = next(ln.strip() for ln in o.text.splitlines() if ln.strip().startswith("Recompute: "))[len("Recompute: "):]
    code = re.search(r'<code id="recompute">(.*?)</code>', o.html, re.S)
    assert code, "no recompute command in the HTML"
    return text, html_mod.unescape(code.group(1))


def test_recompute_command_runs_as_printed_and_gives_the_same_figures(store, w47, tmp_path):
    """The report's "recompute with" line, run as printed (a fresh process, another working
    directory), gives the report's figures: --config carries the entitled shares (Jain's index
    differs with equal shares), --store the store, --account the team's report."""
    import json
    import shlex
    import subprocess
    import sys

    from gpufleet.config import load_config

    cfg = tmp_path / "conf dir" / "g.toml"  # a space in the path: the command is shell-quoted
    cfg.parent.mkdir()
    cfg.write_text(f'[collector]\nstore = "{store.root}"\n[analytics]\nshares = {{ physics = 3, ml = 1 }}\n[report]\ntop_jobs = 3\n')
    settings = pipeline.load_settings(load_config(str(cfg)), str(cfg))
    fleet, team = pipeline.make(settings, w47, pdf=False, teams=["physics"])
    env = {**__import__("os").environ, "PATH": f"{Path(sys.executable).parent}:{__import__('os').environ.get('PATH', '')}"}
    for o in (fleet, team):
        text_cmd, html_cmd = _recompute_lines(o)
        assert text_cmd == html_cmd == render.recompute_command(o.report)
        argv = shlex.split(text_cmd)
        assert argv[:2] == ["gpufleet", "analyze"] and argv[argv.index("--config") + 1] == str(cfg.resolve())
        assert argv[argv.index("--store") + 1] == str(Path(store.root).resolve())
        assert argv[argv.index("--from") + 1] == "2026-11-16T00:00:00Z" and argv[argv.index("--to") + 1] == "2026-11-23T00:00:00Z"
        run = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout)
        r = o.report
        if r.team is None:
            assert "--account" not in argv
            for key in ("allocated_gpu_h", "busy_gpu_h", "data_gpu_h", "capacity_gpu_h", "utilization_pct", "idle_allocated_gpu_h",
                        "idle_allocated_cost", "stranded_cost"):
                assert got["totals"][key] == pytest.approx(getattr(r.totals, key), abs=1e-9), key
            assert got["fairness"]["shares"] == "config" and got["fairness"]["jain_index"] == pytest.approx(r.jain_index)
            assert [j["job_id"] for j in got["top_wasteful_jobs"]] == [j.job_id for j in r.wasteful_jobs]
            assert [j["idle_cost"] for j in got["top_wasteful_jobs"]] == pytest.approx([j.cost for j in r.wasteful_jobs])
        else:
            assert argv[argv.index("--account") + 1] == "physics" and got["filters"] == {"account": "physics"}
            row = r.teams[0]
            mine = [u for u in got["utilization"]["rows"] if u["account"] == "physics"]
            assert sum(u["allocated_gpu_h"] for u in mine) == pytest.approx(row.allocated_gpu_h)
            assert sum(u["busy_gpu_h"] for u in mine) == pytest.approx(row.busy_gpu_h)
            assert sorted(j["job_id"] for j in got["top_wasteful_jobs"]) == sorted(j.job_id for j in r.wasteful_jobs)
    # the command the report printed before (no --config, no --store) fails as printed: the
    # default store is not there (tmp_path is an empty directory), and it would drop the shares
    old = subprocess.run(["gpufleet", "analyze", "--from", "2026-11-16T00:00:00Z", "--to", "2026-11-23T00:00:00Z", "--format", "json"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert old.returncode != 0


def test_a_cost_moving_against_its_gpu_hours_is_explained_in_the_report(outputs):
    """Issue #53.7: the headline's money figure that moved against its GPU-hours carries the reason
    (gpufleet.analytics.trends.price_mix_reason), and the text and HTML print it under the table."""
    from gpufleet.analytics.core import Totals
    from gpufleet.report.model import headline_rows

    def totals(idle_h: float, idle_usd: float) -> Totals:
        return Totals(capacity_gpu_h=100.0, data_gpu_h=100.0, no_data_gpu_h=0.0, busy_gpu_h=50.0, utilization_pct=50.0,
                      allocated_gpu_h=80.0, idle_allocated_gpu_h=idle_h, idle_allocated_cost=idle_usd, no_process_gpu_h=4.0,
                      no_process_cost=12.0, stranded_gpu_h=20.0, stranded_cost=60.0, unpriced_models=())

    rows = headline_rows(totals(12.1, 24.04), totals(10.0, 40.0), processes=True, prev_processes=True)
    cost = next(r for r in rows if r.figure == "idle_allocated_cost")
    assert cost.reason.startswith("the GPU-hours went up 2.10 while the cost went down $15.96: the time moved to cheaper GPU models")
    assert [r.figure for r in rows if r.reason] == ["idle_allocated_cost"]
    report = replace(outputs[0].report, headline=rows)
    assert f"{cost.label}: {cost.reason}" in render.text(report)
    assert f"{cost.label}: {cost.reason}" in HTMLText.of(render.html(report))
    # no comparison with last week: no reason either
    assert not any(r.reason for r in headline_rows(totals(12.1, 24.04), None, processes=True, prev_processes=False))


class HTMLText(HTMLParser):
    """The text of an HTML page, whitespace collapsed."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)

    @classmethod
    def of(cls, page: str) -> str:
        p = cls()
        p.feed(page)
        return " ".join(" ".join(p.parts).split())


def test_last_week_without_samples_shows_its_allocated_hours_and_no_data_for_the_rest():
    """A last week whose jobs the accounting has but no exporter reported (the demo's first week): its allocated GPU-hours
    are shown; its figures from samples - no data among them, which would read "0.0" (no GPU seen, no capacity) beside
    allocated hours no sample covered - say "no data"."""
    from gpufleet.analytics.core import Totals
    from gpufleet.report.model import headline_rows

    cur = Totals(capacity_gpu_h=100.0, data_gpu_h=99.0, no_data_gpu_h=1.0, busy_gpu_h=50.0, utilization_pct=50.5, allocated_gpu_h=80.0,
                 idle_allocated_gpu_h=10.0, idle_allocated_cost=20.0, no_process_gpu_h=4.0, no_process_cost=8.0, stranded_gpu_h=19.0,
                 stranded_cost=38.0, unpriced_models=())
    dark = replace(cur, capacity_gpu_h=0.0, data_gpu_h=0.0, no_data_gpu_h=0.0, busy_gpu_h=0.0, utilization_pct=None, allocated_gpu_h=40.0,
                   idle_allocated_gpu_h=0.0, idle_allocated_cost=0.0, no_process_gpu_h=0.0, no_process_cost=0.0, stranded_gpu_h=0.0,
                   stranded_cost=0.0)
    rows = {r.figure: r for r in headline_rows(cur, dark, processes=True, prev_processes=False, no_comparison="empty: no GPU samples")}
    assert rows["allocated_gpu_h"].previous == 40.0
    assert rows["no_data_gpu_h"].previous is None and rows["no_data_gpu_h"].previous_missing == "no data"
    assert rows["no_data_gpu_h"].current == 1.0
