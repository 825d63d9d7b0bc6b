"""The summaries path (analytics/summaries.py over gpufleet.collector.summaries) gives the raw path's figures.

Every figure an analysis gives from the store's per-GPU bucket summaries (whole buckets) and raw
samples (buckets cut by a window edge or an allocation, hours not summarised) equals the figure
of the raw path (Analysis(..., summaries=False), itself held to the row-by-row SQL in
test_analytics_gputime) to 1e-9 relative, on the random fleets of test_analytics_properties
with MIG instances, each GPU's samples in several files, buckets of 1 and 5 minutes and
compaction at a random time (so some hours are summarised and the rest read raw). Also: a
summary rebuilt after late data, a re-ingest or clock skew is the one a fresh store builds; a
changed idle threshold is read raw until upkeep rebuilds the summaries, then from them; and a
summary one bucket off fails the comparison (the comparison can see an off-by-one bucket).
"""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_analytics_golden import A100, H100, T, between, build_golden
from test_analytics_properties import MAX_GAP, SETTINGS, TOL, at, batches, fleets, frames_equal, scratch

from gpufleet.analytics import fleet_now, summaries
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.fleet_now import collector_status
from gpufleet.analytics.jobs import job_summaries, per_job_gpu
from gpufleet.analytics.mfu import job_mfu
from gpufleet.analytics.gputime import GpuTime
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.summaries import SummaryTime
from gpufleet.analytics.timeline import utilization_timeline
from gpufleet.collector import schema
from gpufleet.collector.maintenance import compact
from gpufleet.collector.schema import Batch
from gpufleet.collector.shard import Shard, shard_of
from gpufleet.collector.store import StoreWriter, open_reader, summary_backlog
from gpufleet.collector.summaries import SummaryParams
from gpufleet.times import epoch_us
from tests.support.fleet import Fleet


def mig_some(g) -> dict:
    """Every third fleet GPU is a 1g.10gb slice of one A100 (instance = its number); the rest whole H100s."""
    if g["gpu"] % 3 == 2:
        return dict(host="hm", gpu=0, gpu_uuid="GPU-prop-mig", gpu_instance=g["gpu"], mig_profile="1g.10gb", model=A100)
    return dict(host=g["host"], gpu=g["gpu"], gpu_uuid=g["uuid"], gpu_instance=None, mig_profile=None, model=H100)


