"""No surface reads a window's raw samples where the store's facts answer: counted, not timed.

Every dashboard page, `gpufleet analyze` under every filter, the weekly report and the policy's
round run on a store with facts (tests/test_dashboard_analytics.py's scenario, its upkeep done),
and what each read of raw samples is counted by gpufleet.analytics.raw_reads (the one place the
analytics read them). A read of kind "edge" (FactWindow: a window edge, or a timeline bucket's
edge, cutting a 5-minute bucket) may cover at most one 5-minute bucket of the time that has
samples; a fall back to the raw path or to reading whole hours raw fails, deterministically (the
times live in the bench).

Allowed beyond the edges, explicitly (ALLOWED): a job's per-sample states on its page (the job's
own GPUs over its allocations), a health counter's rise inside one part (the read grows with the
events, not the window), and the foreign processes list (Health and a job's page: the samples that
have one, skipped by the files' column statistics otherwise), and the newest sample of each GPU
that went quiet within Fleet now's facts ("fleet now newest"). Fleet now (and so the policy's idle
runs, which read it) may read raw its newest minutes ("fleet now": at most stale_after and the
5-minute bucket it starts in) and what lies after the store's newest facts, never its look-back;
its last XIDs ("fleet now xids") the 5-minute buckets its forget window's ends cut, and what lies
after the newest facts, never the day before.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")

from gpufleet.analytics import fleet_now as fn  # noqa: E402
from gpufleet.analytics import raw_reads  # noqa: E402
from gpufleet.analytics.core import Analysis  # noqa: E402
from gpufleet.analytics.params import Params  # noqa: E402
from gpufleet.analytics.policy import Rules, efficiency_notes, plan_from_store  # noqa: E402
from gpufleet.analytics.timeline import utilization_timeline  # noqa: E402
from gpufleet.collector.maintenance import apply_retention, compact  # noqa: E402
from gpufleet.collector.store import StoreWriter, open_reader  # noqa: E402
from gpufleet.report import pipeline  # noqa: E402
from gpufleet.report.window import span_window  # noqa: E402
from gpufleet.times import epoch_us  # noqa: E402
from tests.test_analytics_jobs_cli import analyze  # noqa: E402
from tests.test_dashboard_analytics import A100, T, W, build  # noqa: E402
from tests.test_dashboard_pages import PAGES, clean, goto, open_app  # noqa: E402
from tests.support.raw_analysis import RawAnalysis

FIVE_MIN_US = 300 * 1_000_000
WINDOW_PAGES = [p for p in PAGES if p != "fleet_now"]  # the pages that show a window's figures
PAGE_WINDOWS = [(T(10), T(12)), (T(8), T(10))]  # the pages' window (test_dashboard_pages.WINDOW) and the previous one
# kinds of raw read allowed beyond a window's edges, and why
ALLOWED = {
    "job states": "a job's page: the per-sample states of the job's own GPUs over its allocations",
    "health events": "a health counter's rise inside one part: the read grows with the events, not the window",
    "foreign processes": "the GPUs with other jobs' processes: samples that have one (column statistics skip the rest)",
    "fleet now newest": "Fleet now: the newest sample of each GPU gone quiet within the facts, alone",
}
NEWEST_MINUTES_US = round(fn.STALE_AFTER.total_seconds() * 1_000_000) + FIVE_MIN_US + 1  # Fleet now's newest minutes read raw


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = Path(build(tmp_path_factory.mktemp("raw-reads")).root)
    w = StoreWriter(root)
    compact(w, T(20), facts_hours=None)  # every hour settled: the facts of all of them
    w.close()
    return root


@pytest.fixture(scope="module")
def sampled(store) -> tuple[int, int]:
    """The time that has samples, [first, last + max_gap) in epoch us (what a read can find rows in)."""
    lo, hi = open_reader(store).execute("SELECT min(ts), max(ts) FROM gpu_samples").fetchone()
    return epoch_us(lo), epoch_us(hi) + round(W.max_gap.total_seconds() * 1_000_000)


def beyond_edges(reads: list[raw_reads.Read], sampled: tuple[int, int], windows: list[tuple],
                 facts_end: int | None = None) -> list[raw_reads.Read]:
    """The reads that read raw samples where facts answer: the raw path; an edge read of sampled
    time outside the one 5-minute bucket that an edge of one of the `windows` ((start, end) the
    surface asks: its window, the previous one) cuts - one over more than a bucket, or in a bucket
    no such edge cuts (a bucket cut at a timeline's bucket edges only); a
    Fleet now read of sampled time longer than its newest minutes that starts before `facts_end`
    (the end of the store's newest facts, epoch us); any other kind not ALLOWED."""
    edges = {epoch_us(t) for w in windows for t in w}
    bad = []
    for r in reads:
        over = min(r.hi_us or 0, sampled[1]) - max(r.lo_us or 0, sampled[0])
        if r.kind == "edge":
            lo, hi = max(r.lo_us or 0, sampled[0]), min(r.hi_us or 0, sampled[1])
            b0 = lo - lo % FIVE_MIN_US  # (the reach before a window's start and its edge minutes: one read of the cut bucket)
            if over > 0 and (hi > b0 + FIVE_MIN_US or not any(b0 < e < b0 + FIVE_MIN_US for e in edges)):
                bad.append(r)
        elif r.kind in ("fleet now", "fleet now xids"):
            newest = NEWEST_MINUTES_US if r.kind == "fleet now" else FIVE_MIN_US + 1
            if over > 0 and r.span_us > newest and (facts_end is None or r.lo_us < facts_end):
                bad.append(r)
        elif r.kind not in ALLOWED:
            bad.append(r)
    return bad


def counted(fn) -> list[raw_reads.Read]:
    """The raw reads `fn()` makes."""
    mark = raw_reads.READS.mark()
    fn()
    return raw_reads.READS.since(mark)


@pytest.fixture
def dashboard(store, monkeypatch):
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(store))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)


