"""GPU health from the store's hourly health summaries gives the raw samples' figures.

gpufleet.analytics.health reads a window's health from per-GPU hourly rows
(gpufleet.collector.schema.HEALTH_HOURS, written with each hour's summary) where the store has
them and from raw samples elsewhere (window edges, hours not summarised yet). On the random
fleets of test_analytics_properties, with MIG instances, each GPU's samples over several files,
and temperatures, XID codes, ECC and row-remap counters that rise and reset, throttle reasons
and lost GPUs, every row of gpu_health and events equals the raw path's (summaries=False, the
SQL the dashboards used before) to 1e-9 relative, for windows cut anywhere and under the
cluster and model filters - also with an open hour's rows (upkeep keeps its summary current)
and the minutes after them raw. A health summary off by one hour fails the comparison.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_analytics_golden import A100
from test_analytics_properties import MAX_GAP, SETTINGS, TOL, at, batches, fleets, scratch
from tests.support.random_stores import by_shard, host_of_shard, late_and_fresh, mig_some, split

from gpufleet.analytics import fleet_now, health
from gpufleet.analytics.fleet_now import collector_status
from gpufleet.analytics.params import Filters, Params
from gpufleet.collector.maintenance import compact
from gpufleet.collector.shard import Shard
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.collector.summaries import SummaryParams


def _h(seed: int, g: int, t: int, what: str) -> int:
    """A deterministic number of (seed, GPU, time, field): the same sample twice has the same values."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{g}/{t}/{what}".encode(), digest_size=4).digest(), "big")


