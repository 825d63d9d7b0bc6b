"""Hour facts (analytics/hour_facts.py) give a window of whole hours the figures of its analysis.

The Utilization page's figures of a window - headline totals, utilization by every dimension it
offers, the timelines - summed from its hours' facts equal the raw path's (core.Analysis with
every sample read: the oracle) to 1e-9 relative: on the random fleets of
test_analytics_properties (MIG slices, gaps, jobs across hours, several files per hour), however
the hours were grouped when their facts were built, in tests/test_fact_window.py (with the rest
of the window's figures, from the same facts); here on the golden scenario. Facts whose inputs
changed - an allocation learnt of later, late samples - are not read (the window is then
computed the long way); a planted fact one hour off fails the comparison.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

import polars as pl
import pytest
import test_analytics_properties
from test_analytics_properties import MAX_GAP, TOL, at, frames_equal, scratch
from test_analytics_golden import A100, T, between, build_golden
from tests.support.random_stores import split

from gpufleet.analytics import hour_facts
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.timeline import TIMELINE_DIMS, utilization_timelines
from gpufleet.collector.maintenance import compact
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.collector.summaries import SummaryParams
from gpufleet.times import HOUR
from tests.support.fleet import Fleet

ONE_HOUR_BUCKETS = mock.patch("gpufleet.analytics.hour_facts.timeline_bucket", lambda p: HOUR)


def write_facts(con, p: Params, now: datetime, where: Path, runs: list[tuple[datetime, datetime]]) -> dict[datetime, Path]:
    """Build the facts of each run of hours (as the dashboards' warmer would) into `where`."""
    out = {}
    for lo, hi in runs:
        for hour, (key, rows) in hour_facts.build(con, Params(lo, hi, max_gap=p.max_gap, idle_min_duration=p.idle_min_duration), now).items():
            for old in where.glob(f"{hour:%Y%m%dT%H}-*.parquet"):
                old.unlink()
            path = where / f"{hour:%Y%m%dT%H}-{key}.parquet"
            rows.write_parquet(path)
            out[hour] = path
    return out


def write_rollups(con, where: Path, files: dict[datetime, Path]) -> int:
    """Roll up (hour_facts.rollup) each span whose hours write_facts wrote, as the dashboards'
    warmer does; how many spans."""
    n = 0
    for start in hour_facts.rollup_spans(Params(min(files), max(files) + HOUR)) if files else []:
        hours = hour_facts.span_hours(start)
        if all(h in files for h in hours):
            name = hour_facts.rollup_name([files[h].stem.split("-", 1)[1] for h in hours])
            hour_facts.rollup(con, [str(files[h]) for h in hours]).write_parquet(where / f"span{start:%Y%m%dT%H}-{name}.parquet")
            n += 1
    return n


class finder:
    """The facts write_facts and write_rollups wrote (hour_facts.FactFiles)."""

    def __init__(self, where: Path):
        self.where = where

    def present(self, hour: datetime) -> tuple[str, str] | None:
        return self._found(f"{hour:%Y%m%dT%H}-*.parquet")

    def present_span(self, start: datetime) -> tuple[str, str] | None:
        return self._found(f"span{start:%Y%m%dT%H}-*.parquet")

    def _found(self, pattern: str) -> tuple[str, str] | None:
        for path in self.where.glob(pattern):
            return path.stem.split("-", 1)[1], str(path)
        return None


def oracle(con, p: Params, now: datetime) -> dict:
    an = Analysis(con, p, now=now, raw=True)
    return use_figures(asdict(an.totals()), {by: an.utilization(by) for by in hour_facts.USE_DIMS}, utilization_timelines(an, TIMELINE_DIMS, HOUR))


def use_figures(totals: dict, utilization: dict, timeline: dict) -> dict:
    """What window_use sums from facts, of the raw analysis' totals, utilization (by each of
    USE_DIMS at least) and timelines (TIMELINE_DIMS, hourly): test_fact_window takes them from
    its own oracle's analysis of the window rather than computing a second one."""
    return {"totals": {k: totals[k] for k in ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "utilization_pct", "allocated_gpu_h")},
            "utilization": {by: utilization[by] for by in hour_facts.USE_DIMS}, "timeline": timeline}