def test_every_page_reads_no_raw_sample_beyond_the_edges(dashboard, sampled):
    def pages():
        at = open_app()
        for page in PAGES:
            at = goto(at, page)
        at = goto(at, "jobs")
        for job_id in ("101", "p1"):  # a job's report: its timeline from the facts, its states (allowed) raw
            clean(at.text_input(key="job").set_value(job_id).run())

    reads = counted(pages)
    assert not beyond_edges(reads, sampled, PAGE_WINDOWS), beyond_edges(reads, sampled, PAGE_WINDOWS)
    assert {r.kind for r in reads} <= {"edge", "fleet now", "fleet now xids", *ALLOWED}
    assert "job states" in {r.kind for r in reads}  # (the counter sees the pages' reads)


def test_a_window_cut_mid_bucket_reads_its_edge_minutes_only(store, sampled):
    """Windows cut to the minute and the second, on every page's figures: raw reads of the edges'
    5-minute buckets only (at least one: the counter sees them)."""
    con = open_reader(store)
    for p in (Params(T(10, 2), T(11, 58)), Params(T(10, 7, 30), T(11, 1, 15))):
        reads = counted(lambda: Analysis(con, p, now=T(20)).totals())
        assert reads and not beyond_edges(reads, sampled, [(p.start, p.end)]), reads
        assert any(r.rows and r.kind == "edge" for r in reads)


@pytest.mark.parametrize("filters", [(), ("--cluster", "c1"), ("--account", "physics"), ("--user", "alice"), ("--partition", "a100"),
                                     ("--model", A100), ("--job", "101"), ("--by", "job"), ("--by", "gpu")])
def test_analyze_under_every_filter(store, sampled, filters):
    def run():
        r = analyze("--store", str(store), "--from", "2026-11-16T10:00:00Z", "--to", "2026-11-16T11:58:00Z", "--format", "json", *filters)
        assert r.returncode == 0, r.stderr

    reads = counted(run)
    windows = [(T(10), T(11, 58)), (T(8, 2), T(10))]  # the window and the previous one
    assert not beyond_edges(reads, sampled, windows), beyond_edges(reads, sampled, windows)


