"""GPU health from the store's facts gives the raw samples' figures.

gpufleet.analytics.health reads a window's health from its facts (gpufleet.analytics.facts.FactWindow:
stored parts at the coarsest grain that fits, the minutes a window edge cuts and buckets without
facts cut raw by the same rule), and a counter event's time and samples raw from the one part of
its GPU where the counter passes the window's first value. On the random fleets of
test_analytics_properties, with MIG instances, each GPU's samples over several files, and
temperatures, XID codes, ECC and row-remap counters that rise and reset, throttle reasons and lost
GPUs, every row of gpu_health, events and the temperature map (buckets of 5 minutes, whole hours
and a day: the grains that divide them) equals the raw path's (facts=False, the SQL oracle) to
1e-9 relative, for windows cut anywhere and under the cluster and model filters, with upkeep run
at any time (facts for the hours settled by then) and on collector shards. Facts an hour off fail
the comparison.

Fleet now's run facts are still written with the hourly health files (gpufleet.collector.schema
NOW_HOURS): compare_now holds Fleet now's states from them to every sample read.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
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
DAY = 24 * 3600


def compare(con, p: Params) -> list[str]:
    """window_health's answers (temperature in buckets of 2 hours: hour facts) against the raw
    path's, and the temperature map's in buckets of 5 minutes and a day (5-minute and day facts)."""
    two_h = timedelta(hours=2)
    raw, got = health.window_health(con, p, facts=False, temperature=two_h), health.window_health(con, p, temperature=two_h)
    bad = same(raw["gpus"], got["gpus"], GPU_KEYS) + same(raw["events"], got["events"], EVENT_KEYS)
    bad += same(raw["temperature"], got["temperature"], TEMP_KEYS)
    for bucket in (timedelta(minutes=5), timedelta(days=1)):
        bad += same(health.temperature(con, p, bucket, facts=False), health.temperature(con, p, bucket), TEMP_KEYS)
    return bad


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
    compact(w, at(compact_at), SummaryParams(max_gap_s=MAX_GAP), facts_hours=None)
    w.close()
    return open_reader(tmp)


def fact_days(con) -> int:
    """Days the reader has hour and day facts of."""
    return con.execute("SELECT count(*) FROM fact_files WHERE grain_s = 86400").fetchone()[0]


@SETTINGS
@given(fleets(), st.integers(0, 2**16), st.sampled_from([(1, False), (3, False), (2, True)]), st.data())
def test_health_from_facts_gives_the_raw_figures(fleet, seed, how, data):
    every_hour = fleet["now"] + 2 * 3600
    # a day later: the closed day's hour and day facts
    compact_at = data.draw(st.sampled_from([every_hour, every_hour + DAY]) | st.integers(3600, every_hour), label="compact_at")
    a, m, b = fleet["cuts"]
    with scratch() as tmp:
        con = store(tmp, fleet, seed, how, compact_at)
        summarised = con.execute("SELECT count(*) FROM health_hours").fetchone()[0]
        event(f"hours with health summaries: {min(summarised, 3)}")
        event(f"days with hour and day facts: {min(fact_days(con), 2)}")
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
def test_shards_health_gives_the_raw_figures(fleet, seed, n, data):
    """Collector shards build their own GPUs' facts (and run facts) at their own pace (one may
    never have, one may have closed a day): the union reads the raw figures."""
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
                compact(w, at(when), SummaryParams(max_gap_s=MAX_GAP), facts_hours=None)
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
    return pl.from_arrow(con.sql("SELECT * FROM gpu_health_hours ORDER BY cluster, host, gpu_uuid, gi, hour").to_arrow_table())


@SETTINGS
@given(fleets(), st.integers(0, 2**16), st.randoms(use_true_random=False), st.integers(0, 3), st.sampled_from([0, DAY]))
def test_run_facts_rebuilt_after_late_data_are_a_fresh_build(fleet, seed, rnd, late_n, later):
    """Late batches (some for long-closed hours) and a re-ingest leave the hours' run facts files
    a fresh store of all the batches builds; also once their day is closed."""
    every = split(fleet, 3, False, fields=health_fields(seed))
    with late_and_fresh(every, rnd, late_n, SummaryParams(max_gap_s=MAX_GAP), at(fleet["now"] + 7200 + later)) as (tmp, fresh):
        got, want = open_reader(tmp), open_reader(fresh)
        assert health_rows(got).equals(health_rows(want))
        assert got.sql("SELECT * FROM health_hours ORDER BY hour").fetchall() == want.sql("SELECT * FROM health_hours ORDER BY hour").fetchall()


def steady(n: int, end: int, step: int = 60) -> dict:
    return {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, end, step)]}
                     for g in range(n)], "jobs": [], "cuts": [0, 3600, end], "now": end}


def shift_hour(files: list[Path], cols: list[str], us: bool) -> None:
    """Every row of the files an hour late in `cols` (epoch microseconds when `us`, else timestamps)."""
    for f in files:
        t = pl.read_parquet(f)
        t = t.with_columns(*((pl.col(c) + 3_600_000_000) if us else pl.col(c).dt.offset_by("1h") for c in cols))
        t.write_parquet(f)


def test_facts_or_run_facts_one_hour_off_fail_the_comparison(tmp_path):
    """The comparisons can see facts, or run facts, that put their rows in the wrong hour."""
    fleet = steady(2, 4 * 3600)
    con = store(tmp_path, fleet, 7, (1, False), 6 * 3600)
    whole = Params(at(0), at(4 * 3600))
    assert con.execute("SELECT count(*) FROM health_hours").fetchone()[0] >= 3
    assert con.execute("SELECT count(*) FROM fact_files WHERE grain_s = 300").fetchone()[0] >= 3
    assert not compare(con, whole) and not compare_now(con, whole, 4 * 3600, 3 * 3600)
    assert now_hours_used(con, whole, 4 * 3600, 3 * 3600) == 3  # the look-back [01:00, 04:00]: whole hours, all summarised
    con.close()
    facts = sorted(Path(tmp_path).rglob("facts/5m/**/*.parquet"))
    assert facts
    shift_hour(facts, ["p0", "p1"], us=True)
    shift_hour(facts, ["bucket"], us=False)
    assert compare(open_reader(tmp_path), Params(at(3600), at(3 * 3600)))  # seen
    files = sorted(Path(tmp_path).rglob("health*.parquet"))
    assert files
    shift_hour(files, ["hour"], us=False)
    assert compare_now(open_reader(tmp_path), whole, 4 * 3600, 3 * 3600)  # and in Fleet now's run facts


def test_a_store_written_before_has_its_health_files_rebuilt_and_its_day_files_retired(tmp_path):
    """A store whose hours' health files are of the format before (the health figures with the
    run facts, format 2) and that lists merged health day files: readers ignore both (the run facts
    read raw until rebuilt: the same states; health from the facts), collector_status says how
    many hours wait, and the next upkeep pass rebuilds the run facts files and retires the day
    files, deleted after the grace period."""
    fleet = steady(2, 3 * 3600)
    store(tmp_path, fleet, 3, (1, False), 5 * 3600).close()
    manifest = tmp_path / "manifest.json"
    m = json.loads(manifest.read_text())
    hours = [e for e in m["summaries"] if not e.get("to")]
    day_rel = f"summaries/date={hours[0]['hour'][:10]}/healthday2-000000000000.parquet"
    (tmp_path / day_rel).write_bytes((tmp_path / hours[0]["health"]).read_bytes())
    old = []
    for e in hours:  # as the version before named them
        rel = e["health"].replace("/health3-", "/health2-")
        (tmp_path / e["health"]).rename(tmp_path / rel)
        e["health"], e["health_format"] = rel, 2
        old.append(rel)
    m["health_days"] = [{"day": hours[0]["hour"][:10], "file": day_rel, "format": 2, "hours": {e["hour"]: e["health"] for e in hours}}]
    manifest.write_text(json.dumps(m))
    p = Params(at(0), at(3 * 3600))
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM health_hours").fetchone()[0] == 0  # ignored
    assert not compare(con, p) and not compare_now(con, p, 3 * 3600, 3 * 3600)
    con.close()
    assert collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == len(hours)  # said
    clock = [at(5 * 3600)]
    w = StoreWriter(tmp_path, clock=lambda: clock[0])
    compact(w, at(5 * 3600), SummaryParams(max_gap_s=MAX_GAP), facts_hours=None)
    m = json.loads(manifest.read_text())
    assert m["health_days"] == [] and collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == 0
    assert all(e["health_format"] == 3 and e["health"] not in old for e in m["summaries"] if not e.get("to"))
    clock[0] += timedelta(hours=1)  # past the grace period: the retired files go at the next publish
    w.publish()
    w.close()
    assert not (tmp_path / day_rel).exists() and not any((tmp_path / f).exists() for f in old)
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM health_hours").fetchone()[0] == len(hours)
    assert not compare(con, p) and not compare_now(con, p, 3 * 3600, 3 * 3600)


def test_an_upkeep_pass_builds_the_newest_run_facts_first_and_a_bounded_number(tmp_path):
    """Upkeep holds the writer's lock: a store with many hours to give run facts files gets the
    newest `health_hours` a pass, the rest at the next passes, and Fleet now reads raw where none is yet."""
    fleet = steady(2, 5 * 3600)
    w = StoreWriter(tmp_path)
    for batch in split(fleet, 1, False, fields=health_fields(5)):
        w.commit(batch)
    p = Params(at(0), at(5 * 3600))
    seen = []
    for _ in range(4):
        compact(w, at(7 * 3600), SummaryParams(max_gap_s=MAX_GAP), health_hours=2)
        con = open_reader(tmp_path)
        seen.append([r[0] for r in con.execute("SELECT hour FROM health_hours ORDER BY hour").fetchall()])
        assert not compare_now(con, p, 5 * 3600, 10**6)
        con.close()
    w.close()
    assert [len(s) for s in seen] == [2, 4, 6, 6]
    assert seen[0] == seen[2][-2:] and seen[1] == seen[2][-4:]  # the newest first


def test_an_open_hours_run_facts_come_from_its_summary_then_the_minutes_after(tmp_path):
    """Upkeep keeps the open hour's summary current with its run facts (the entry's "now" file):
    Fleet now reads raw only the minutes after that summary ends, and the Health window (facts)
    gives the raw figures around it. An open hour's file of the format before is read raw, and
    rebuilt by the next upkeep pass."""
    end = 3 * 3600 + 50 * 60
    fleet = steady(4, end, 30)
    con = store(tmp_path, fleet, 11, (2, True), end)
    (hour, ends), = con.execute("SELECT hour, ends FROM now_hours").fetchall()
    assert hour == at(3 * 3600) and at(3 * 3600) < ends < at(end)  # the open hour, summarised up to its settled buckets
    windows = [Params(at(0), at(end)), Params(at(3 * 3600), at(end)), Params(at(2 * 3600 + 17), at(end - 7))]
    for p in windows:
        bad = compare(con, p)
        assert not bad, (p, "\n".join(bad))
    assert not compare_now(con, windows[0], end, 3 * 3600)
    manifest = tmp_path / "manifest.json"
    m = json.loads(manifest.read_text())
    opened, = [e for e in m["summaries"] if e.get("to")]
    opened["now_format"] = 3
    manifest.write_text(json.dumps(m))
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM now_hours").fetchone()[0] == 0
    assert not compare_now(con, windows[0], end, 3 * 3600)
    assert collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == 1  # the open hour's, read raw: said
    w = StoreWriter(tmp_path)
    compact(w, at(end), SummaryParams(max_gap_s=MAX_GAP))
    w.close()
    assert open_reader(tmp_path).execute("SELECT hour, ends FROM now_hours").fetchall() == [(hour, ends)]
    assert collector_status(tmp_path)["summaries"]["health_awaiting_rebuild"] == 0


def test_a_gpu_whose_model_name_changes_within_an_hour_gives_the_raw_figures(tmp_path):
    """An exporter upgraded mid-hour may name the same GPU's model another way ("NVIDIA H100 80GB
    HBM3" -> "H100"). The Health window (facts) and Fleet now (run facts) give the raw figures."""
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
    compact(w, at(end + 2 * 3600), SummaryParams(max_gap_s=MAX_GAP), health_hours=None, facts_hours=None)
    w.close()
    con = open_reader(tmp_path)
    for p in (Params(at(0), at(end)), Params(at(1800 + 17), at(end - 7))):
        bad = compare(con, p)
        assert not bad, (p, "\n".join(bad))
    for as_of, lookback in ((end, 3 * 3600), (end - 60, 10**6), (2 * 3600 + 5, 3600)):
        bad = compare_now(con, Params(at(0), at(end)), as_of, lookback)
        assert not bad, (as_of, lookback, "\n".join(bad))
    assert now_hours_used(con, Params(at(0), at(end)), end, 3 * 3600) == 3
