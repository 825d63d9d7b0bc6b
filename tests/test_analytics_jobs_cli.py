"""Per-job efficiency reports (verdict + rule), trends, and the `gpufleet analyze` command."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from datetime import datetime

import pytest

from gpufleet import cli
from gpufleet.analytics.core import Analysis
from gpufleet.analytics import sql
from gpufleet.analytics.jobs import job_report, job_row, job_summaries
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.trends import NO_DATA, compare, previous_baseline, previous_totals
from gpufleet.times import utcnow
from tests.support.fleet import Fleet
from tests.test_analytics_golden import MIG, T, fleet  # noqa: F401 - the golden store fixture


@pytest.fixture(scope="module")
def a(fleet):  # noqa: F811
    return Analysis(fleet.reader(), Params(T(10), T(12)), now=T(20))


def test_verdicts_of_the_golden_jobs(a):
    v = {r["job_id"]: r["verdict"] for r in job_summaries(a).to_dicts()}
    assert v == {
        "101": "idle_stretches",  # mean (0 x 45 + 80 x 15) / 60 = 20 %, but a 45 min idle stretch
        "103": "no_process",
        "104": "idle",  # 0 % inside the window
        "p1": "ok",  # 60 %
        "p2": "idle",
        "106": "ok",  # 90 %
        "200_1": "idle",
        "200_2": "idle",
    }


def test_job_report_numbers_and_rule(a):
    r = job_report(a, "101")
    assert r.verdict == "idle_stretches"
    assert r.mean_utilization_pct == pytest.approx((0 * 45 + 80 * 15) / 60)
    assert r.idle_gpu_h == pytest.approx(0.75)
    assert r.rule == "0.75 GPU-hours below 5% in stretches of at least 30 min (mean 20.0%)"
    assert r.per_gpu["gpu_uuid"].to_list() == ["GPU-A"]
    assert r.idle_stretches.select("s0", "s1").rows() == [(T(10, 30), T(11, 15))]
    multi = job_report(a, "106")
    assert sorted(multi.per_gpu["gpu_uuid"].to_list()) == ["GPU-G1", "GPU-G2"]
    assert multi.allocated_gpu_h == pytest.approx(4.0)
    assert job_report(a, "200_2").job["job_key"] == "202"  # found by array id as people write it
    assert job_report(a, "nope") is None


def test_a_job_s_own_row_is_its_row_of_the_window_s_job_table(fleet, a):  # noqa: F811
    """job_row (the job's page: its report before the window's list) reads one job's row of the window's job table: the
    list's row (JOB_ROWS), by id as people write it or by key, under the window's filters; None where the table has none."""
    listed = {r["job_id"]: r for r in a.q(sql.JOB_ROWS).to_dicts()}
    for job_id, row in listed.items():
        assert job_row(fleet.reader(), a.p, job_id, now=T(20)) == row, job_id
        assert job_row(fleet.reader(), a.p, row["job_key"], now=T(20)) == row, row["job_key"]
    assert job_row(fleet.reader(), a.p, "200_2", now=T(20))["job_key"] == "202"  # an array task by the id people write
    assert job_row(fleet.reader(), a.p, "nope", now=T(20)) is None
    # by its key exactly (a row selected in the job list): that job's row, whatever the name; none for a key not in the window
    for row in listed.values():
        assert job_row(fleet.reader(), a.p, "any", now=T(20), exact=(row["cluster"], row["scheduler"], row["job_key"])) == row
    assert job_row(fleet.reader(), a.p, "101", now=T(20), exact=(listed["101"]["cluster"], "kubernetes", listed["101"]["job_key"])) is None
    for account in {r["account"] for r in listed.values()}:
        p = Params(T(10), T(12), filters=Filters(account=account))
        mine = {r["job_id"]: r for r in Analysis(fleet.reader(), p, now=T(20)).q(sql.JOB_ROWS).to_dicts()}
        for job_id in listed:
            assert job_row(fleet.reader(), p, job_id, now=T(20)) == mine.get(job_id), (account, job_id)


def test_unused_gpus_low_and_no_data_verdicts(tmp_path):
    f = Fleet(tmp_path)
    f.gpu_series("u1", "GPU-U1", T(10), T(12), util=60.0)
    f.gpu_series("u1", "GPU-U2", T(10), T(12), util=1.0, gpu=1)  # one of two GPUs never used
    f.gpu_series("l1", "GPU-L", T(10), T(12), util=12.0)
    f.job("1", account="a", user="u", start=T(10), end=T(12), gpus=2, placements=[("u1", "GPU-U1"), ("u1", "GPU-U2")])
    f.job("2", account="a", user="u", start=T(10), end=T(12), gpus=1, placements=[("l1", "GPU-L")])
    f.job("3", account="a", user="u", start=T(10), end=T(12), gpus=1, placements=[("x9", "GPU-X")])  # no samples
    f.write()
    a = Analysis(f.reader(), Params(T(10), T(12)), now=T(20))
    v = {r["job_id"]: (r["verdict"]) for r in job_summaries(a).to_dicts()}
    # job 1: a GPU at 1 % for 2 h is also a 2 h idle stretch, which ranks first
    assert v == {"1": "idle_stretches", "2": "low", "3": "no_data"}
    assert job_report(a, "2").rule == "mean GPU utilization 12.0% < 25%"
    assert job_report(a, "3").rule == "no samples cover this job's 2.00 allocated GPU-hours"


def test_trend_against_the_previous_window(fleet):  # noqa: F811
    con = fleet.reader()
    cur = Analysis(con, Params(T(11), T(12)), now=T(20)).totals()
    prev = previous_totals(con, Params(T(11), T(12)), now=T(20))  # [10:00, 11:00)
    t = {r["figure"]: r for r in compare(cur, prev).to_dicts()}
    # allocated 11-12: 101 30 min, p1 3/7, 106 2, 202 15 min; 10-11: 101 30, 103 60, 104 40, p1 3/7, p2 3/7, 106 2, 201 45, 202 15
    cur_alloc = 0.5 + MIG + 2 + 0.25
    prev_alloc = 0.5 + 1 + 40 / 60 + MIG + MIG + 2 + 0.75 + 0.25
    assert t["allocated_gpu_h"]["current"] == pytest.approx(cur_alloc)
    assert t["allocated_gpu_h"]["previous"] == pytest.approx(prev_alloc)
    assert t["allocated_gpu_h"]["change"] == pytest.approx(cur_alloc - prev_alloc)
    assert t["allocated_gpu_h"]["change_pct"] == pytest.approx((cur_alloc - prev_alloc) / prev_alloc * 100)
    # the store's history starts at 09:00: [10:00, 11:00) lies inside it, a full base
    assert previous_baseline(con, Params(T(11), T(12)), now=T(20)).no_comparison is None


def analyze(*args) -> subprocess.CompletedProcess:
    """`gpufleet analyze ARGS` run in this process (gpufleet.cli.main): its exit status and what it
    wrote, as subprocess.run gives them. A process of its own cost about 1.5 s of CPU a call in
    imports alone; analyze_process runs one where a test is about what the process prints."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(["analyze", *args])
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["gpufleet", "analyze", *args], code, out.getvalue(), err.getvalue())