def test_the_report_and_the_policy_round(store, sampled):
    s = pipeline.load_settings({"collector": {"store": str(store)}, "report": {}}, "test.toml")
    notes: list[dict] = []
    reads = counted(lambda: pipeline.make(s, span_window(T(10), T(12)), now=T(20), pdf=False))
    assert not beyond_edges(reads, sampled, PAGE_WINDOWS), beyond_edges(reads, sampled, PAGE_WINDOWS)
    con = open_reader(store)
    reads = counted(lambda: plan_from_store(con, Rules(), Params(T(11), T(12)), T(12)))
    assert not beyond_edges(reads, sampled, [(T(11), T(12))]), beyond_edges(reads, sampled, [(T(11), T(12))])
    # the round's efficiency notes: one analysis of its ended jobs from their facts, raw only where its window (the first
    # start to the last end) cuts a bucket
    accounts = [a for (a,) in con.execute("SELECT DISTINCT account FROM jobs WHERE account IS NOT NULL").fetchall()]
    reads = counted(lambda: notes.extend(efficiency_notes(con, Params(T(10), T(20)), accounts, T(8), T(20))))
    span = [(min(n["start"] for n in notes), max(n["end"] for n in notes))]
    assert len(notes) > 1 and not beyond_edges(reads, sampled, span), beyond_edges(reads, sampled, span)


def test_fleet_now_reads_raw_only_its_newest_minutes_and_after_the_newest_facts(store, sampled, tmp_path):
    """Fleet now at the samples' end on a store with facts of every hour: its newest minutes raw,
    and the newest sample of GPU C (silent since 11:00) alone; on a store whose facts end at 11:00
    (upkeep at 11:30: 10:00's hour whole, 11:00's settled buckets to 11:20), what lies after them -
    never the look-back before the facts' end. The same states as from the raw samples
    (test_dashboard_analytics)."""
    con = open_reader(store)
    reads = counted(lambda: fn.gpu_states(con, W, T(12)))
    assert not beyond_edges(reads, sampled, [], facts_end=epoch_us(T(12))), reads
    newest = [r for r in reads if r.kind == "fleet now newest"]
    assert [(r.lo_us, r.hi_us, r.rows) for r in newest] == [(epoch_us(T(10, 59, 45)), epoch_us(T(10, 59, 45)) + 1, 1)]
    tail = [r for r in reads if r.kind == "fleet now" and r.rows]
    assert [(r.lo_us, r.hi_us) for r in tail] == [(epoch_us(T(11, 55)), epoch_us(T(12)) + 1)]
    f = build(tmp_path)
    w = StoreWriter(f.root)
    compact(w, T(11, 30), facts_hours=None)  # 10:00's hour settled; 11:00's buckets that ended 5 min + max_gap before
    w.close()
    early = open_reader(f.root)
    assert early.execute("SELECT max(bucket) FROM fact_files WHERE open_upto IS NULL").fetchall()[0][0] == T(10)
    assert early.execute("SELECT bucket, open_from, open_upto FROM fact_files WHERE open_upto IS NOT NULL").fetchall() == [(T(11), T(11), T(11, 20))]
    reads = counted(lambda: fn.gpu_states(early, W, T(12)))
    assert not beyond_edges(reads, sampled, [], facts_end=epoch_us(T(11, 20))), reads
    assert [(r.lo_us, r.hi_us) for r in reads if r.kind == "fleet now" and r.rows] == [(epoch_us(T(11, 20)), epoch_us(T(12)) + 1)]
    # the check catches a fall back to the look-back: parameters the facts were not built for
    other = replace(W, idle_threshold=W.idle_threshold + 1)
    assert beyond_edges(counted(lambda: fn.gpu_states(con, other, T(12))), sampled, [], facts_end=epoch_us(T(12)))


def test_a_fall_back_to_raw_samples_is_caught(store, sampled):
    """The check fails on what it must catch: the raw path, a window whose parameters have no
    facts (another idle threshold: every bucket read raw), and a timeline whose buckets are
    anchored at a window's start typed to the minute, so they cut every 5-minute bucket and it is
    read in pieces. The default timeline of that window has its buckets on the clock
    (timeline.clock_origin): it reads only the edges' minutes."""
    con = open_reader(store)
    assert beyond_edges(counted(lambda: RawAnalysis(con, W, now=T(20)).totals()), sampled, [(W.start, W.end)])
    assert not beyond_edges(counted(lambda: Analysis(con, W, now=T(20)).totals()), sampled, [(W.start, W.end)])
    other = replace(W, idle_threshold=W.idle_threshold + 1)
    assert beyond_edges(counted(lambda: Analysis(con, other, now=T(20)).totals()), sampled, [(W.start, W.end)])
    cut = Params(T(10, 2), T(11, 58))
    reads = counted(lambda: utilization_timeline(Analysis(con, cut, now=T(20)), "fleet", origin=cut.start))
    assert beyond_edges(reads, sampled, [(cut.start, cut.end)])
    reads = counted(lambda: utilization_timeline(Analysis(con, cut, now=T(20)), "fleet"))
    assert not beyond_edges(reads, sampled, [(cut.start, cut.end)]), reads