def health_fields(seed: int):
    """Health columns of fleet GPU g at time t: temperatures and power (some unknown), an XID code
    that sticks for a while, volatile ECC and row-remap counters that step up and reset (a driver
    reload), lifetime counters, throttle reasons and lost samples."""

    def fields(g, t) -> dict:
        gpu = g["gpu"]
        step = 300 + 200 * (_h(seed, gpu, 0, "step") % 10)  # each GPU's counters step at their own pace
        era = t // 5000  # a reset every 5,000 s
        counter = lambda what: None if _h(seed, gpu, t, what) % 7 == 0 else (t % 5000) // step + (_h(seed, gpu, era, what) % 3)  # noqa: E731
        known = _h(seed, gpu, t, "temp") % 5 != 0
        return {
            "gpu_temp_c": float(30 + _h(seed, gpu, t, "t") % 60) if known else None,
            "mem_temp_c": float(40 + _h(seed, gpu, t, "m") % 50) if _h(seed, gpu, t, "mk") % 3 else None,
            "power_w": float(_h(seed, gpu, t, "p") % 700) / 2 if known else None,
            "xid_last": [0, 0, 0, 13, 31, 79, 94][(t // 900 + _h(seed, gpu, 0, "x")) % 7] if gpu % 2 == 0 else 0,
            "ecc_dbe_vol": counter("dbe"),
            "ecc_sbe_vol": counter("sbe"),
            "remap_uncorrectable": counter("unc"),
            "pcie_replay": counter("pcie"),
            "thermal_violation_ns": None if counter("tv") is None else counter("tv") * 1_000_000_007,
            "power_violation_ns": counter("pv"),
            "ecc_dbe_agg": _h(seed, gpu, t // 3600, "agg") % 4,
            "remap_correctable": _h(seed, gpu, t // 3600, "rc") % 3,
            "remap_failure": 1 if _h(seed, gpu, t // 1800, "rf") % 9 == 0 else 0,
            "clocks_event_reasons": None if _h(seed, gpu, t, "r") % 6 == 0 else [0, 0, 0x4, 0x8, 0x20, 0x40, 0x80, 0x24][_h(seed, gpu, t, "rb") % 8],
            "gpu_up": None if _h(seed, gpu, t, "u") % 11 == 0 else (0.0 if _h(seed, gpu, t // 600, "lost") % 8 == 0 else 1.0),
        }

    return fields


def same(raw: pl.DataFrame, got: pl.DataFrame, keys: list[str]) -> list[str]:
    """Where two answers differ (columns, rows, values to 1e-9 relative): empty when they agree."""
    if raw.columns != got.columns:
        return [f"columns {raw.columns} != {got.columns}"]
    if raw.height != got.height:
        return [f"rows {raw.height} != {got.height}"]
    raw, got = raw.sort(keys, nulls_last=True), got.sort(keys, nulls_last=True)
    bad = []
    for c, t in raw.schema.items():
        x, y = raw[c].to_list(), got[c].to_list()
        if t.is_float():
            ok = [v is None for v in x] == [v is None for v in y] and [v for v in x if v is not None] == pytest.approx(
                [v for v in y if v is not None], **TOL)
        else:
            ok = x == y
        if not ok:
            bad.append(f"{c}: {x} != {y}")
    return bad


GPU_KEYS = ["cluster", "host", "gpu_uuid", "gi"]
EVENT_KEYS = ["cluster", "host", "gpu_uuid", "gi", "kind", "code"]
TEMP_KEYS = ["cluster", "host", "bucket"]
HOUR = timedelta(hours=1)
DAY = 24 * 3600


def reads_day_file(con) -> bool:
    """Does the reader take some hours' health rows from a day's merged file?"""
    views = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'gpu_health_hours'").fetchall()
    return any("/healthday" in sql for sql, in views)


def compare(con, p: Params) -> list[str]:
    """window_health's answers against the raw path's, and gpu_health's and events' on their own
    with the samples outside the summarised hours read in one scan (as when they leave many
    stretches) rather than a query a stretch."""
    two_h = timedelta(hours=2)  # temperature buckets of whole hours: composed from the same rows
    raw, got = health.window_health(con, p, summaries=False, temperature=two_h), health.window_health(con, p, temperature=two_h)
    bad = same(raw["gpus"], got["gpus"], GPU_KEYS) + same(raw["events"], got["events"], EVENT_KEYS)
    bad += same(raw["temperature"], got["temperature"], TEMP_KEYS)
    bad += same(health.temperature(con, p, HOUR, summaries=False), health.temperature(con, p, HOUR), TEMP_KEYS)
    stretches, health.MAX_STRETCHES = health.MAX_STRETCHES, 0
    try:
        return bad + same(raw["gpus"], health.gpu_health(con, p), GPU_KEYS) + same(raw["events"], health.events(con, p), EVENT_KEYS)
    finally:
        health.MAX_STRETCHES = stretches


def compare_now(con, p: Params, as_of: int, lookback: int) -> list[str]:
    """Fleet now's states at `as_of` (seconds from BASE) over a `lookback` (seconds) with the
    look-back's summarised hours from their health summaries' run facts, against every sample read."""
    kw = dict(lookback=timedelta(seconds=lookback))
    raw, got = fleet_now.gpu_states(con, p, at(as_of), summaries=False, **kw), fleet_now.gpu_states(con, p, at(as_of), **kw)
    return same(raw, got, GPU_KEYS)


def now_hours_used(con, p: Params, as_of: int, lookback: int) -> int:
    span = fleet_now._summarised_span(con, fleet_now._binds(p, at(as_of), fleet_now.STALE_AFTER, timedelta(seconds=lookback),
                                                            fleet_now.FORGET_AFTER))
    return int((span[1] - span[0]).total_seconds() // 3600)


def store(tmp, fleet, seed: int, how, compact_at: int):
    w = StoreWriter(tmp)
    for batch in split(fleet, *how, fields=health_fields(seed)):
        w.commit(batch)
    compact(w, at(compact_at), SummaryParams(max_gap_s=MAX_GAP))
    w.close()
    return open_reader(tmp)


@SETTINGS
@given(fleets(), st.integers(0, 2**16), st.sampled_from([(1, False), (3, False), (2, True)]), st.data())
def test_health_from_summaries_gives_the_raw_figures(fleet, seed, how, data):
    every_hour = fleet["now"] + 2 * 3600
    # a day later: the closed day's health summaries read from its merged file
    compact_at = data.draw(st.sampled_from([every_hour, every_hour + DAY]) | st.integers(3600, every_hour), label="compact_at")
    a, m, b = fleet["cuts"]
    with scratch() as tmp:
        con = store(tmp, fleet, seed, how, compact_at)
        summarised = con.execute("SELECT count(*) FROM health_hours").fetchone()[0]
        event(f"hours with health summaries: {min(summarised, 3)}")
        event(f"a day's merged health file read: {reads_day_file(con)}")
        event(f"an open hour's health rows: {con.execute('SELECT count(*) FROM now_hours').fetchone()[0] > 0}")
        whole = (at(0).replace(minute=0, second=0), at(fleet["now"] + 3600).replace(minute=0, second=0))
        for lo, hi in ((at(a), at(b)), (at(a), at(m)), (at(m), at(b)), whole):
            bad = compare(con, Params(lo, hi))
            assert not bad, (lo, hi, "\n".join(bad))
        for f in (Filters(cluster="prop"), Filters(model=A100), Filters(cluster="elsewhere")):
            bad = compare(con, Params(*whole, filters=f))
            assert not bad, (f, "\n".join(bad))
        # Fleet now around the last sample, over look-backs that take in whole summarised hours
        # or none; another idle threshold or a model filter reads every sample
        as_of = max(g["samples"][-1][0] for g in fleet["gpus"]) + data.draw(st.integers(-3600, 900), label="as_of after the last sample")
        lookback = data.draw(st.sampled_from([1800, 3 * 3600, 10**6]), label="lookback")
        used = now_hours_used(con, Params(*whole), as_of, lookback)
        event(f"Fleet now: summarised hours used: {min(used, 3)}")
        for p in (Params(*whole), Params(*whole, idle_threshold=30.0), Params(*whole, filters=Filters(cluster="prop")),
                  Params(*whole, filters=Filters(model=A100))):
            bad = compare_now(con, p, as_of, lookback)
            assert not bad, (p, as_of, lookback, "\n".join(bad))


@SETTINGS
@given(fleets(), st.integers(0, 2**16), st.integers(2, 3), st.data())
def test_shards_health_summaries_give_the_raw_figures(fleet, seed, n, data):
    """Collector shards summarise their own GPUs' health at their own pace (one may never have,
    one may have merged a closed day's): the union reads the raw figures."""
    every_hour = fleet["now"] + 2 * 3600
    with scratch() as tmp:
        root = Path(tmp)
        writers = {k: StoreWriter(Shard(k, n).root(root)) for k in range(1, n + 1)}
        spread = {"h0": host_of_shard(1, n), "h1": host_of_shard(2, n), "hm": host_of_shard(n, n)}
        for batch in batches(fleet, placement=lambda g: {**mig_some(g), "host": spread[mig_some(g)["host"]]}, fields=health_fields(seed)):
            for k, part in by_shard(batch, n).items():
                writers[k].commit(part)
        for k, w in writers.items():
            when = data.draw(st.sampled_from([every_hour, every_hour + DAY, None]) | st.integers(3600, every_hour), label=f"shard {k} compacts at")
            if when is not None:
                compact(w, at(when), SummaryParams(max_gap_s=MAX_GAP))
            w.close()
        con = open_reader(root)
        a, m, b = fleet["cuts"]
        for lo, hi in ((at(a), at(b)), (at(a), at(m)), (at(0).replace(minute=0, second=0), at(fleet["now"] + 3600).replace(minute=0, second=0))):
            bad = compare(con, Params(lo, hi))
            assert not bad, (lo, hi, "\n".join(bad))
        for as_of in (fleet["now"], max(g["samples"][-1][0] for g in fleet["gpus"]) - 1800):
            bad = compare_now(con, Params(at(a), at(b)), as_of, 10**6)
            assert not bad, (as_of, "\n".join(bad))


def health_rows(con) -> pl.DataFrame:
    return pl.from_arrow(con.sql("SELECT * FROM gpu_health_hours ORDER BY cluster, host, gpu_uuid, gi, model, hour").to_arrow_table())


@SETTINGS
@given(fleets(), st.integers(0, 2**16), st.randoms(use_true_random=False), st.integers(0, 3), st.sampled_from([0, DAY]))
def test_health_summaries_rebuilt_after_late_data_are_a_fresh_build(fleet, seed, rnd, late_n, later):
    """Late batches (some for long-closed hours) and a re-ingest leave the health summaries a
    fresh store of all the batches builds; also once their day is closed, its merged file made
    again with the rebuilt hours."""
    every = split(fleet, 3, False, fields=health_fields(seed))
    with late_and_fresh(every, rnd, late_n, SummaryParams(max_gap_s=MAX_GAP), at(fleet["now"] + 7200 + later)) as (tmp, fresh):
        got, want = open_reader(tmp), open_reader(fresh)
        assert reads_day_file(got) == reads_day_file(want)
        event(f"a day's merged health file read: {reads_day_file(got)}")
        assert health_rows(got).equals(health_rows(want))
        assert got.sql("SELECT * FROM health_hours ORDER BY hour").fetchall() == want.sql("SELECT * FROM health_hours ORDER BY hour").fetchall()


def test_a_health_summary_one_hour_off_fails_the_comparison(tmp_path):
    """The comparison can see a summary that puts its rows in the wrong hour."""
    fleet = {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, 4 * 3600, 60)]}
                      for g in range(2)], "jobs": [], "cuts": [0, 3600, 4 * 3600], "now": 4 * 3600}
    con = store(tmp_path, fleet, 7, (1, False), 6 * 3600)
    whole = Params(at(0), at(4 * 3600))
    assert con.execute("SELECT count(*) FROM health_hours").fetchone()[0] >= 3
    assert not compare(con, whole) and not compare_now(con, whole, 4 * 3600, 3 * 3600)
    assert now_hours_used(con, whole, 4 * 3600, 3 * 3600) == 3  # the look-back [01:00, 04:00]: whole hours, all summarised
    con.close()
    files = sorted(Path(tmp_path).rglob("health*.parquet"))
    assert files
    for f in files:  # every health row an hour late
        t = pq.read_table(f)
        t = t.set_column(t.schema.get_field_index("hour"), "hour", pl.from_arrow(t["hour"]).dt.offset_by("1h").to_arrow())
        pq.write_table(t, f)
    con = open_reader(tmp_path)
    assert compare(con, Params(at(3600), at(3 * 3600)))  # seen
    assert compare_now(con, whole, 4 * 3600, 3 * 3600)  # and in Fleet now's run facts


def test_hours_summarised_before_health_summaries_read_raw_until_upkeep_adds_them(tmp_path):
    """A store whose summaries predate the health summaries (no health file in their entries)
    gives the raw figures, and the next upkeep pass adds the health summaries to them."""
    fleet = {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, 3 * 3600, 60)]}
                      for g in range(2)], "jobs": [], "cuts": [0, 3600, 3 * 3600], "now": 3 * 3600}
    store(tmp_path, fleet, 3, (1, False), 5 * 3600).close()
    manifest = tmp_path / "manifest.json"
    m = json.loads(manifest.read_text())
    for e in m["summaries"]:
        e.pop("health"), e.pop("health_format")
    manifest.write_text(json.dumps(m))
    p = Params(at(0), at(3 * 3600))
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM health_hours").fetchone()[0] == 0
    assert not compare(con, p)
    con.close()
    hours = len(m["summaries"])
    assert collector_status(tmp_path)["summaries"] == {"summarised": hours, "awaiting_rebuild": 0, "health_awaiting_rebuild": hours,
                                                          "joined_awaiting_rebuild": 0, "summaries_only": 0}  # said
    w = StoreWriter(tmp_path)
    compact(w, at(5 * 3600), SummaryParams(max_gap_s=MAX_GAP))
    w.close()
    assert collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == 0
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM health_hours").fetchone()[0] == con.execute("SELECT count(*) FROM summary_hours").fetchone()[0] >= 3
    assert not compare(con, p)