def analyze_process(*args) -> subprocess.CompletedProcess:
    """`gpufleet analyze ARGS` in a process of its own: its exit status and every line it prints."""
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "analyze", *args], capture_output=True, text=True, timeout=120)


def test_cli_json_matches_the_analytics(fleet):  # noqa: F811
    r = analyze("--store", str(fleet.root), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T13:00:00+01:00", "--format", "json", "--job", "101")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpufleet.analyze/v1"
    assert doc["window"] == {"from": "2026-11-16T10:00:00", "to": "2026-11-16T12:00:00", "hours": 2.0}  # +01:00 -> UTC
    a = Analysis(fleet.reader(), Params(T(10), T(12)))
    t = a.totals()
    assert doc["totals"]["idle_allocated_gpu_h"] == pytest.approx(t.idle_allocated_gpu_h)
    assert doc["totals"]["allocated_gpu_h"] == pytest.approx(t.allocated_gpu_h)
    assert {r["account"]: r["allocated_gpu_h"] for r in doc["utilization"]["rows"]} == pytest.approx(
        {r["account"]: r["allocated_gpu_h"] for r in a.utilization("account").to_dicts()})
    assert [j["job_id"] for j in doc["top_wasteful_jobs"]][:3] == ["103", "101", "200_1"]
    assert doc["job"]["verdict"] == "idle_stretches"
    # the previous window [08:00, 10:00) starts before the store's first sample (09:00): no comparison
    why = "partial: the store's history starts 2026-11-16 09:00 UTC, inside the previous window from 2026-11-16 08:00 UTC"
    assert doc["previous_window"] == {"from": "2026-11-16T08:00:00", "to": "2026-11-16T10:00:00", "comparable": False, "no_comparison": why}
    alloc = next(r for r in doc["trend"] if r["figure"] == "allocated_gpu_h")
    assert alloc["current"] == pytest.approx(t.allocated_gpu_h) and alloc["previous"] is not None
    assert (alloc["change"], alloc["change_pct"], alloc["change_missing"], alloc["change_pct_missing"]) == (None, None, NO_DATA, NO_DATA)
    assert all(r["change"] is None and r["change_missing"] == NO_DATA for r in doc["trend"])
    from gpufleet.analytics.fairness import fairness

    fair = fairness(a, None)
    assert doc["fairness"]["jain_index"] == pytest.approx(fair.jain_index)
    assert {r["account"]: r["allocated_gpu_h"] for r in doc["fairness"]["per_account"]} == pytest.approx(
        {r["account"]: r["used_gpu_h"] for r in fair.per_account.to_dicts()})
    # the vocabulary's keys, and the deprecated ones beside them for one release
    assert all(r["used_gpu_h"] == r["allocated_gpu_h"] and r["used_share"] == r["allocated_share"] for r in doc["fairness"]["per_account"])
    # no configuration: the equal entitlement those figures assume is said, not silent (issue #13.5)
    assert doc["fairness"]["shares"] == "equal"
    assert doc["fairness"]["shares_description"] == "equal for every account with demand (no [analytics] shares configured)"


def test_cli_says_which_entitled_shares_it_used(fleet, tmp_path):  # noqa: F811
    window = ("--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00")
    plain = analyze("--store", str(fleet.root), *window)
    assert plain.returncode == 0, plain.stderr
    assert "entitled shares: equal for every account with demand (no [analytics] shares configured)" in plain.stdout
    cfg = tmp_path / "g.toml"
    cfg.write_text("[analytics.shares]\nphysics = 3\nbiology = 1\n")
    configured = analyze("--config", str(cfg), "--store", str(fleet.root), *window, "--format", "json")
    assert configured.returncode == 0, configured.stderr
    assert json.loads(configured.stdout)["fairness"]["shares"] == "config"
    table = analyze("--config", str(cfg), "--store", str(fleet.root), *window)
    assert "entitled shares: share weights from [analytics] shares in the configuration" in table.stdout


def test_a_window_without_samples_says_so(fleet):  # noqa: F811
    """`analyze` of a mistyped week answered 0.0 GPU-h, "(none in this window)" and exit 0, without a word: an empty
    result that reports success. It warns, with where the store's samples lie; a window with samples does not."""
    empty = analyze("--store", str(fleet.root), "--from", "2026-03-02T00:00:00Z", "--to", "2026-03-09T00:00:00Z", "--format", "json")
    assert empty.returncode == 0, empty.stderr
    doc = json.loads(empty.stdout)
    assert doc["totals"]["data_gpu_h"] == 0
    said = [w for w in doc["warnings"] if w.startswith("no GPU samples in this window")]
    assert said == ["no GPU samples in this window: its figures measure nothing (the store's GPU samples run from 2026-11-16 09:00 "
                    f"to {said[0].rsplit(' to ', 1)[1]}"] and said[0].endswith(" UTC)") and f"warning: {said[0]}" in empty.stderr
    table = analyze("--store", str(fleet.root), "--from", "2026-03-02T00:00:00Z", "--to", "2026-03-09T00:00:00Z")
    assert f"WARNING: {said[0]}" in table.stdout
    # a filter with nothing in the window says whose samples are missing
    team = json.loads(analyze("--store", str(fleet.root), "--from", "2026-03-02T00:00:00Z", "--to", "2026-03-09T00:00:00Z",
                              "--team", "physics", "--format", "json").stdout)
    assert any(w.startswith("no GPU samples of account=physics in this window") for w in team["warnings"])
    full = json.loads(analyze("--store", str(fleet.root), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T12:00:00Z", "--format", "json").stdout)
    assert not any("no GPU samples" in w for w in full["warnings"])


def test_a_job_asked_for_outside_its_window_says_where_it_is(fleet):  # noqa: F811
    """`--job` of a job not in the window answered "job not found in this window" (JSON: null, no word why): it says when
    the job ran, that the store has no such job, or which filter leaves it out - in the JSON's warnings and job_missing,
    the table's job section."""
    def missing(start, end, job, *extra):
        r = analyze("--store", str(fleet.root), "--from", start, "--to", end, "--job", job, "--format", "json", *extra)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["job"] is None and doc["job_missing"] in doc["warnings"]
        return doc["job_missing"]

    # 101 ran 10:30-11:30
    assert missing("2026-11-16T12:00:00Z", "2026-11-16T13:00:00Z", "101") == (
        "job 101: not in this window (2026-11-16 12:00 UTC to 2026-11-16 13:00 UTC): job 101 of cluster c1 ran 2026-11-16 10:30 UTC to "
        "2026-11-16 11:30 UTC")
    assert missing("2026-11-16T10:00:00Z", "2026-11-16T12:00:00Z", "nosuchjob").startswith("job nosuchjob: the store has no job of that id or key")
    assert missing("2026-11-16T10:00:00Z", "2026-11-16T12:00:00Z", "101", "--team", "biology") == (
        "job 101: ran in this window, but the filter account=biology leaves it out (its account is physics)")
    assert missing("2026-11-16T10:00:00Z", "2026-11-16T12:00:00Z", "101", "--model", "no-such-model") == (
        "job 101: ran in this window but held no GPU of model=no-such-model in it that the store knows")
    table = analyze("--store", str(fleet.root), "--from", "2026-11-16T12:00:00Z", "--to", "2026-11-16T13:00:00Z", "--job", "101")
    assert "\njob 101: not in this window (" in table.stdout and "job not found" not in table.stdout


def test_cli_table_and_errors(fleet, tmp_path):  # noqa: F811
    r = analyze_process("--store", str(fleet.root), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00", "--by", "user_name")
    assert r.returncode == 0, r.stderr
    assert "Utilization by user_name" in r.stdout and "alice" in r.stdout and "$3.00" in r.stdout
    headline = r.stdout.split("Headline (vs the previous window)")[1].split("Utilization by")[0]
    alloc = next(ln for ln in headline.splitlines() if ln.strip().startswith("GPU-hours allocated"))
    assert [c.strip() for c in alloc.strip().split("  ") if c.strip()][-2:] == ["no data", "no data"], alloc  # change, change %
    assert "unknown" not in headline and "%" not in alloc
    assert "no data to compare against: partial: the store's history starts 2026-11-16 09:00 UTC" in headline
    assert analyze_process("--store", str(fleet.root), "--from", "2026-11-16T12:00:00", "--to", "2026-11-16T10:00:00").returncode == 2
    assert analyze_process("--store", str(fleet.root), "--from", "x", "--to", "y").returncode == 2
    bad = analyze_process("--store", str(fleet.root), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00", "--by", "rack")
    assert bad.returncode == 2 and "--by 'rack': expected one of" in bad.stderr
    missing = analyze_process("--store", str(tmp_path / "none"), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00")
    assert missing.returncode == 2 and "no store at" in missing.stderr  # the command named the wrong store: usage


def error_line(r) -> str:
    """The one plain line a failed command says (argparse's form), not a log record."""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gpufleet analyze: error: ") and " ERROR " not in lines[0], lines[0]
    return lines[0]


def test_cli_errors_are_one_plain_line_with_the_fix_and_usage_exit_codes(fleet, tmp_path):  # noqa: F811
    window = ("--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00")
    missing = analyze_process("--store", str(tmp_path / "none"), *window)
    assert missing.returncode == 2
    assert error_line(missing) == (f"gpufleet analyze: error: no store at {tmp_path / 'none'}: expected a directory written by "
                                   "`gpufleet collect` (manifest.json missing): pass --config gpufleet.toml (its [collector] or "
                                   "[analytics] store) or --store DIR")
    no_week = analyze_process("--store", str(fleet.root), "--week", "2026-W54")
    assert no_week.returncode == 2 and "2026 has no week 54" in error_line(no_week)
    both = analyze_process("--store", str(fleet.root), "--week", "2026-W47", *window)
    assert both.returncode == 2 and "given --week and --from/--to: expected one of --week" in error_line(both)
    neither = analyze_process("--store", str(fleet.root))
    assert neither.returncode == 2 and "none given: expected one of --week YYYY-Www, --last DURATION" in error_line(neither)
    half = analyze_process("--store", str(fleet.root), "--from", "2026-11-16T10:00:00")
    assert half.returncode == 2 and "only --from given: expected both --from and --to" in error_line(half)
    for bad, said in (("0d", "expected a duration above zero"), ("a week", "expected a duration such as")):
        r = analyze_process("--store", str(fleet.root), "--last", bad)
        assert r.returncode == 2 and said in error_line(r)
    by = analyze_process("--store", str(fleet.root), *window, "--by", "rack")
    assert by.returncode == 2 and error_line(by) == ("gpufleet analyze: error: --by 'rack': expected one of gpu, host, model, "
                                                     "cluster, partition, account, user, job, fleet")


def test_cli_week_and_last_are_the_same_window_as_from_to(fleet):  # noqa: F811
    week = analyze("--store", str(fleet.root), "--week", "2026-W47", "--format", "json")
    assert week.returncode == 0, week.stderr
    doc = json.loads(week.stdout)
    assert doc["window"] == {"from": "2026-11-16T00:00:00", "to": "2026-11-23T00:00:00", "hours": 168.0}  # Monday to Monday, UTC
    span = json.loads(analyze("--store", str(fleet.root), "--from", "2026-11-16", "--to", "2026-11-23", "--format", "json").stdout)
    assert doc["totals"] == span["totals"] and doc["utilization"] == span["utilization"]
    last = analyze("--store", str(fleet.root), "--last", "36h", "--format", "json")
    assert last.returncode == 0, last.stderr
    w = json.loads(last.stdout)["window"]
    assert w["hours"] == 36.0
    end = datetime.fromisoformat(w["to"])
    assert abs((end - utcnow()).total_seconds()) < 120  # the window ending now


def test_window_flags_read_once_for_every_command():
    """--week, --last and --from/--to: one helper (gpufleet.times), the report's and analyze's."""
    import argparse

    from gpufleet.times import add_window_arguments, window_from_arguments

    p = argparse.ArgumentParser()
    add_window_arguments(p, week_zone="UTC")
    now = datetime(2026, 11, 25, 12, 0, 30, 999)
    assert window_from_arguments(p.parse_args(["--last", "7d"]), now=now) == (datetime(2026, 11, 18, 12, 0, 30), datetime(2026, 11, 25, 12, 0, 30), None)
    assert window_from_arguments(p.parse_args(["--last", "90m"]), now=now)[0] == datetime(2026, 11, 25, 10, 30, 30)
    assert window_from_arguments(p.parse_args(["--week", "2026-W48"])) == (datetime(2026, 11, 23), datetime(2026, 11, 30), (2026, 48))
    # a week in a zone: its Mondays' midnights there (Berlin is UTC+1 in November)
    assert window_from_arguments(p.parse_args(["--week", "2026-W48"]), "Europe/Berlin")[:2] == (datetime(2026, 11, 22, 23), datetime(2026, 11, 29, 23))
    assert window_from_arguments(p.parse_args(["--from", "2026-11-16T10:00:00+01:00", "--to", "2026-11-16T12:00:00Z"])) == (
        datetime(2026, 11, 16, 9), datetime(2026, 11, 16, 12), None)
    from gpufleet.report import cli as report_cli

    rp = argparse.ArgumentParser()
    report_cli.add_arguments(rp)
    w = report_cli.window_from_args(rp.parse_args(["--last", "48h"]), "UTC")
    assert w.hours == 48.0
    assert report_cli.window_from_args(rp.parse_args(["--week", "2026-W48"]), "UTC").label == "2026-W48"
    assert rp.parse_args(["--account", "ml", "--team", "physics"]).team == ["ml", "physics"]  # one name, the other its alias


def test_cli_by_user_and_team_aliases(fleet):  # noqa: F811
    window = ("--store", str(fleet.root), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00", "--format", "json")
    by_user = analyze(*window, "--by", "user")
    assert by_user.returncode == 0, by_user.stderr
    doc = json.loads(by_user.stdout)
    assert doc["utilization"]["by"] == "user_name"
    assert doc["utilization"] == json.loads(analyze(*window, "--by", "user_name").stdout)["utilization"]
    assert {r["user_name"] for r in doc["utilization"]["rows"]} >= {"alice", "bob", "carol", "erin"}
    team = json.loads(analyze(*window, "--team", "physics").stdout)
    account = json.loads(analyze(*window, "--account", "physics").stdout)
    assert team["filters"] == account["filters"] == {"account": "physics"}
    assert team["totals"] == account["totals"]
    # fairness under the filter: physics' row of the whole fleet's, the fleet's Jain's index (issue #53.2)
    whole = json.loads(analyze(*window).stdout)["fairness"]
    (mine,), (want,) = team["fairness"]["per_account"], [r for r in whole["per_account"] if r["account"] == "physics"]
    assert mine.keys() == want.keys()
    for k, v in want.items():  # (floats to the last bit: the same sums in another order)
        assert mine[k] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), k
    assert team["fairness"]["jain_index"] == pytest.approx(whole["jain_index"])
    assert (team["fairness"]["shown"], team["fairness"]["compared_across"], whole["shown"]) == ("account=physics", "fleet", None)
    table = analyze(*window[:-2], "--team", "physics").stdout
    assert "account=physics's row of the fairness of the fleet" in table


def test_cli_by_account_has_each_team_figure_of_the_report(fleet):  # noqa: F811
    """Per team: idle allocated and no-process GPU-hours and cost, and MFU - the report's team table
    recomputed; each equal to its analytics row (Analysis.waste_by, mfu.account_mfu)."""
    from gpufleet.analytics.mfu import account_mfu

    r = analyze("--store", str(fleet.root), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {(u["cluster"], u["account"]): u for u in json.loads(r.stdout)["utilization"]["rows"]}
    a = Analysis(fleet.reader(), Params(T(10), T(12)))
    for kind, name in (("idle", "idle_allocated"), ("no_process", "no_process")):
        want = {(w["cluster"], w["account"]): w for w in a.waste_by("account", kind).to_dicts()}
        for key, row in rows.items():
            assert row[f"{name}_gpu_h"] == pytest.approx(want[key]["gpu_h"] if key in want else 0.0), (key, kind)
            assert row[f"{name}_cost"] == (pytest.approx(want[key]["cost"]) if key in want else 0.0), (key, kind)
    assert sum(u["idle_allocated_gpu_h"] for u in rows.values()) == pytest.approx(a.totals().idle_allocated_gpu_h)
    mfu = {(m["cluster"], m["account"]): m for m in account_mfu(a).to_dicts()}
    for key, row in rows.items():
        m = mfu.get(key)
        assert row["mfu_method"] == (m["method"] if m else None), key
        assert row["mfu_pct"] == (None if not m or m["mfu"] is None else pytest.approx(m["mfu"] * 100)), key
    table = analyze("--store", str(fleet.root), "--from", "2026-11-16T10:00:00", "--to", "2026-11-16T12:00:00")
    header = table.stdout.split("Utilization by account")[1].splitlines()[1]
    assert all(c in header for c in ("idle allocated GPU-h", "no process GPU-h", "MFU %"))  # the pages' words (vocabulary.header)
    # every table's header in words, none a raw column name (the JSON keeps those)
    lines = table.stdout.splitlines()
    heads = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line and not line.startswith(" ") and lines[i + 1].startswith("  ")
             and "(none in this window)" not in lines[i + 1]]
    assert len(heads) >= 3 and not [h for h in heads if "_" in h], heads


def test_table_by_cluster_names_each_cluster():
    """The key of --by is printed (a by-cluster table without the cluster says nothing)."""
    import io

    from gpufleet.analytics.cli import print_table

    rows = [{"cluster": "hpc", "capacity_gpu_h": 10.0, "utilization_pct": 40.0},
            {"cluster": "k8s", "capacity_gpu_h": 5.0, "utilization_pct": 20.0}]
    report = {"window": {"from": "a", "to": "b", "hours": 1.0}, "filters": {}, "trend": [],
              "utilization": {"by": "cluster", "rows": rows}, "top_wasteful_jobs": [],
              "fairness": {"jain_index": None, "gini_users": None, "per_account": []}, "method": {}}
    out = io.StringIO()
    try:
        print_table(report, out)
    except KeyError:
        pass  # sections after the utilization table need more of the report; not what this checks
    text = out.getvalue()
    assert "hpc" in text and "k8s" in text


def test_table_of_states_writes_an_account_without_them_as_unknown():
    """An account with no time with data has no states (None in the JSON): its row of the table says unknown in every column,
    not an account name alone."""
    import io

    from gpufleet.analytics.cli import print_table

    rows = [{"cluster": "c", "account": "seen", "allocated_gpu_h": 2.0, "states": [{"state": "idle", "gpu_h": 1.5}, {"state": "compute", "gpu_h": 0.5}]},
            {"cluster": "c", "account": "dark", "allocated_gpu_h": 3.0, "states": None}]
    report = {"window": {"from": "a", "to": "b", "hours": 1.0}, "filters": {}, "trend": [],
              "utilization": {"by": "account", "rows": rows}, "top_wasteful_jobs": []}
    out = io.StringIO()
    try:
        print_table(report, out)
    except KeyError:
        pass  # sections after the states need more of the report; not what this checks
    lines = out.getvalue().split("Where the GPU time went", 1)[1].splitlines()
    dark = next(ln for ln in lines if ln.strip().startswith("dark")).split()
    seen = next(ln for ln in lines if ln.strip().startswith("seen")).split()
    assert dark[1:] and set(dark[1:]) == {"unknown"}, dark
    assert seen[1:4] == ["unknown", "unknown", "1.5"]  # startup and no process unknown (not in its rows), idle 1.5


def test_table_prints_why_a_cost_moved_against_its_gpu_hours():
    import io

    from gpufleet.analytics.cli import print_table

    reason = "the GPU-hours went up 2.10 while the cost went down $15.96: the time moved to cheaper GPU models (...)"
    trend = [{"figure": "idle_allocated_cost", "label": "cost of idle allocated time $", "current": 24.04, "previous": 40.0, "change": -15.96, "change_pct": -39.9,
              "change_missing": None, "change_pct_missing": None, "reason": reason}]
    report = {"window": {"from": "a", "to": "b", "hours": 1.0}, "filters": {}, "trend": trend,
              "utilization": {"by": "account", "rows": []}, "top_wasteful_jobs": []}
    out = io.StringIO()
    try:
        print_table(report, out)
    except KeyError:
        pass  # sections after the headline need more of the report; not what this checks
    assert f"  cost of idle allocated time $: {reason}\n" in out.getvalue()