def detail_fields(g, t) -> dict:
    """Memory, tensor activity (with gaps) and an SM clock (on some GPUs only), for the per-job detail."""
    return {"fb_used_mib": None if (t // 30) % 5 == 0 else float((t * 7 + g["gpu"] * 13) % 500),
            "tensor_active": None if (t // 40) % 4 == 0 else ((t // 20) % 9) / 10,
            "sm_clock_mhz": 1410.0 + (t // 60) % 3 * 100 if g["gpu"] % 2 == 0 else None}


def split(fleet, parts: int, interleave: bool, fields=detail_fields):
    """The fleet's batches, each GPU's samples over `parts` files (slices, or every parts-th sample)."""
    out = []
    for b in batches(fleet, placement=mig_some, fields=fields):
        n = b.samples.num_rows if b.samples is not None else 0
        if n < parts:
            out.append(b)
            continue
        for k in range(parts):
            idx = list(range(k, n, parts)) if interleave else list(range(k * n // parts, (k + 1) * n // parts))
            out.append(type(b)(key=f"{b.key}/{k}", samples=b.samples.take(pa.array(idx, pa.int64())), gpus=b.gpus))
    return out


def figures(an: Analysis, detail: bool = False) -> dict:
    """The window's figures; with `detail`, also the per-job ones (memory, MFU) from
    Analysis.allocation_detail."""
    out = {
        "totals": asdict(an.totals()),
        "per_gpu": an.per_gpu(),
        "idle": an.idle_stretches("idle"),
        "no_process": an.idle_stretches("no_process"),
        "waste": an.waste_by("account"),
        "top": an.top_wasteful_jobs(),
    }
    for by in ("fleet", "host", "model", "account", "user_name", "job"):
        out[f"by_{by}"] = an.utilization(by)
    if detail:
        out["per_job_gpu"] = per_job_gpu(an)
        out["job_mfu"] = job_mfu(an)
        out["jobs"] = job_summaries(an)
    return out


def mismatches(raw: dict, got: dict) -> list[str]:
    bad = []
    for name, x in raw.items():
        y = got[name]
        if isinstance(x, dict):
            for k, v in x.items():
                w = y[k]
                if isinstance(v, float) or isinstance(w, float):
                    if (v is None) != (w is None) or (v is not None and w != pytest.approx(v, **TOL)):
                        bad.append(f"{name}.{k}: {v} != {w}")
                elif v != w:
                    bad.append(f"{name}.{k}: {v} != {w}")
        elif not frames_equal(x, y):
            bad.append(f"{name}:\n{x}\n{y}")
    return bad


def raw_figures(con, p: Params, now: datetime, detail: bool = False) -> tuple[Analysis, dict]:
    """The raw path's analysis of the window and its figures (figures(..., detail))."""
    raw = Analysis(con, p, now=now, summaries=False)
    assert isinstance(raw.gt, GpuTime) and not isinstance(raw.gt, SummaryTime)
    return raw, figures(raw, detail)


def compare(con, p: Params, now: datetime, detail: bool = False, held_only: bool = False,
            raw: tuple[Analysis, dict] | None = None) -> tuple[list[str], Analysis]:
    """The raw path's figures against the summaries path's; with `detail`, the summaries path
    reads the detail columns up front (as the dashboards and the report do) and the per-job
    figures are compared too (the raw path re-reads its window with them). `held_only`: the
    summaries path reads the GPUs a job filter's jobs held only (Analysis held_only): the same
    figures, per GPU those GPUs' rows. `raw`: raw_figures(con, p, now, detail) already computed
    (a window compared more than once computes its oracle once)."""
    raw, want = raw or raw_figures(con, p, now, detail)
    want = dict(want)
    summ = Analysis(con, p, now=now, summaries=True, detail=detail, held_only=held_only)
    got = figures(summ, detail)
    if held_only:
        held = raw.q("SELECT DISTINCT cluster, host, gpu_uuid, gi FROM al")
        want["per_gpu"], got["per_gpu"] = (f.join(held, on=["cluster", "host", "gpu_uuid", "gi"], how="semi", nulls_equal=True)
                                           for f in (want["per_gpu"], got["per_gpu"]))
    if detail and isinstance(summ.gt, SummaryTime):
        assert summ.gt.fb is None  # answered from the summaries, no raw re-read
    return mismatches(want, got), summ


def params(fleet, a: int, b: int, **kw) -> Params:
    return Params(at(a), at(b), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]), **kw)


@SETTINGS
@given(fleets(), st.sampled_from([(1, False), (3, False), (2, True)]), st.sampled_from([60, 300]), st.data())
def test_summaries_path_gives_the_raw_figures(fleet, how, bucket_s, data):
    a, m, b = fleet["cuts"]
    keep = data.draw(st.sampled_from([30, fleet["idle_min"]]), label="keep_s")
    # compaction at a random time: the hours closed by then are summarised, the rest read raw
    every_hour = fleet["now"] + 2 * 3600  # all hours closed
    compact_at = data.draw(st.sampled_from([every_hour, every_hour]) | st.integers(3600, every_hour), label="compact_at")
    with scratch() as tmp, ExitStack() as stack:
        w = StoreWriter(tmp)
        for batch in split(fleet, *how):
            w.commit(batch)
        # no health summaries (health_hours=0): no analysis reads them (test_health_summaries
        # holds them to the raw figures), and they were a tenth of each example
        compact(w, at(compact_at), SummaryParams(max_gap_s=MAX_GAP, keep_s=keep, bucket_s=bucket_s), health_hours=0)
        w.close()
        con = open_reader(tmp)
        used = False
        detail = data.draw(st.booleans(), label="detail")
        # summary rows a batch at a time: a few rows per batch splits GPUs and their buckets between batches
        batch_rows = data.draw(st.sampled_from([summaries._BATCH_ROWS, 5, 64]), label="batch_rows")
        stack.enter_context(mock.patch.object(summaries, "_BATCH_ROWS", batch_rows))
        for lo, hi in ((a, b), (a, m), (m, b)):
            raw = raw_figures(con, params(fleet, lo, hi), at(fleet["now"]), detail)
            bad, an = compare(con, params(fleet, lo, hi), at(fleet["now"]), detail, raw=raw)
            assert not bad, "\n".join(bad)
            used |= isinstance(an.gt, SummaryTime)
            if (lo, hi) == (a, b):  # the hours the widest window reads (its reach: idle_min_duration + max_gap either side)
                reach = (an.bind["xstart"], an.bind["xend"])
            event(f"whole buckets from summaries: {getattr(an.gt, 'summary_buckets', 0) > 0}")
            event(f"batch rows {batch_rows}: the line built unjoined: {isinstance(an.gt, SummaryTime) and an.gt.grid_us is None}")
            # a timeline whose buckets are not the summaries' looks up inside them: answered raw, the same
            assert frames_equal(utilization_timeline(raw[0], "account"), utilization_timeline(an, "account"))
        job = Filters(job_key=fleet["jobs"][0]["key"] if fleet["jobs"] else "x")
        filtered = {f: raw_figures(con, params(fleet, a, b, filters=f), at(fleet["now"]), detail) for f in (Filters(account="alpha"), Filters(model=A100), job)}
        for f, raw in filtered.items():
            bad, _ = compare(con, params(fleet, a, b, filters=f), at(fleet["now"]), detail, raw=raw)
            assert not bad, (f, "\n".join(bad))
        # a team's window as the dashboards read it: the summaries of the GPUs its jobs held only (a job's: its own)
        for f in (Filters(account="alpha"), job):
            bad, an = compare(con, params(fleet, a, b, filters=f), at(fleet["now"]), detail, held_only=True, raw=filtered[f])
            assert not bad, (f, "\n".join(bad))
            assert an.gt.ids.height <= an.q("SELECT DISTINCT cluster, host, gpu_uuid, gi FROM al").height  # no other GPU read
        # the path was taken where summaries exist for the windows (an hour summarised before the
        # first sample's - its reach touches that sample - is outside them)
        summarised = con.execute("SELECT count(*) FROM summary_hours WHERE hour < ? AND hour + INTERVAL 1 HOUR > ?", [reach[1], reach[0]]).fetchone()[0]
        assert used or not summarised


def host_of_shard(k: int, n: int) -> str:
    return next(h for h in (f"node-{i}" for i in range(1000)) if shard_of(h, n) == k)


def by_shard(batch: Batch, n: int) -> dict[int, Batch]:
    """A batch as n collector shards store it: each node's samples, inventory and job map with the
    shard its host hashes to, the jobs (accounting) with shard 1."""
    out: dict[int, Batch] = {}
    if batch.samples is not None:
        where = [shard_of(h, n) for h in batch.samples["host"].to_pylist()]
        for k in sorted(set(where)):
            rows = pa.array([i for i, s in enumerate(where) if s == k], pa.int64())
            out[k] = Batch(key=batch.key, samples=batch.samples.take(rows), gpus=[g for g in batch.gpus if shard_of(g["host"], n) == k])
    if batch.jobs:
        out.setdefault(1, Batch(key=batch.key)).jobs = batch.jobs
    for a in batch.allocations:
        out.setdefault(shard_of(a["host"], n), Batch(key=batch.key)).allocations.append(a)
    return out


@SETTINGS
@given(fleets(), st.integers(2, 3), st.data())
def test_shards_summaries_give_the_raw_figures(fleet, n, data):
    """Collector shards each summarise their own GPUs, at their own pace (one may never have run
    its upkeep: it died): the union reads the raw figures, whole buckets from summaries only where
    every shard holding samples of the hour summarised it."""
    a, m, b = fleet["cuts"]
    every_hour = fleet["now"] + 2 * 3600
    p = SummaryParams(max_gap_s=MAX_GAP, keep_s=fleet["idle_min"], bucket_s=300)
    with scratch() as tmp:
        root = Path(tmp)
        writers = {k: StoreWriter(Shard(k, n).root(root)) for k in range(1, n + 1)}
        # h0, h1 and the MIG host hm on shards 1, 2 and n: every shard holds samples
        spread = {"h0": host_of_shard(1, n), "h1": host_of_shard(2, n), "hm": host_of_shard(n, n)}
        for batch in batches(fleet, placement=lambda g: {**mig_some(g), "host": spread[mig_some(g)["host"]]}):
            for k, part in by_shard(batch, n).items():
                writers[k].commit(part)
        for k, w in writers.items():
            when = data.draw(st.sampled_from([every_hour, None]) | st.integers(3600, every_hour), label=f"shard {k} compacts at")
            if when is not None:
                compact(w, at(when), p)
            w.close()
        con = open_reader(root)
        for lo, hi in ((a, b), (a, m), (m, b)):
            bad, an = compare(con, params(fleet, lo, hi), at(fleet["now"]))
            assert not bad, "\n".join(bad)
            event(f"whole buckets from summaries: {getattr(an.gt, 'summary_buckets', 0) > 0}")
        # the window widened to whole hours, a timeline of 1-hour buckets: an hour every shard
        # joined is read from their joined segments
        with mock.patch("gpufleet.analytics.core.timeline_bucket", lambda p: timedelta(hours=1)):
            whole = Params(at(a).replace(minute=0, second=0), at(b).replace(minute=0, second=0) + timedelta(hours=1),
                           max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]))
            bad, an = compare(con, whole, at(fleet["now"]))
        assert not bad, "\n".join(bad)
        event(f"hours from joined segments: {getattr(an.gt, 'coarse_hours', 0) > 0}")


def summary_rows(con) -> pl.DataFrame:
    return pl.from_arrow(con.sql("SELECT * FROM gpu_summaries ORDER BY cluster, host, gpu_uuid, gi, bucket, seg0_us").to_arrow_table())


@contextmanager
def late_and_fresh(every: list[Batch], rnd, late_n: int, p: SummaryParams, end: datetime, health_hours: int | None = None):
    """Two stores of the batches `every` (shuffled): one that got `late_n` of them after its
    upkeep (late data, some for long-closed hours: clock skew, a backfill) and two of the others
    again (a re-ingest, a no-op), then upkeep twice (the second with nothing left to do); and a
    fresh one of all of them (every hour's health summary built at once; `health_hours`=0: none,
    for a test of the other summaries). Yields their roots."""
    every = list(every)
    rnd.shuffle(every)
    late, first = every[:late_n], every[late_n:]
    with scratch() as tmp, scratch() as fresh:
        w = StoreWriter(tmp)
        for batch in first:
            w.commit(batch)
        compact(w, end, p, health_hours=health_hours)
        for batch in late + first[:2]:
            w.commit(batch)
        compact(w, end, p, health_hours=health_hours)
        compact(w, end, p, health_hours=health_hours)
        w.close()
        f = StoreWriter(fresh)
        for batch in every:
            f.commit(batch)
        compact(f, end, p, health_hours=health_hours)
        f.close()
        yield tmp, fresh


@SETTINGS
@given(fleets(), st.randoms(use_true_random=False), st.integers(0, 3))
def test_summaries_rebuilt_after_late_data_are_a_fresh_build(fleet, rnd, late_n):
    """Compaction of hours that already have summaries - late batches, the same batches again -
    leaves the summaries a fresh store of all the batches builds."""
    p = SummaryParams(max_gap_s=MAX_GAP, keep_s=60, bucket_s=60)
    # (no health summaries: test_health_summaries_rebuilt_after_late_data_are_a_fresh_build has them)
    with late_and_fresh(split(fleet, 3, False), rnd, late_n, p, at(fleet["now"] + 7200), health_hours=0) as (tmp, fresh):
        got, want = summary_rows(open_reader(tmp)), summary_rows(open_reader(fresh))
        assert got.equals(want)
        m1 = json.loads(open(f"{tmp}/manifest.json").read())
        m2 = json.loads(open(f"{fresh}/manifest.json").read())
        assert [e["hour"] for e in m1["summaries"]] == [e["hour"] for e in m2["summaries"]]


def test_a_late_batch_unlists_the_summaries_it_touches_until_upkeep(tmp_path):
    """Between a late batch's commit and the next upkeep pass, readers must not take the stale
    summary: the writer unlists it at once, and the figures stay the raw ones."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(9), T(12), util=between(T(10), T(10, 40), 0.0, 80.0))
    f.job("1", account="x", user="u", start=T(9, 30), end=T(11, 30), gpus=1, placements=[("n1", "GPU-A")])
    f.write()
    w = StoreWriter(tmp_path)
    compact(w, T(14))
    hours = {e["hour"] for e in w.summaries.values()}
    assert "2026-11-16T10:00:00" in hours
    # one busy sample inside the idle stretch, late
    row = dict(ts=T(10, 20, 7), cluster="c1", host="n1", gpu=0, gpu_uuid="GPU-A", model=H100, source="scrape", gpu_util=90.0)
    w.commit(Batch(key="late", samples=pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema.SAMPLE_SCHEMA}], schema=schema.SAMPLE_SCHEMA)))
    w.publish()
    listed = {e["hour"] for e in json.loads((tmp_path / "manifest.json").read_text())["summaries"]}
    assert "2026-11-16T10:00:00" not in listed and "2026-11-16T09:00:00" in listed
    p = Params(T(9), T(12))
    bad, _ = compare(open_reader(tmp_path), p, T(20))
    assert not bad, bad
    compact(w, T(14))
    w.close()
    con = open_reader(tmp_path)
    bad, an = compare(con, p, T(20))
    assert not bad and isinstance(an.gt, SummaryTime), bad


def test_the_open_hour_is_summarised_up_to_its_settled_buckets_and_kept_current(tmp_path):
    """Upkeep summarises the hours not closed yet up to the last bucket that ended SETTLE and
    max_gap ago, again at each pass: a window ending now reads raw only the minutes after it, with
    the raw figures. Such an hour gets no whole hour's health summary (nor waits for one): its
    "now" file has its health rows and run facts up to its end; once closed, its summary is whole. A round landing inside what it summarised unlists it until upkeep."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(9), T(11, 50), util=between(T(10), T(11, 20), 0.0, 80.0))
    f.gpu_series("n1", "GPU-B", T(9), T(11, 50), util=50.0)
    f.job("1", account="x", user="u", start=T(9, 30), end=None, gpus=1, placements=[("n1", "GPU-A")])
    f.job("2", account="y", user="v", start=T(11, 7, 30), end=None, gpus=1, placements=[("n1", "GPU-B")])
    f.write()
    w = StoreWriter(tmp_path)
    compact(w, T(11, 50))  # 10:00 settles at 11:05; 11:00 is open: summarised to 11:40 - 5 min - 30 s, on the grain
    entries = {e["hour"]: e for e in w.summaries.values()}
    assert sorted(entries) == ["2026-11-16T08:00:00", "2026-11-16T09:00:00", "2026-11-16T10:00:00", "2026-11-16T11:00:00"]
    assert entries["2026-11-16T11:00:00"]["to"] == "2026-11-16T11:40:00" and "health" not in entries["2026-11-16T11:00:00"]
    assert entries["2026-11-16T11:00:00"]["format"] == "3-open"  # a reader that knows no "to" skips it
    assert entries["2026-11-16T11:00:00"]["now"].split("/")[-1].startswith("now3-")  # its health rows and run facts, for Health and Fleet now
    assert all("to" not in e and e.get("health") for h, e in entries.items() if h != "2026-11-16T11:00:00")
    assert summary_backlog(w.summaries.values())["health_awaiting_rebuild"] == 0
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT ends FROM summary_hours WHERE hour = ?", [T(11)]).fetchone()[0] == T(11, 40)
    for p in (Params(T(10), T(11, 50)), Params(T(11), T(11, 50), filters=Filters(account="y")), Params(T(9, 3), T(11, 47, 13))):
        bad, an = compare(con, p, T(11, 50))
        assert not bad and isinstance(an.gt, SummaryTime), (p, bad)
        assert an.gt.summary_buckets > 0
    # Fleet now: the open hour's run facts up to 11:40, then raw - from a moment after their end only
    for as_of, span_to in ((T(11, 50), T(11, 40)), (T(11, 41, 3), T(11, 40)), (T(11, 39), T(11))):
        binds = fleet_now._binds(Params(T(10), T(11, 50)), as_of, fleet_now.STALE_AFTER, fleet_now.LOOKBACK, fleet_now.FORGET_AFTER)
        assert fleet_now._summarised_span(con, binds)[1] == span_to, as_of
        raw, got = (fleet_now.gpu_states(con, Params(T(10), T(11, 50)), as_of, summaries=s) for s in (False, True))
        assert frames_equal(raw, got), (as_of, raw, got)
    # a window (and reach) inside the open hour: its whole buckets from the open hour's summary
    bad, an = compare(con, Params(T(11, 10), T(11, 30), idle_min_duration=timedelta(minutes=5)), T(11, 50))
    assert not bad and isinstance(an.gt, SummaryTime) and an.gt.summary_buckets > 0, bad
    # the next pass moves it on (one more bucket has settled)
    first = entries["2026-11-16T11:00:00"]["file"]
    compact(w, T(11, 56))
    assert w.summaries["2026-11-16T11:00:00"]["to"] == "2026-11-16T11:50:00" and w.summaries["2026-11-16T11:00:00"]["file"] != first
    # a late round inside what it summarised: unlisted at once, read raw, then summarised again
    row = dict(ts=T(11, 20, 7), cluster="c1", host="n1", gpu=0, gpu_uuid="GPU-A", model=H100, source="scrape", gpu_util=90.0)
    w.commit(Batch(key="late", samples=pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema.SAMPLE_SCHEMA}], schema=schema.SAMPLE_SCHEMA)))
    w.publish()
    assert "2026-11-16T11:00:00" not in {e["hour"] for e in json.loads((tmp_path / "manifest.json").read_text())["summaries"]}
    bad, _ = compare(open_reader(tmp_path), Params(T(10), T(11, 50)), T(11, 50))
    assert not bad, bad
    compact(w, T(12, 30))  # closed: whole, with its health summary
    e = w.summaries["2026-11-16T11:00:00"]
    assert "to" not in e and e.get("health")
    w.publish()
    w.close()
    bad, an = compare(open_reader(tmp_path), Params(T(10), T(11, 50)), T(11, 50))
    assert not bad and isinstance(an.gt, SummaryTime), bad