def test_an_upkeep_pass_builds_the_newest_health_summaries_first_and_a_bounded_number(tmp_path):
    """Upkeep holds the writer's lock: a store with many hours to give health summaries gets the
    newest `health_hours` a pass, the rest at the next passes, and reads raw where none is yet."""
    fleet = {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, 5 * 3600, 60)]}
                      for g in range(2)], "jobs": [], "cuts": [0, 3600, 5 * 3600], "now": 5 * 3600}
    w = StoreWriter(tmp_path)
    for batch in split(fleet, 1, False, fields=health_fields(5)):
        w.commit(batch)
    p = Params(at(0), at(5 * 3600))
    seen = []
    for _ in range(4):
        compact(w, at(7 * 3600), SummaryParams(max_gap_s=MAX_GAP), health_hours=2)
        con = open_reader(tmp_path)
        seen.append([r[0] for r in con.execute("SELECT hour FROM health_hours ORDER BY hour").fetchall()])
        assert not compare(con, p)
        con.close()
    w.close()
    assert [len(s) for s in seen] == [2, 4, 6, 6]
    assert seen[0] == seen[2][-2:] and seen[1] == seen[2][-4:]  # the newest first


def test_an_open_hours_health_comes_from_its_summary_then_the_minutes_after(tmp_path):
    """Upkeep keeps the open hour's summary current with its health rows (the entry's "now"
    file): a window ending in the open hour reads raw only the minutes after that summary ends,
    with the raw figures (counters that pass the window's first value and XID codes on both
    sides of its end: one hour, two parts). The reader taking it to end a bucket later or
    earlier than it does fails the comparison. An open hour's file of the format before (run
    facts only) is read raw, and rebuilt by the next upkeep pass."""
    end = 3 * 3600 + 50 * 60
    fleet = {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, end, 30)]}
                      for g in range(4)], "jobs": [], "cuts": [0, 3600, end], "now": end}
    con = store(tmp_path, fleet, 11, (2, True), end)
    (hour, ends), = con.execute("SELECT hour, ends FROM now_hours").fetchall()
    assert hour == at(3 * 3600) and at(3 * 3600) < ends < at(end)  # the open hour, summarised up to its settled buckets
    windows = [Params(at(0), at(end)), Params(at(3 * 3600), at(end)), Params(at(2 * 3600 + 17), at(end - 7))]
    for p in windows:
        assert (hour, ends, True) in health._summarised_hours(con.cursor(), p)
        bad = compare(con, p)
        assert not bad, (p, "\n".join(bad))
    assert not compare_now(con, windows[0], end, 3 * 3600)
    for off in ("+", "-"):
        planted = open_reader(tmp_path)
        planted.execute(f"UPDATE now_hours SET ends = ends {off} INTERVAL 5 MINUTE")
        assert compare(planted, windows[0]), off
    manifest = tmp_path / "manifest.json"
    m = json.loads(manifest.read_text())
    opened, = [e for e in m["summaries"] if e.get("to")]
    opened["now_format"] = 2
    manifest.write_text(json.dumps(m))
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM now_hours").fetchone()[0] == 0
    assert not compare(con, windows[0]) and not compare_now(con, windows[0], end, 3 * 3600)
    assert collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == 1  # the open hour's, read raw: said
    w = StoreWriter(tmp_path)
    compact(w, at(end), SummaryParams(max_gap_s=MAX_GAP))
    w.close()
    assert open_reader(tmp_path).execute("SELECT hour, ends FROM now_hours").fetchall() == [(hour, ends)]
    assert collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == 0


