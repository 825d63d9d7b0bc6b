"""A requeued job's earlier attempts held its GPUs: their GPU-hours count in allocated time, on
every surface that reads it (issue #54). Jobs keep a job's latest record, job_attempts the
records a later start superseded; the window's job table (analytics/sql.py JOB_ALLOCATED, ja)
sums every run of a job, and the totals, the figures by team and job, the job list, the timeline
and fairness (used and decayed) read it.

Golden: a job requeued once, with the arithmetic. Property (hypothesis, through the real
StoreWriter): jobs of one to three attempts (gaps between them, an earlier attempt whose end was
never read, GPU counts that change between attempts, the latest record still pending or running)
and any window: each job's allocated GPU-hours = the sum over its attempts of GPUs x the part of
the attempt in the window, computed here from the attempts as written; the teams sum to the fleet,
and so do the timeline's buckets, fairness' used GPU-hours and the job list. And with samples:
requeued jobs on sampled GPUs, each run a row of the window's allocations, give from the facts
every figure the raw path gives (idle stretches across back-to-back runs one stretch).
"""

from __future__ import annotations

import math
import tempfile
from datetime import datetime, timedelta

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.fairness import fairness
from gpufleet.analytics.jobs import job_summaries
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.timeline import utilization_timeline
from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.fleet import Fleet
from tests.support.random_stores import figures as all_figures
from tests.support.random_stores import mismatches
from tests.support.raw_analysis import RawAnalysis

T0 = datetime(2026, 11, 2)
TOL = dict(rel=1e-9, abs=1e-9)


def H(h: float) -> datetime:
    return T0 + timedelta(hours=h)


def attempt(job_key: str, start: datetime, end: datetime | None, *, gpus: int | None = None, state: str = "REQUEUED") -> dict:
    """An earlier attempt as the collector stores it (schema.ATTEMPT_COLUMNS)."""
    return {**{c: None for c in schema.ATTEMPT_COLUMNS}, "cluster": "c1", "scheduler": "slurm", "job_key": job_key, "job_id": job_key,
            "start": start, "end": end, "state": state, "gpus": gpus, "source": "test", "updated_at": end or start}


def store(root, fleet: Fleet, attempts: list[dict]):
    """The fleet's batch and the earlier attempts, committed as the collector does; a reader."""
    w = StoreWriter(root)
    w.commit(fleet.batch())
    if attempts:
        w.commit(Batch(key="attempts", attempts=attempts))
    w.publish()
    w.close()
    return open_reader(root)


def figures(con, start: float, end: float, now: float, account: str | None = None) -> dict:
    a = Analysis(con, Params(H(start), H(end), filters=Filters(account=account)), now=H(now))
    jobs = job_summaries(a)
    return {
        "fleet": a.totals().allocated_gpu_h,
        "accounts": {r["account"]: r["allocated_gpu_h"] for r in a.utilization("account").iter_rows(named=True)},
        "jobs": {r["job_key"]: r["allocated_gpu_h"] for r in a.utilization("job").iter_rows(named=True)},
        "list": {r["job_key"]: (r["allocated_gpu_h"], r["runtime_h"]) for r in jobs.iter_rows(named=True)} if not jobs.is_empty() else {},
        "timeline": float(utilization_timeline(a, "fleet", bucket=timedelta(minutes=30))["allocated_gpu_h"].fill_null(0).sum()),
        "timeline_rows": utilization_timeline(a, "fleet", bucket=timedelta(minutes=30)),
        "used": {r["account"]: r["used_gpu_h"] for r in fairness(a, None).per_account.iter_rows(named=True)},
    }