def mismatches(want: dict, got: hour_facts.WindowUse) -> list[str]:
    bad = []
    for k, v in want["totals"].items():
        w = getattr(got.totals, k)
        if (v is None) != (w is None) or (v is not None and w != pytest.approx(v, **TOL)):
            bad.append(f"totals.{k}: {v} != {w}")
    for what in ("utilization", "timeline"):
        for by, x in want[what].items():
            y = getattr(got, what)[by]
            if not frames_equal(x, y):
                bad.append(f"{what}[{by}]:\n{x}\n{y}")
    return bad


def summarised_hours(con) -> tuple[datetime, datetime]:
    """The store's summarised hours, first to last (an hour before the first sample has none:
    a window reaching it is computed the long way)."""
    lo, hi = con.execute("SELECT min(hour), max(hour) FROM summary_hours").fetchone()
    return lo, hi + HOUR


def closed_store(tmp, fleet, how=(1, False)) -> None:
    w = StoreWriter(tmp)
    for batch in split(fleet, *how):
        w.commit(batch)
    # no health summaries (health_hours=0): no figure of hour facts or of an analysis reads them
    # (test_health_summaries holds them to the raw figures), and they were a fifth of this build
    compact(w, at(fleet["now"] + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP, keep_s=30, bucket_s=300), health_hours=0)
    w.close()


BUILT = ("hour by hour", "in one run", "rolled up")  # how random_fleet_facts builds a fleet's facts


@contextmanager
def random_fleet_facts(fleet, how, built: str, offset_s: int):
    """A random fleet of test_analytics_properties whose time 0 is `offset_s` after the hour (its
    samples, gaps, runs and jobs cross hour edges), its batches split `how`, compacted, with its
    summarised hours' facts `built` (BUILT) hour by hour, in one run, or in one run and rolled up
    in spans of 2 hours (hour_facts.ROLLUP_HOURS, for the block): (reader, the hours' Params, now,
    the facts' directory)."""
    base = test_analytics_properties.BASE + timedelta(seconds=offset_s)
    with (scratch() as tmp, scratch() as facts, ONE_HOUR_BUCKETS, mock.patch.object(test_analytics_properties, "BASE", base),
          mock.patch.object(hour_facts, "ROLLUP_HOURS", 2)):
        now = at(fleet["now"] + 2 * 3600)
        closed_store(tmp, fleet, how)
        con = open_reader(tmp)
        lo, hi = summarised_hours(con)
        p = Params(lo, hi, max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]))
        runs = [(h, h + HOUR) for h in hour_facts.whole_hours(p)] if built == "hour by hour" else [(lo - HOUR, hi + HOUR)]
        files = write_facts(con, p, now, Path(facts), runs)
        if built == "rolled up":
            write_rollups(con, Path(facts), files)
        yield con, p, now, Path(facts)


def checked_windows(p: Params) -> list[Params]:
    """The windows a property compares: the hours `p` spans, the same named by the fleet's
    cluster (the filtered queries), and every later start (the facts of a wider build; idle
    stretches cut by the window's edge)."""
    named = replace(p, filters=Filters(cluster=test_analytics_properties.CLUSTER))
    return [p, named, *(replace(p, start=a) for a in hour_facts.whole_hours(p)[1:])]


def test_only_windows_of_whole_hours_without_filters_are_answered():
    p = Params(datetime(2026, 11, 2), datetime(2026, 11, 3))
    with ONE_HOUR_BUCKETS:
        assert hour_facts.answerable(p)
        assert not hour_facts.answerable(Params(p.start + timedelta(minutes=5), p.end))
        assert not hour_facts.answerable(Params(p.start, p.end - timedelta(minutes=5)))
        assert not hour_facts.answerable(Params(p.start, p.end, filters=Filters(account="a")))
        assert not hour_facts.answerable(Params(p.start, p.end, filters=Filters(model="m")))
        assert hour_facts.answerable(Params(p.start, p.end, filters=Filters(cluster="c")))
        assert not hour_facts.answerable(Params(p.start, p.end, summaries=False))
    # a window whose timeline buckets are shorter than an hour (12 h: 15 minutes)
    assert not hour_facts.answerable(Params(p.start, p.start + timedelta(hours=12)))
    assert hour_facts.answerable(Params(p.start, p.start + timedelta(days=7)))


def golden(root) -> None:
    """The golden scenario of test_analytics_golden (MIG slices, shared GPUs, jobs across hours), compacted."""
    build_golden(root)
    w = StoreWriter(root)
    compact(w, T(20))
    w.close()