def test_a_closed_days_health_is_read_from_its_merged_file_for_the_hours_it_holds(tmp_path):
    """Once a day is closed, upkeep merges its hourly health summaries into one file sorted by
    GPU, and readers take it for its hours (the same figures). A late batch for one of its hours:
    that hour is read from its samples, the others still from the day's file, then from its rebuilt
    summary's file; late batches for more hours make upkeep merge the day again. Retention retiring
    the day's first hours makes the reader skip them in the day's file, which is not written again
    for it. A merged file with one hour's rows wrong fails the comparison: it is what is read."""
    end = DAY + 6 * 3600
    fleet = {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, end, 120)]}
                      for g in range(3)], "jobs": [], "cuts": [0, DAY, end], "now": end}
    hourly = []  # as a collector's rounds: each hour's samples in files of their own
    for b in split(fleet, 1, False, fields=health_fields(17)):
        hours = pc.floor_temporal(b.samples["ts"], unit="hour") if b.samples is not None else None
        for h in (sorted(set(hours.to_pylist())) if hours is not None else [None]):
            hourly.append(b if h is None else type(b)(key=f"{b.key}/{h}", samples=b.samples.filter(pc.equal(hours, h)), gpus=b.gpus))
    late = [hourly.pop(h) for h in (17, 13, 9, 5)]  # the first GPU's hours 05:00, 09:00, 13:00 and 17:00 come late
    w = StoreWriter(tmp_path)
    for batch in hourly:
        w.commit(batch)
    compact(w, at(end + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP), health_hours=None)  # 30 hours: more than a pass's
    manifest = lambda: json.loads((tmp_path / "manifest.json").read_text())  # noqa: E731
    (day,) = manifest()["health_days"]  # the first day; the second is open
    assert day["day"] == f"{at(0):%Y-%m-%d}" and len(day["hours"]) == 24
    windows = [Params(at(0), at(end)), Params(at(3 * 3600 + 17), at(DAY + 3600 - 7)), Params(at(5 * 3600), at(9 * 3600))]

    def check(skips: bool) -> None:
        con = open_reader(tmp_path)
        assert reads_day_file(con)
        view, = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'gpu_health_hours'").fetchall()
        assert ("unnest" in view[0]) == skips  # the hours it holds that are read elsewhere (DuckDB rewrites NOT IN)
        for p in windows:
            bad = compare(con, p)
            assert not bad, (p, "\n".join(bad))
        con.close()

    check(skips=False)
    w.commit(late[-1])  # late samples for 05:00: its summary goes; read raw until upkeep
    w.publish()
    check(skips=True)
    compact(w, at(end + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP))
    assert manifest()["health_days"] == [day]  # rebuilt, the hour is read from its own file: a few such hours are
    check(skips=True)
    for batch in late[:-1]:  # ... but more than a few (HEALTH_DAY_LOOSE_HOURS) make upkeep merge the day again
        w.commit(batch)
    compact(w, at(end + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP))
    (again,) = manifest()["health_days"]
    assert again["file"] != day["file"] and len(again["hours"]) == 24
    check(skips=False)
    from gpufleet.collector.maintenance import apply_retention
    apply_retention(w, at(DAY + 4 * 3600 + 30), raw_days=1, rollup_days=400)  # the day's first hours' samples retired
    compact(w, at(end + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP))
    assert 0 < sum(h < f"{at(DAY):%Y-%m-%dT%H}" for h in w.summaries) < 24  # some of the day's hours left
    assert manifest()["health_days"] == [again]  # not written again
    windows = [Params(at(6 * 3600), at(end)), Params(at(7 * 3600 + 17), at(DAY + 3600 - 7))]
    check(skips=True)
    w.close()
    merged = tmp_path / again["file"]
    t = pl.read_parquet(merged)
    hour = t["hour"].sort()[t.height - 1]  # the day's last hour, still summarised
    pl.concat([t.filter(pl.col("hour") != hour), t.filter(pl.col("hour") == hour).with_columns(pl.col("samples") + 1)]).write_parquet(merged)
    assert compare(open_reader(tmp_path), windows[0])