def learn_late(w: StoreWriter, root, job: str, start: datetime, end: datetime) -> None:
    """The store learns of job `job` on n1's GPU-A after its hours were summarised (sacct lagging)."""
    late = Fleet(root)
    late.job(job, account="y", user="v", start=start, end=end, gpus=1, placements=[("n1", "GPU-A")])
    w.commit(late.batch("late-job"))
    w.publish()


def test_an_allocation_learnt_of_late_reads_its_buckets_raw_until_upkeep_cuts_them(tmp_path):
    """Summaries cut each bucket where an allocation starts or ends, so an analysis answers a
    job's edges from them. A job the store learns of after its hours were summarised (sacct
    lagging) ends inside a segment: its buckets are read raw, the figures stay the raw ones;
    upkeep sees the hours' cuts changed, rebuilds them, and they are answered from summaries."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(9), T(12), util=between(T(10), T(10, 40), 0.0, 80.0))
    f.job("1", account="x", user="u", start=T(9, 30, 10), end=T(10, 21, 40), gpus=1, placements=[("n1", "GPU-A")])
    f.write()
    w = StoreWriter(tmp_path)
    compact(w, T(14))
    learn_late(w, tmp_path, "2", start=T(10, 23, 20), end=T(11, 2, 50))
    p = Params(T(9), T(12), idle_min_duration=timedelta(minutes=10))
    con = open_reader(tmp_path)
    bad, an = compare(con, p, T(20))
    assert not bad and isinstance(an.gt, SummaryTime), bad
    assert an.gt.raw_pieces > 0  # job 2's buckets, and only those, read raw
    segments = con.execute("SELECT count(*) FROM gpu_summaries WHERE seg0_us > 0").fetchone()[0]
    assert segments == 2  # job 1's start and end cut their buckets
    compact(w, T(14))  # upkeep: the hours job 2 touches have other cuts now
    w.close()
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM gpu_summaries WHERE seg0_us > 0").fetchone()[0] == 4  # and job 2's
    bad, an = compare(con, p, T(20))
    assert not bad and isinstance(an.gt, SummaryTime), bad
    assert an.gt.raw_pieces == 0 and {r["job_id"] for r in an.idle_stretches().to_dicts()} == {"1", "2"}


def golden_store(root):
    return build_golden(root)


def test_golden_scenario_from_summaries(tmp_path):
    """The golden scenario of test_analytics_golden (MIG, shared GPUs, jobs across the window
    start), compacted: every figure from summaries equals the raw one, in its windows."""
    golden_store(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    con = open_reader(tmp_path)
    for lo, hi in ((T(10), T(12)), (T(10, 20), T(12)), (T(10), T(11)), (T(10, 2, 30), T(11, 57, 1))):
        for f in (Filters(), Filters(account="biology"), Filters(model=A100)):
            bad, an = compare(con, Params(lo, hi, filters=f), T(20))
            assert not bad, (lo, hi, f, bad)
            assert isinstance(an.gt, SummaryTime)
    by_job = {r["job_id"]: r["gpu_h"] for r in Analysis(con, Params(T(10, 20), T(12)), now=T(20)).idle_stretches().to_dicts()}
    assert by_job["104"] == pytest.approx(20 / 60)  # the golden file's hand-worked figure


def test_a_timeline_off_the_summaries_edges_reads_only_the_buckets_it_looks_up_in(tmp_path):
    """A timeline's buckets follow the window's start: its edges fall inside summarised 5-minute
    buckets. They are answered by the line built again with just those buckets read raw (not the
    whole window), and equal the raw path's."""
    golden_store(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    con = open_reader(tmp_path)
    p = Params(T(10, 2, 30), T(11, 57, 30))
    an = Analysis(con, p, now=T(20), summaries=True)
    got = utilization_timeline(an, "account", timedelta(minutes=15))
    want = utilization_timeline(Analysis(con, p, now=T(20), summaries=False), "account", timedelta(minutes=15))
    assert frames_equal(want, got)
    line, _ = an.gt._refined
    assert isinstance(line, SummaryTime)
    edges = {epoch_us(p.start + timedelta(minutes=15 * i)) // 300_000_000 for i in range(1, 8)}
    assert line.also_raw == edges  # the buckets its 7 inner edges fall in, nothing else
    assert line.summary_buckets > 0


def long_store(root):
    """Two GPUs over 14 hours, compacted: idle and busy stretches, one job across hours, one
    starting on a bucket edge, one learnt of after its hours were summarised (so one bucket is
    read raw for one GPU)."""
    f = Fleet(root)
    f.gpu_series("n1", "GPU-A", T(0), T(14), step=30, util=lambda t: 0.0 if T(2) <= t < T(5, 17) or T(9) <= t < T(9, 50) else 70.0)
    f.gpu_series("n1", "GPU-B", T(0), T(14), step=30, util=lambda t: 0.0 if t < T(6, 42, 10) else 40.0)
    f.job("1", account="x", user="u", start=T(1, 7, 13), end=T(8, 33, 20), gpus=1, placements=[("n1", "GPU-A")])
    f.job("2", account="y", user="v", start=T(6, 40), end=T(11, 10), gpus=1, placements=[("n1", "GPU-B")])
    f.write()
    w = StoreWriter(root)
    compact(w, T(16))
    learn_late(w, root, "3", start=T(8, 34, 10), end=T(13, 1, 5))
    w.close()


def test_segments_join_between_the_times_an_analysis_looks_up(tmp_path):
    """An analysis joins consecutive summary segments of a GPU into one entry of its line, except
    where it will look one up: an allocation's edge, the window's, its timeline's bucket edges.
    The line is then a few entries per GPU and timeline bucket, the figures the raw ones, and the
    timeline is answered without reading a bucket raw; a timeline on other edges still is."""
    long_store(tmp_path)
    con = open_reader(tmp_path)
    p = Params(T(0, 5), T(13, 35))  # 13.5 h: a timeline of 1-hour buckets from 00:05 on
    bad, an = compare(con, p, T(20), detail=True)
    assert not bad, "\n".join(bad)
    assert isinstance(an.gt, SummaryTime) and an.gt.grid_us == 3600 * 1_000_000
    rows = con.execute("SELECT count(*) FROM gpu_summaries").fetchone()[0]
    assert an.gt.summary_buckets < rows / 5  # 12+ rows a GPU-hour, joined to about one entry a GPU-hour
    raw = Analysis(con, p, now=T(20), summaries=False)
    assert frames_equal(utilization_timeline(raw, "account"), utilization_timeline(an, "account"))
    assert an.gt._refined is None  # every look-up on an entry's edge
    other = timedelta(minutes=40)
    assert frames_equal(utilization_timeline(raw, "account", other), utilization_timeline(an, "account", other))
    assert an.gt._refined is not None


def test_hours_joined_segments_stand_for_their_buckets(tmp_path):
    """A closed hour's segments are also written joined (summaries.coarsen: one row per GPU and
    stretch between the allocation edges the writer knew). A window whose look-ups for every GPU
    fall on hour edges (14 h from 00:00: a timeline of 1-hour buckets) reads those rows for its
    whole hours - a few per GPU-hour instead of 12+ - with the raw figures and timeline. The hours
    where job 3 (learnt of after they were summarised) starts or ends inside a joined segment are
    found and read from their buckets."""
    long_store(tmp_path)
    con = open_reader(tmp_path)
    p = Params(T(0), T(14))
    bad, an = compare(con, p, T(20), detail=True)
    assert not bad, "\n".join(bad)
    assert isinstance(an.gt, SummaryTime) and an.gt.grid_us == 3600 * 1_000_000
    assert an.gt.coarse_hours == 12  # 00:00-13:00 but 08:00 and 13:00 (job 3's edges)
    assert len(an.gt._bad) == 2
    fine, joined = (con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("gpu_summaries", "gpu_summaries_coarse"))
    assert joined < fine / 6
    raw = Analysis(con, p, now=T(20), summaries=False)
    assert frames_equal(utilization_timeline(raw, "account"), utilization_timeline(an, "account"))
    assert an.gt._refined is None  # the timeline's look-ups on the joined segments' edges
    other = timedelta(minutes=40)  # ... and one whose are not: the buckets they fall in are read raw
    assert frames_equal(utilization_timeline(raw, "account", other), utilization_timeline(an, "account", other))
    assert an.gt._refined is not None and an.gt._refined[0].coarse_hours < an.gt.coarse_hours


def test_an_allocation_edge_on_a_bucket_start_breaks_the_joined_segments(tmp_path):
    """An allocation starting or ending on a bucket's start cuts no segment (the bucket's edge
    is one), but the joined segments must break there. One the store learns of after the hour was
    summarised falls inside a joined segment: that hour is read from its buckets (the raw figures)
    until upkeep writes the hour's joined segments again from its rows - the summary itself is
    not rebuilt (no segment is cut), and no sample is read."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(0), T(14), step=30, util=lambda t: 0.0 if T(2) <= t < T(5, 17) or T(9) <= t < T(9, 50) else 70.0)
    f.job("1", account="x", user="u", start=T(1, 10), end=T(6, 35), gpus=1, placements=[("n1", "GPU-A")])  # on bucket starts
    f.write()
    w = StoreWriter(tmp_path)
    compact(w, T(16))
    p = Params(T(0), T(14))
    con = open_reader(tmp_path)
    bad, an = compare(con, p, T(20))
    assert not bad and an.gt.coarse_hours == 14 and not len(an.gt._bad), bad  # job 1's edges break them
    files, joined = ({k: e[c] for k, e in w.summaries.items()} for c in ("file", "coarse"))
    learn_late(w, tmp_path, "2", start=T(9, 20), end=T(11, 45))
    con = open_reader(tmp_path)
    bad, an = compare(con, p, T(20))
    assert not bad and an.gt.coarse_hours == 12 and len(an.gt._bad) == 2, bad  # 09:00 and 11:00 from their buckets
    compact(w, T(16))  # upkeep: those hours' joined segments again
    assert {k for k, e in w.summaries.items() if e["coarse"] != joined[k]} == {T(9).isoformat(), T(11).isoformat()}
    assert {k: e["file"] for k, e in w.summaries.items()} == files  # (the summaries as they were)
    w.close()
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert not bad and an.gt.coarse_hours == 14 and not len(an.gt._bad), bad


def test_a_store_summarised_before_the_joined_segments_gets_them_at_upkeep(tmp_path):
    """Summaries written before the hours' joined segments existed are read from their buckets
    (the same figures); the next upkeep pass writes the joined segments from the hours' rows."""
    long_store(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for e in manifest["summaries"]:
        (tmp_path / e.pop("coarse")).unlink()
        e.pop("aligned")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    p = Params(T(0), T(14))
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert not bad and isinstance(an.gt, SummaryTime) and an.gt.coarse_hours == 0, bad
    hours = len(manifest["summaries"])
    assert collector_status(tmp_path)["summaries"]["joined_awaiting_rebuild"] == hours  # said
    w = StoreWriter(tmp_path)
    compact(w, T(16), coarse_hours=3)  # a pass does the newest few
    assert sorted(k for k, e in w.summaries.items() if e.get("coarse")) == sorted(w.summaries)[-3:]
    compact(w, T(16))
    assert all(e.get("coarse") for e in w.summaries.values())
    w.close()
    assert collector_status(tmp_path)["summaries"]["joined_awaiting_rebuild"] == 0
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert not bad and an.gt.coarse_hours == 14 and not len(an.gt._bad), bad  # (job 3's hours rebuilt with its cuts too)


@SETTINGS
@given(fleets(), st.sampled_from([(1, False), (2, True)]), st.sampled_from([60, 300]), st.booleans(), st.data())
def test_hours_joined_segments_give_the_raw_figures(fleet, how, bucket_s, detail, data):
    """The random fleets' windows widened to whole hours, with a timeline of 1-hour buckets (as a
    long window's): the hours' joined segments stand for their buckets, with the raw figures -
    MIG slices, gaps, jobs across hours, several files per hour, rows split between batches."""
    keep = data.draw(st.sampled_from([30, fleet["idle_min"]]), label="keep_s")
    batch_rows = data.draw(st.sampled_from([summaries._BATCH_ROWS, 5]), label="batch_rows")
    lo = at(min(fleet["cuts"])).replace(minute=0, second=0)
    hi = at(max(fleet["cuts"])).replace(minute=0, second=0) + timedelta(hours=1)
    with scratch() as tmp, mock.patch.object(summaries, "_BATCH_ROWS", batch_rows), \
            mock.patch("gpufleet.analytics.core.timeline_bucket", lambda p: timedelta(hours=1)):
        w = StoreWriter(tmp)
        for batch in split(fleet, *how):
            w.commit(batch)
        compact(w, at(fleet["now"] + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP, keep_s=keep, bucket_s=bucket_s))
        w.close()
        con = open_reader(tmp)
        for f in (Filters(), Filters(account="alpha")):
            p = Params(lo, hi, max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]), filters=f)
            bad, an = compare(con, p, at(fleet["now"]), detail)
            assert not bad, "\n".join(bad)
            event(f"hours from joined segments: {getattr(an.gt, 'coarse_hours', 0) > 0}")
            if f == Filters():
                inside = con.execute("SELECT count(*) FROM summary_hours WHERE coarse AND hour >= ? AND hour + INTERVAL 1 HOUR <= ?",
                                     [lo, hi]).fetchone()[0]
                assert getattr(an.gt, "coarse_hours", 0) >= (1 if inside and not len(an.gt._bad) else 0)


def test_a_look_up_key_two_gpus_share_only_splits_the_line(tmp_path, monkeypatch):
    """A segment is found to start on an allocation's edge by one 64-bit key of its GPU and start
    (_cut_key), which two pairs may share. With keys that ignore the GPU, every GPU's segment
    starting when some allocation does starts an entry of the line: more entries, the same
    figures."""
    import gpufleet.analytics.summaries as summaries

    long_store(tmp_path)
    con = open_reader(tmp_path)
    p = Params(T(0, 5), T(13, 35))
    want = figures(Analysis(con, p, now=T(20), summaries=False))
    entries = Analysis(con, p, now=T(20)).gt.summary_buckets
    monkeypatch.setattr(summaries, "_cut_key", lambda gh, t: t.astype(np.int64).view(np.uint64))
    an = Analysis(con, p, now=T(20))
    assert isinstance(an.gt, SummaryTime) and an.gt.grid_us is not None
    bad = mismatches(want, figures(an))
    assert not bad, "\n".join(bad)
    assert an.gt.summary_buckets > entries  # GPU-A's segment from 06:40 (job 2 starts then on GPU-B) alone


def split_after(t: datetime, inexact: bool):
    """summaries._batches with each batch split after the rows whose segment ends at `t`; with
    `inexact`, the row after the split marked inexact (so its GPU-bucket is read raw)."""
    original = summaries._batches

    def batches(con, query, bind):
        for batch in original(con, query, bind):
            at = [int(i) + 1 for i in (batch["s1"] == epoch_us(t)).arg_true()]
            for lo, hi in zip([0, *at], [*at, batch.height]):
                if hi > lo:
                    part = batch.slice(lo, hi - lo)
                    if inexact and lo in at:  # the bucket's second segment, first in its batch
                        part = part.with_columns(exact=pl.int_range(pl.len()) != 0)
                    yield part
    return batches


def test_a_bucket_read_raw_inside_segments_another_batch_joined_builds_the_line_again(tmp_path, monkeypatch):
    """Segments are joined a batch of summary rows at a time. A GPU-bucket with two segments (job 1
    starts inside it) whose rows fall in two batches, the second row inexact (so the bucket is read
    raw on that GPU): the first batch has joined the bucket's first segment with the ones before
    before the raw read was known. The line is then built again with that bucket known to every
    batch (still joined elsewhere), with the same figures. A bucket read raw because a cut falls
    inside a segment (job 3, learnt of late) is known before the batches are read (a first build
    finds it), so both batches leave its segments alone and the line is built once more only for it."""
    long_store(tmp_path)
    con = open_reader(tmp_path)
    p = Params(T(0, 10), T(13, 35))  # timeline buckets from 00:10 on: the segments before job 1's start join
    want = figures(Analysis(con, p, now=T(20), summaries=False))
    an = Analysis(con, p, now=T(20))
    assert an.gt.grid_us is not None and not mismatches(want, figures(an))  # one batch: the bucket's rows alone, the rest joined
    assert an.gt._bad.height == 2  # job 3's start (inside the segment after job 1's end) and end
    assert an.gt._known_raw is None

    monkeypatch.setattr(summaries, "_batches", split_after(T(8, 33, 20), inexact=False))
    an = Analysis(con, p, now=T(20))
    assert isinstance(an.gt, SummaryTime) and an.gt.grid_us is not None and an.gt._known_raw is None
    bad = mismatches(want, figures(an))
    assert not bad, "\n".join(bad)
    monkeypatch.setattr(summaries, "_batches", split_after(T(1, 7, 13), inexact=True))
    an = Analysis(con, p, now=T(20))
    assert isinstance(an.gt, SummaryTime) and an.gt.grid_us is not None
    assert an.gt._known_raw is not None and an.gt._known_raw.height == 1  # GPU-A's bucket of 01:05
    bad = mismatches(want, figures(an))
    assert not bad, "\n".join(bad)


def test_run_pieces_another_batch_chained_in_a_bucket_read_raw_build_the_line_again(tmp_path, monkeypatch):
    """Run pieces are chained a batch of summary rows at a time. An idle GPU whose job starts inside
    a bucket: the bucket's two segments fall in two batches, the second inexact (read raw). The
    first batch has chained the first segment's idle piece with the idle hours before it, not
    knowing the bucket is read raw; the line is built again with that bucket known: its idle runs
    are the raw ones (without the check, two that overlap: tried), and so are the figures."""
    f = Fleet(tmp_path)
    f.gpu_series("n1", "GPU-A", T(0), T(6), step=30, util=lambda t: 0.0 if T(1) <= t < T(5) else 70.0)
    f.job("1", account="x", user="u", start=T(3, 2, 30), end=T(5, 30), gpus=1, placements=[("n1", "GPU-A")])
    f.write()
    w = StoreWriter(tmp_path)
    compact(w, T(8))
    w.close()
    con = open_reader(tmp_path)
    p = Params(T(0, 10), T(5, 50))
    raw = Analysis(con, p, now=T(8), summaries=False)
    want, runs = figures(raw), raw.gt.runs("idle", p.idle_threshold, 0)
    assert runs.height == 1  # 01:00-05:00
    monkeypatch.setattr(summaries, "_batches", split_after(T(3, 2, 30), inexact=True))
    an = Analysis(con, p, now=T(8))
    assert isinstance(an.gt, SummaryTime) and an.gt._known_raw is not None
    assert frames_equal(runs, an.gt.runs("idle", p.idle_threshold, 0))  # (unchecked: 01:00-03:02:30 and 03:00-05:00)
    bad = mismatches(want, figures(an))
    assert not bad, "\n".join(bad)


def test_threshold_change_reads_raw_until_rebuilt_then_summaries(tmp_path):
    golden_store(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))  # threshold 5 %
    p = Params(T(10), T(12), idle_threshold=70.0)  # GPU F/1 at 60 % (held by pod p1) becomes idle
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert not bad and not isinstance(an.gt, SummaryTime)  # the summaries are for 5 %: not used
    compact(w, T(20), SummaryParams(idle_threshold=70.0))
    w.close()
    con = open_reader(tmp_path)
    assert con.execute("SELECT DISTINCT idle_threshold FROM summary_hours").fetchall() == [(70.0,)]
    bad, an = compare(con, p, T(20))
    assert not bad and isinstance(an.gt, SummaryTime), bad
    assert an.totals().idle_allocated_gpu_h > Analysis(con, Params(T(10), T(12)), now=T(20)).totals().idle_allocated_gpu_h