def test_a_requeued_job_is_allocated_every_attempt(tmp_path):
    """Job 7 of physics ran on 2 GPUs from 0 h to 2 h, was requeued, and ran again from 3 h to
    4 h: 2 x 2 + 2 x 1 = 6 GPU-hours allocated, not the 2 of its latest record alone. Job 8 of
    biology ran once on 1 GPU from 0 h to 4 h: 4. The fleet: 10; the hour between the attempts
    holds nothing of job 7 on the timeline."""
    f = Fleet(tmp_path / "s")
    f.job("7", account="physics", user="ann", start=H(3), end=H(4), gpus=2, placements=[], submit=H(0))
    f.job("8", account="biology", user="bo", start=H(0), end=H(4), gpus=1, placements=[])
    con = store(tmp_path / "s", f, [attempt("7", H(0), H(2))])
    got = figures(con, 0, 5, now=6)
    assert got["fleet"] == pytest.approx(10.0, **TOL)
    assert got["accounts"] == pytest.approx({"physics": 6.0, "biology": 4.0}, **TOL)
    assert got["jobs"] == pytest.approx({"7": 6.0, "8": 4.0}, **TOL)
    assert got["list"]["7"] == pytest.approx((6.0, 3.0), **TOL)  # 3 h run: 2 + 1, on 2 GPUs
    assert got["used"] == pytest.approx({"physics": 6.0, "biology": 4.0}, **TOL)
    assert got["timeline"] == pytest.approx(10.0, **TOL)
    per_bucket = dict(zip(got["timeline_rows"]["bucket"].to_list(), got["timeline_rows"]["allocated_gpu_h"].to_list()))
    assert per_bucket[H(0)] == pytest.approx(1.5, **TOL)  # 30 min x (2 + 1) GPUs
    assert per_bucket[H(2)] == pytest.approx(0.5, **TOL)  # between the attempts: job 8 only
    assert per_bucket[H(3)] == pytest.approx(1.5, **TOL)
    # a window that holds only the first attempt still has the job, with that attempt's GPU-hours
    early = figures(con, 0, 2.5, now=6)
    assert early["jobs"] == pytest.approx({"7": 4.0, "8": 2.5}, **TOL) and early["fleet"] == pytest.approx(6.5, **TOL)
    # ... and one of the second attempt only, that attempt's
    late = figures(con, 2.5, 5, now=6)
    assert late["jobs"] == pytest.approx({"7": 2.0, "8": 1.5}, **TOL)
    # a filtered figure is its row unfiltered
    assert figures(con, 0, 5, now=6, account="physics")["fleet"] == pytest.approx(6.0, **TOL)


def test_an_attempt_whose_end_was_never_read_ran_until_the_next_began(tmp_path):
    """The collector saw job 9 running (from 1 h), then its record with a later start (2.5 h):
    the first record, superseded with no end, ran until the next started - 1.5 h on 4 GPUs - and
    nothing of it is counted twice. A pod's restarted container (an attempt starting with the
    pod or after it) is inside the pod's run already: not counted again."""
    f = Fleet(tmp_path / "s")
    f.job("9", account="physics", user="ann", start=H(2.5), end=H(3), gpus=4, placements=[])
    f.job("ns/pod", account="ml", user="bo", start=H(0), end=H(2), gpus=1, placements=[], scheduler="kubernetes")
    restarted = {**attempt("ns/pod", H(0.5), H(1), state="FAILED"), "scheduler": "kubernetes"}
    con = store(tmp_path / "s", f, [attempt("9", H(1), None), restarted])
    got = figures(con, 0, 5, now=6)
    assert got["jobs"] == pytest.approx({"9": 4 * 1.5 + 4 * 0.5, "ns/pod": 2.0}, **TOL)
    assert got["fleet"] == pytest.approx(10.0, **TOL) and got["timeline"] == pytest.approx(10.0, **TOL)


def test_an_idle_stretch_across_a_requeued_jobs_back_to_back_runs_is_one_stretch(tmp_path):
    """Job 7 held GPU u1 from 0 h: its first attempt ran to 1 h, was requeued and ran again at once to 2 h (two runs, two
    rows of the window's allocations, one holder). The GPU idled from 6 min before 1 h to 6 min after: one idle stretch of
    12 min (idle allocated is the time the job held the GPU idle for at least idle_min_duration, 10 min here), not two of
    6 min each too short to count; and the second run has no startup of its own (its low start continues the first's). The
    raw path gives the same stretch."""
    from gpufleet.analytics.states import Thresholds
    from gpufleet.analytics.window_states import window_states

    f = Fleet(tmp_path / "s")
    low = (H(1) - timedelta(minutes=6), H(1) + timedelta(minutes=6))
    f.gpu_series("h1", "u1", H(0), H(2), util=lambda t: 0.0 if low[0] <= t < low[1] else 95.0, procs=1)
    # (the job map saw it hold u1 through both runs)
    f.job("7", account="physics", user="ann", start=H(1), end=H(2), gpus=1, placements=[("h1", "u1")], submit=H(0), held_from=H(0))
    con = store(tmp_path / "s", f, [attempt("7", H(0), H(1))])
    p = Params(H(0), H(2), idle_min_duration=timedelta(minutes=10))
    a = Analysis(con, p, now=H(3))
    assert a.q("SELECT count(*) AS n FROM al")["n"][0] == 2
    assert a.totals().idle_allocated_gpu_h == pytest.approx(0.2, **TOL)
    stretches = a.idle_stretches("idle")
    assert stretches.height == 1 and stretches["gpu_h"][0] == pytest.approx(0.2, **TOL)
    job = window_states(a, Thresholds.of(p, {})).jobs.row(0, named=True)
    assert job["startup_gpu_h"] == 0.0 and job["idle_gpu_h"] == pytest.approx(0.2, **TOL)
    # the raw path, the tests' oracle, agrees: its runs meet the job's holds (back-to-back runs one), not al's rows
    raw = RawAnalysis(con, p, now=H(3))
    assert raw.totals().idle_allocated_gpu_h == pytest.approx(0.2, **TOL)
    assert raw.idle_stretches("idle").equals(stretches)