def test_a_gpu_whose_model_name_changes_within_an_hour_gives_the_raw_figures(tmp_path):
    """An exporter upgraded mid-hour may name the same GPU's model another way ("NVIDIA H100 80GB
    HBM3" -> "H100"): its health summary then has a row per model for that hour, each carrying the
    GPU-hour's run facts. The Health window and Fleet now give the raw figures (the run facts
    counted once per GPU-hour, whatever rows carry them)."""
    end = 4 * 3600
    fleet = {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}",
                       "samples": [(t, 50.0 if (t // 600) % 3 else 0.0, float((t // 900) % 2)) for t in range(0, end, 60)]}
                      for g in range(3)], "jobs": [], "cuts": [0, 3600, end], "now": end}
    w = StoreWriter(tmp_path)
    for b in split(fleet, 1, False, fields=health_fields(23)):
        if b.samples is not None and b.samples.num_rows and "GPU-prop-0/" in b.key:
            renamed = pc.if_else(pc.greater_equal(b.samples["ts"], pa.scalar(at(3600 + 1800), pa.timestamp("us"))), "H100", b.samples["model"])
            b = type(b)(key=b.key, samples=b.samples.set_column(b.samples.schema.get_field_index("model"), "model", renamed), gpus=b.gpus)
        w.commit(b)
    compact(w, at(end + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP), health_hours=None)
    w.close()
    con = open_reader(tmp_path)
    (rows,) = con.execute("SELECT count(*) FROM gpu_health_hours WHERE gpu_uuid = 'GPU-prop-0' AND hour = ?", [at(3600)]).fetchone()
    assert rows == 2  # one per model name
    for p in (Params(at(0), at(end)), Params(at(1800 + 17), at(end - 7))):
        bad = compare(con, p)
        assert not bad, (p, "\n".join(bad))
    for as_of, lookback in ((end, 3 * 3600), (end - 60, 10**6), (2 * 3600 + 5, 3600)):
        bad = compare_now(con, Params(at(0), at(end)), as_of, lookback)
        assert not bad, (as_of, lookback, "\n".join(bad))
    assert now_hours_used(con, Params(at(0), at(end)), end, 3 * 3600) == 3  # the hour of two rows among them