def test_golden_hours_from_their_facts(tmp_path):
    golden(tmp_path / "store")
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    p = Params(T(9), T(13))
    with ONE_HOUR_BUCKETS:
        write_facts(con, p, T(20), tmp_path / "facts", [(T(9), T(13))])
        for lo, hi in ((T(10), T(12)), (T(9), T(13)), (T(11), T(12))):
            got = hour_facts.window_use(con, Params(lo, hi), T(20), finder(tmp_path / "facts"))
            bad = mismatches(oracle(con, Params(lo, hi), T(20)), got)
            assert not bad, (lo, hi, "\n".join(bad))
        # the golden file's hand-worked figures, summed from facts: physics (jobs 101, 103, 106) held
        # 1 + 1 + 2 x 2 GPU-hours, job 106's two GPUs at 90 % and 101's and 103's idle or half
        u = hour_facts.window_use(con, Params(T(10), T(12)), T(20), finder(tmp_path / "facts")).utilization["account"]
        assert u.filter(pl.col("account") == "physics")["allocated_gpu_h"].item() == pytest.approx(6.0)


def test_a_fact_one_hour_off_fails_the_comparison(tmp_path):
    """The comparison can see a misplaced hour: the 10:00 hour's timeline parts written as 11:00's."""
    golden(tmp_path / "store")
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    with ONE_HOUR_BUCKETS:
        files = write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(13))])
        rows = pl.read_parquet(files[T(10)])
        rows.with_columns(pl.when(pl.col("kind").is_in(["iv", "held"])).then(pl.col("hour") + HOUR).otherwise(pl.col("hour")).alias("hour")
                          ).write_parquet(files[T(10)])
        got = hour_facts.window_use(con, Params(T(10), T(12)), T(20), finder(tmp_path / "facts"))
        bad = mismatches(oracle(con, Params(T(10), T(12)), T(20)), got)
        assert any(b.startswith("timeline[") for b in bad) and not any(b.startswith("totals") for b in bad)


def late_samples(root: Path, util: float) -> None:
    """A GPU's samples for 10:10-10:20 arriving late (after 10:00's summary was written), and the
    upkeep that rebuilds that summary under a new name."""
    late = Fleet(root)
    late.gpu_series("n9", "GPU-late", T(10, 10), T(10, 20), util=util)
    w = StoreWriter(root)
    w.commit(late.batch("late-samples"))
    compact(w, T(20))
    w.close()


def test_facts_whose_inputs_changed_are_not_read(tmp_path):
    """An allocation learnt of after the facts were built (sacct lagging), and late samples, rename
    the hours they touch and their neighbours (test_fact_window: idle stretches are judged through
    them): the window is not answered from facts until they are built again, then with the new
    figures."""
    from tests.support.random_stores import learn_late

    golden(tmp_path / "store")
    facts = tmp_path / "facts"
    facts.mkdir()
    p = Params(T(10), T(12))
    with ONE_HOUR_BUCKETS:
        write_facts(open_reader(tmp_path / "store"), p, T(20), facts, [(T(10), T(12))])
        assert hour_facts.window_use(open_reader(tmp_path / "store"), p, T(20), finder(facts)) is not None
        w = StoreWriter(tmp_path / "store")
        learn_late(w, tmp_path / "store", "late", start=T(11, 20), end=T(11, 50))
        con = open_reader(tmp_path / "store")
        assert hour_facts.window_use(con, p, T(20), finder(facts)) is None  # 11:00's allocations changed
        w.close()
        write_facts(con, p, T(20), facts, [(T(10), T(12))])  # the hour that changed and its neighbour in the window
        got = hour_facts.window_use(con, p, T(20), finder(facts))
        assert got is not None and not mismatches(oracle(con, p, T(20)), got)
        assert "y" in got.utilization["account"]["account"].to_list()
        # late samples for 10:00: its summary is rebuilt (upkeep), its facts' name changes
        late_samples(tmp_path / "store", util=40.0)
        con = open_reader(tmp_path / "store")
        assert hour_facts.window_use(con, p, T(20), finder(facts)) is None
        write_facts(con, p, T(20), facts, [(T(10), T(12))])
        got = hour_facts.window_use(con, p, T(20), finder(facts))
        assert got is not None and not mismatches(oracle(con, p, T(20)), got)