# --- property -----------------------------------------------------------------------------------

ACCOUNTS = ["alpha", "beta"]


@st.composite
def requeued_fleets(draw):
    """Jobs of 1-3 attempts in [0, 10 h], in minutes: each attempt starts after the previous one
    ended (an earlier one may have no end read: it ran until the next began), the latest record
    may be pending (no start), running (no end) or ended; GPU counts per attempt."""
    jobs = []
    for k in range(draw(st.integers(1, 5))):
        t = draw(st.integers(0, 300))
        runs = []
        for _ in range(draw(st.integers(1, 3))):
            length = draw(st.integers(1, 200))
            end_known = draw(st.booleans()) or draw(st.booleans())
            runs.append([t, t + length if end_known else None, draw(st.integers(1, 4))])
            t += length + draw(st.integers(0, 60))
        last = draw(st.sampled_from(["ended", "running", "pending"]))
        jobs.append({"key": f"j{k}", "account": draw(st.sampled_from(ACCOUNTS)), "runs": runs, "last": last})
    window = sorted(draw(st.lists(st.integers(0, 900), min_size=2, max_size=2, unique=True)))
    return {"jobs": jobs, "window": window, "now": 1000}


def M(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def written(fleet) -> tuple[Fleet, list[dict], dict[str, float]]:
    """The fleet's jobs and attempts as the store gets them, and each job's allocated GPU-hours
    in the window computed here: the sum over its runs of GPUs x the run's minutes in the window."""
    f = Fleet(None)
    attempts, want = [], {}
    a, b = fleet["window"]
    for j in fleet["jobs"]:
        runs = [list(r) for r in j["runs"]]
        if j["last"] == "pending":  # the latest record has not started: the earlier runs are all attempts
            latest = None
        else:
            latest = runs.pop()
            if j["last"] == "running":
                latest[1] = None
            elif latest[1] is None:
                latest[1] = latest[0] + 1
        for i, (s, e, g) in enumerate(runs):
            attempts.append(attempt(j["key"], M(s), None if e is None else M(e), gpus=g))
        if latest is None:
            f.job(j["key"], account=j["account"], user="u", start=None, end=None, gpus=runs[-1][2], placements=[], submit=M(runs[-1][0] + 1))
        else:
            f.job(j["key"], account=j["account"], user="u", start=M(latest[0]), end=None if latest[1] is None else M(latest[1]),
                  gpus=latest[2], placements=[])
        # the runs: each earlier attempt until its end, else until the next run began, else (none
        # began: the latest is pending) until now; the latest until its end, else now
        spans = []
        for i, (s, e, g) in enumerate(runs):
            nxt = runs[i + 1][0] if i + 1 < len(runs) else (latest[0] if latest else None)
            spans.append((s, e if e is not None else (nxt if nxt is not None else fleet["now"]), g))
        if latest:
            spans.append((latest[0], latest[1] if latest[1] is not None else fleet["now"], latest[2]))
        gpu_h = sum(g * max(0, min(e, b) - max(s, a)) / 60 for s, e, g in spans)
        if any(min(e, b) > max(s, a) for s, e, _ in spans):
            want[j["key"]] = gpu_h
    return f, attempts, want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requeued_fleets())