RETIRED = "raw samples retention has retired"


def test_a_window_edge_whose_samples_retention_retired_is_said_on_every_window_page(tmp_path, monkeypatch):
    """Raw samples retired, facts kept: a window cut inside 5-minute buckets has no data in its cut
    minutes; analyze's JSON and every page that shows window figures say so (one warning an edge),
    and a window on the 5-minute grid says nothing (it reads facts only)."""
    root = Path(build(tmp_path).root)
    w = StoreWriter(root)
    compact(w, T(20), facts_hours=None)
    apply_retention(w, T(20) + timedelta(days=2), raw_days=1)  # the samples go, every fact stays
    w.publish()
    w.close()
    con = open_reader(root)
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0] == 0
    cut = Params(T(10, 2), T(11, 58))
    assert [x[:19] for x in Analysis(con, cut, now=T(20)).edge_warnings()] == ["2026-11-16T10:02:00", "2026-11-16T11:58:00"]
    assert Analysis(con, W, now=T(20)).edge_warnings() == []
    r = analyze("--store", str(root), "--from", "2026-11-16T10:02:00Z", "--to", "2026-11-16T11:58:00Z", "--format", "json")
    assert r.returncode == 0 and sum(RETIRED in x for x in json.loads(r.stdout)["warnings"]) == 2, r.stdout

    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = open_app(**{"from": "2026-11-16T10:02", "to": "2026-11-16T11:58"})
    for page in WINDOW_PAGES:
        at = goto(at, page)
        assert sum(RETIRED in x.value for x in at.warning) == 2, (page, [x.value for x in at.warning])
    at = open_app()  # (the pages' window, on the grid)
    for page in WINDOW_PAGES:
        at = goto(at, page)
        assert not [x.value for x in at.warning if RETIRED in x.value], page


def test_an_edge_beyond_the_store_s_samples_is_no_retired_minute(tmp_path):
    """A cut 5-minute bucket whose facts hold data only outside the cut minutes (before the store's first sample, after its
    last) tells of no retired raw samples: no warning there, while a cut over minutes the facts have data in still gets one."""
    from tests.support.fleet import Fleet

    f = Fleet(tmp_path / "store")
    f.gpu_series("n1", "GPU-a", T(10, 2, 30), T(10, 30), util=50.0)  # the store's first sample mid-bucket, its last at 10:29:45
    f.write()
    w = StoreWriter(f.root)
    compact(w, T(20), facts_hours=None)
    apply_retention(w, T(20) + timedelta(days=2), raw_days=1)  # the samples go, every fact stays
    w.publish()
    w.close()
    con = open_reader(f.root)
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0] == 0
    warned = lambda start, end: [x[:19] for x in Analysis(con, Params(start, end), now=T(20)).edge_warnings()]  # noqa: E731
    assert warned(T(9), T(10, 1)) == []  # [10:00, 10:01): before the first sample, whose bucket has data after it
    assert warned(T(10, 31), T(11)) == []  # [10:31, 10:35): after the last sample held (10:30:15)
    assert warned(T(9), T(10, 4)) == ["2026-11-16T10:04:00"]  # [10:00, 10:04) had samples from 10:02:30: retired
    assert warned(T(10, 29), T(11)) == ["2026-11-16T10:29:00"]  # [10:29, 10:30) had samples: retired


def test_the_counter():
    c = raw_reads.RawReads(keep=2)
    m = c.mark()
    c.note("edge", 0, 10, 3)
    c.note("edge", 10, 20, 4)
    assert [r.rows for r in c.since(m)] == [3, 4] and c.totals["edge"] == {"reads": 2, "rows": 7, "us": 20}
    c.note("raw path", None, None, 1)
    with pytest.raises(RuntimeError, match="more than the 2 kept"):
        c.since(m)
    with pytest.raises(ValueError, match="unknown kind"):
        c.note("cache", 0, 1, 0)