def test_a_span_s_roll_up_is_read_instead_of_its_hours_and_not_once_they_changed(tmp_path):
    """A span's roll-up (here of 2 hours) stands for its hours' facts - the window's figures are
    the oracle's without them -; late samples rename its hours, and until it is rolled up again
    their new facts are read instead (not the window computed the long way), then its new roll-up."""
    golden(tmp_path / "store")
    facts = tmp_path / "facts"
    facts.mkdir()
    p = Params(T(10), T(12))
    with ONE_HOUR_BUCKETS, mock.patch.object(hour_facts, "ROLLUP_HOURS", 2):
        assert hour_facts.rollup_spans(Params(T(9), T(13))) == [T(10)]
        con = open_reader(tmp_path / "store")
        files = write_facts(con, Params(T(9), T(13)), T(20), facts, [(T(9), T(13))])
        assert write_rollups(con, facts, files) == 1
        for h in (T(10), T(11)):  # the span's hours' own files gone: the roll-up alone answers
            files[h].rename(facts / f"kept-{h:%H}.parquet")
        got = hour_facts.window_use(con, p, T(20), finder(facts))
        assert got is not None and got.hours == 2 and not mismatches(oracle(con, p, T(20)), got)
        for h in (T(10), T(11)):
            (facts / f"kept-{h:%H}.parquet").rename(files[h])
        late_samples(tmp_path / "store", util=40.0)
        con = open_reader(tmp_path / "store")
        assert hour_facts.window_use(con, p, T(20), finder(facts)) is None  # neither the roll-up nor the hours current
        files = write_facts(con, Params(T(9), T(13)), T(20), facts, [(T(9), T(13))])
        got = hour_facts.window_use(con, p, T(20), finder(facts))  # the hours' new facts, the roll-up older
        assert got is not None and not mismatches(oracle(con, p, T(20)), got)
        old = finder(facts).present_span(T(10))
        for f in facts.glob("span*.parquet"):
            f.unlink()
        write_rollups(con, facts, files)
        assert finder(facts).present_span(T(10))[0] != old[0]
        got = hour_facts.window_use(con, p, T(20), finder(facts))
        assert got is not None and not mismatches(oracle(con, p, T(20)), got)


def test_a_fact_removed_after_it_was_listed_is_not_read(tmp_path):
    """The warmer replaces an hour's file when its inputs change, and drops days that age out: a
    window that listed it just before computes the long way, it does not fail."""
    golden(tmp_path / "store")
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    with ONE_HOUR_BUCKETS:
        files = write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(13))])
        listed = finder(tmp_path / "facts")
        gone = {h: listed.present(h) for h in files}
        files[T(11)].unlink()
        listing = type("Listed", (), {"present": lambda self, h: gone[h], "present_span": lambda self, s: None})()
        assert hour_facts.window_use(con, Params(T(10), T(12)), T(20), listing) is None


def test_a_cluster_s_window_from_the_facts(tmp_path):
    """Two clusters, one GPU of each with the same host name and UUID and a job of each with the
    same key: a cluster's window from the facts is its analysis' (the facts hold each GPU's and
    job group's cluster), and the fleet's the sum of both."""
    build_golden(tmp_path / "store")
    other = Fleet(tmp_path / "store", cluster="c2")
    other.gpu_series("n1", "GPU-A", T(9), T(13), util=between(T(10), T(11), 10.0, 90.0))
    other.gpu_series("n8", "GPU-Z", T(10), T(12), util=0.0, model=A100)
    other.job("101", account="physics", user="zed", start=T(9, 30), end=T(12, 30), gpus=1, placements=[("n1", "GPU-A")])
    w = StoreWriter(tmp_path / "store")
    w.commit(other.batch("c2"))
    compact(w, T(20))
    w.close()
    (tmp_path / "facts").mkdir()
    con = open_reader(tmp_path / "store")
    with ONE_HOUR_BUCKETS:
        write_facts(con, Params(T(9), T(13)), T(20), tmp_path / "facts", [(T(9), T(13))])
        totals = {}
        for f in (Filters(), Filters(cluster="c1"), Filters(cluster="c2")):
            p = Params(T(10), T(12), filters=f)
            got = hour_facts.window_use(con, p, T(20), finder(tmp_path / "facts"))
            assert got is not None and got.totals.scope == ("fleet" if f.cluster is None else f"cluster={f.cluster}")
            bad = mismatches(oracle(con, p, T(20)), got)
            assert not bad, (f, "\n".join(bad))
            totals[f.cluster] = got.totals
        assert totals[None].data_gpu_h == pytest.approx(totals["c1"].data_gpu_h + totals["c2"].data_gpu_h, **TOL)
        assert totals["c2"].allocated_gpu_h == pytest.approx(2.0)  # job c2/101 over the window