def test_allocated_is_the_sum_over_attempts_and_teams_sum_to_the_fleet(fleet):
    f, attempts, want = written(fleet)
    with tempfile.TemporaryDirectory(prefix="gpufleet-attempts-") as root:
        f.root = root
        con = store(root, f, attempts)
        a, b = fleet["window"]
        got = figures(con, a / 60, b / 60, now=fleet["now"] / 60)
        assert {k: v for k, v in got["jobs"].items() if v > 0} == pytest.approx({k: v for k, v in want.items() if v > 0}, rel=1e-9, abs=1e-9)
        total = sum(want.values())
        assert got["fleet"] == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert sum(got["accounts"].values()) == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert got["timeline"] == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert sum(v for v in got["used"].values() if not math.isnan(v)) == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert sum(v for v, _ in got["list"].values()) == pytest.approx(total, rel=1e-9, abs=1e-9)
        for account in {j["account"] for j in fleet["jobs"]}:  # a filtered figure is its row unfiltered
            assert figures(con, a / 60, b / 60, now=fleet["now"] / 60, account=account)["fleet"] == pytest.approx(
                got["accounts"].get(account, 0.0), rel=1e-9, abs=1e-9)


@st.composite
def requeued_gpu_fleets(draw):
    """One or two GPUs sampled every 30 s for 5 h, utilization piecewise constant (idle, half, busy) and often idle for
    some minutes either side of a run's end (a requeue, or the next job); one or two jobs holding one or both, each run 1-3
    times (mostly back to back, sometimes 5 min apart); a window and idle_min_duration."""
    jobs, pads, t = [], [], draw(st.integers(0, 30))
    for k in range(draw(st.integers(1, 2))):
        runs = []
        for _ in range(draw(st.integers(1, 3))):
            length = draw(st.integers(10, 90))
            runs.append((t, t + length))
            t += length + draw(st.sampled_from([0, 0, 0, 5]))
            if draw(st.booleans()):
                end = runs[-1][1]
                pads.append((end - draw(st.sampled_from([2, 4, 6, 8])), end + draw(st.sampled_from([2, 4, 6, 8]))))
        held = draw(st.lists(st.sampled_from([0, 1]), unique=True, min_size=1, max_size=2))
        jobs.append({"key": f"r{k}", "account": draw(st.sampled_from(ACCOUNTS)), "runs": runs, "held": held})
        t = draw(st.integers(0, 60))  # the next job's first run: on the same GPUs, maybe at once
    gpus = []
    for _ in range(max(g for j in jobs for g in j["held"]) + 1):
        levels, t = [(a, b, 0.0) for a, b in pads], 0  # (the idle pads first: they win)
        while t < 300:
            length = draw(st.sampled_from([4, 8, 15, 30]))
            levels.append((t, t + length, draw(st.sampled_from([0.0, 50.0, 95.0]))))
            t += length
        gpus.append(levels)
    window = [draw(st.integers(0, 150)), draw(st.integers(151, 300))]
    return {"gpus": gpus, "jobs": jobs, "window": window, "idle_min": draw(st.sampled_from([5, 10, 20]))}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requeued_gpu_fleets())
def test_a_requeued_jobs_figures_from_the_facts_equal_the_raw_path(fleet):
    """Requeued jobs holding sampled GPUs, each run a row of the window's allocations: every figure the facts give (totals,
    per GPU, idle and no-process stretches, waste and utilization by team and job, top jobs) equals the raw path's, idle
    stretches across back-to-back runs included."""
    with tempfile.TemporaryDirectory() as tmp:
        f = Fleet(f"{tmp}/s")
        for g, levels in enumerate(fleet["gpus"]):
            f.gpu_series("h1", f"u{g}", M(0), M(300), step=30, procs=1, gpu=g,
                         util=lambda t, levels=levels: next(u for a, b, u in levels if M(a) <= t < M(b)))
        attempts = []
        for j in fleet["jobs"]:
            (first, _), (start, end) = j["runs"][0], j["runs"][-1]
            attempts += [attempt(j["key"], M(a), M(b)) for a, b in j["runs"][:-1]]
            f.job(j["key"], account=j["account"], user="u", start=M(start), end=M(end), gpus=len(j["held"]), submit=M(first),
                  placements=[("h1", f"u{g}") for g in j["held"]], held_from=M(first))
        con = store(f"{tmp}/s", f, attempts)
        p = Params(M(fleet["window"][0]), M(fleet["window"][1]), idle_min_duration=timedelta(minutes=fleet["idle_min"]))
        bad = mismatches(all_figures(RawAnalysis(con, p, now=M(400))), all_figures(Analysis(con, p, now=M(400))))
        assert not bad, "\n".join(bad)