def test_summaries_hashed_by_another_duckdb_are_read_raw_until_rebuilt(tmp_path):
    """A summary's GPU hashes are DuckDB's of the collector that wrote it: a reader of another
    DuckDB version (the hash is not promised across versions) reads raw; upkeep rebuilds."""
    golden_store(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for e in manifest["summaries"]:
        assert e["hash_by"].startswith("duckdb ")
        e["hash_by"] = "duckdb 0.0.1"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    p = Params(T(10), T(12))
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert not bad and not isinstance(an.gt, SummaryTime), bad
    w = StoreWriter(tmp_path)
    assert compact(w, T(20)) == 0 and all(e["hash_by"] != "duckdb 0.0.1" for e in w.summaries.values())
    w.close()
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert not bad and isinstance(an.gt, SummaryTime), bad


def test_summaries_of_the_last_format_are_read_raw_until_upkeep_rebuilds_them(tmp_path):
    """A store summarised by the last version (format 2: no per-job detail columns) is read raw,
    with no error over the missing columns; the next upkeep pass rebuilds it, and then the
    per-job detail (memory, MFU) comes from the summaries as well."""
    golden_store(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    detail = ["fb_max_mib", "clocked_s", "tensor_clock_s", "tensor_clocked_s", "tensor_unclocked_s"]
    for e in manifest["summaries"]:
        assert e["format"] == 3
        path = tmp_path / e["file"]
        pq.write_table(pq.read_table(path).drop_columns(detail), path)
        e["tag"] = "format-2"
        del e["format"]  # the last version wrote no format
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    p = Params(T(10), T(12))
    bad, an = compare(open_reader(tmp_path), p, T(20), detail=True)
    assert not bad and not isinstance(an.gt, SummaryTime), bad
    hours = len(manifest["summaries"])
    assert collector_status(tmp_path)["summaries"] == {"summarised": hours, "awaiting_rebuild": hours, "health_awaiting_rebuild": 0,
                                                          "joined_awaiting_rebuild": 0, "summaries_only": 0}  # said
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    assert w.summaries and all(e["format"] == 3 and e["tag"] != "format-2" for e in w.summaries.values())
    w.close()
    assert collector_status(tmp_path)["summaries"] == {"summarised": hours, "awaiting_rebuild": 0, "health_awaiting_rebuild": 0,
                                                          "joined_awaiting_rebuild": 0, "summaries_only": 0}
    bad, an = compare(open_reader(tmp_path), p, T(20), detail=True)
    assert not bad and isinstance(an.gt, SummaryTime) and an.gt.has_detail, bad


def _move_every_row_one_bucket_later(store, key):
    """The planted bug: every row of each summary entry's `key` file ("file": the 5-minute rows,
    "coarse": the hour's joined segments) moved one bucket later."""
    for e in json.loads((store / "manifest.json").read_text())["summaries"]:
        path = store / e[key]
        t = pq.read_table(path)
        shifted = pa.compute.add(t["bucket"], pa.scalar(timedelta(seconds=e["params"]["bucket_s"]), pa.duration("us")))
        pq.write_table(t.set_column(t.schema.get_field_index("bucket"), "bucket", shifted.cast(t.schema.field("bucket").type)), path)


def test_a_summary_one_bucket_off_fails_the_comparison(tmp_path):
    """The planted bug: every summary row moved one bucket later. The comparison must see it."""
    golden_store(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    p = Params(T(10), T(12))
    assert not compare(open_reader(tmp_path), p, T(20))[0]
    _move_every_row_one_bucket_later(tmp_path, "file")
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert isinstance(an.gt, SummaryTime) and bad


def test_joined_segments_one_bucket_off_fail_the_comparison(tmp_path):
    """The planted bug in the hours' joined segments: every row moved one bucket later. The
    comparison over a window that reads them must see it."""
    long_store(tmp_path)
    p = Params(T(0), T(14))
    assert not compare(open_reader(tmp_path), p, T(20))[0]
    _move_every_row_one_bucket_later(tmp_path, "coarse")
    bad, an = compare(open_reader(tmp_path), p, T(20))
    assert isinstance(an.gt, SummaryTime) and an.gt.coarse_hours and bad


def test_a_summary_made_stale_before_a_crash_is_dropped_at_start(tmp_path):
    """A batch committed after the last publish (the writer then crashed): the manifest still
    lists the summary its samples changed; the next writer drops it before publishing."""
    build_golden(tmp_path)
    w = StoreWriter(tmp_path)
    compact(w, T(20))
    w.close()
    w = StoreWriter(tmp_path)
    row = dict(ts=T(10, 20, 7), cluster="c1", host="n1", gpu=0, gpu_uuid="GPU-A", model=H100, source="scrape", gpu_util=90.0)
    w.commit(Batch(key="late", samples=pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema.SAMPLE_SCHEMA}], schema=schema.SAMPLE_SCHEMA)))
    assert "2026-11-16T10:00:00" not in w.summaries  # the commit unlisted it (for the next publish, which never comes)
    w.db.close()  # the crash: no publish
    w = StoreWriter(tmp_path)
    assert "2026-11-16T10:00:00" not in w.summaries and "2026-11-16T09:00:00" in w.summaries
    w.close()
    bad, _ = compare(open_reader(tmp_path), Params(T(9), T(12)), T(20))
    assert not bad, bad
