"""GPU health from the store's facts gives the raw samples' figures.

gpufleet.analytics.health reads a window's health from its facts (gpufleet.analytics.facts.FactWindow:
stored parts at the coarsest grain that fits, the minutes a window edge cuts and buckets without
facts cut raw by the same rule), and a counter event's time and samples raw from the one part of
its GPU where the counter passes the window's first value. On the random fleets of
test_analytics_properties, with MIG instances, each GPU's samples over several files, and
temperatures, XID codes, ECC and row-remap counters that rise and reset, throttle reasons and lost
GPUs, every row of gpu_health, events and the temperature map (buckets of 5 minutes, whole hours
and a day: the grains that divide them) equals the raw path's (tests/support/raw_health.py, the SQL oracle) to
1e-9 relative, for windows cut anywhere and under the cluster and model filters, with upkeep run
at any time (facts for the hours settled by then) and on collector shards. Facts an hour off fail
the comparison.
"""

from __future__ import annotations

import hashlib
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
from tests.support.random_stores import by_shard, host_of_shard, mig_some, split
from tests.support.raw_health import raw_health

from gpufleet.analytics import health
from gpufleet.analytics.params import Filters, Params
from gpufleet.collector.maintenance import compact
from gpufleet.collector.shard import Shard
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.collector.facts import FactParams


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
    path's, events alone (only the GPUs whose health moved read) too, and the temperature map's in
    buckets of 5 minutes and a day (5-minute and day facts)."""
    two_h = timedelta(hours=2)
    raw, got = raw_health(con, p, ("gpus", "events", "temperature"), two_h), health.window_health(con, p, temperature=two_h)
    bad = same(raw["gpus"], got["gpus"], GPU_KEYS) + same(raw["events"], got["events"], EVENT_KEYS)
    bad += same(raw["events"], health.events(con, p), EVENT_KEYS)
    bad += same(raw["temperature"], got["temperature"], TEMP_KEYS)
    for bucket in (timedelta(minutes=5), timedelta(days=1)):
        bad += same(raw_health(con, p, ("temperature",), bucket)["temperature"], health.temperature(con, p, bucket), TEMP_KEYS)
    return bad


def store(tmp, fleet, seed: int, how, compact_at: int):
    w = StoreWriter(tmp)
    for batch in split(fleet, *how, fields=health_fields(seed)):
        w.commit(batch)
    compact(w, at(compact_at), FactParams(max_gap_s=MAX_GAP), facts_hours=None)
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
        event(f"days with hour and day facts: {min(fact_days(con), 2)}")
        whole = (at(0).replace(minute=0, second=0), at(fleet["now"] + 3600).replace(minute=0, second=0))
        for lo, hi in ((at(a), at(b)), (at(a), at(m)), (at(m), at(b)), whole):
            bad = compare(con, Params(lo, hi))
            assert not bad, (lo, hi, "\n".join(bad))
        for f in (Filters(cluster="prop"), Filters(model=A100), Filters(cluster="elsewhere")):
            bad = compare(con, Params(*whole, filters=f))
            assert not bad, (f, "\n".join(bad))


@SETTINGS
@given(fleets(), st.integers(0, 2**16), st.integers(2, 3), st.data())
def test_shards_health_gives_the_raw_figures(fleet, seed, n, data):
    """Collector shards build their own GPUs' facts at their own pace (one may
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
                compact(w, at(when), FactParams(max_gap_s=MAX_GAP), facts_hours=None)
            w.close()
        con = open_reader(root)
        a, m, b = fleet["cuts"]
        for lo, hi in ((at(a), at(b)), (at(a), at(m)), (at(0).replace(minute=0, second=0), at(fleet["now"] + 3600).replace(minute=0, second=0))):
            bad = compare(con, Params(lo, hi))
            assert not bad, (lo, hi, "\n".join(bad))


def steady(n: int, end: int, step: int = 60) -> dict:
    return {"gpus": [{"gpu": g, "host": f"h{g % 2}", "uuid": f"GPU-prop-{g}", "samples": [(t, 50.0, 1.0) for t in range(0, end, step)]}
                     for g in range(n)], "jobs": [], "cuts": [0, 3600, end], "now": end}


def shift_hour(files: list[Path], cols: list[str], us: bool) -> None:
    """Every row of the files an hour late in `cols` (epoch microseconds when `us`, else timestamps)."""
    for f in files:
        t = pl.read_parquet(f)
        t = t.with_columns(*((pl.col(c) + 3_600_000_000) if us else pl.col(c).dt.offset_by("1h") for c in cols))
        t.write_parquet(f)


def test_facts_one_hour_off_fail_the_comparison(tmp_path):
    """The comparison can see facts that put their rows in the wrong hour."""
    fleet = steady(2, 4 * 3600)
    con = store(tmp_path, fleet, 7, (1, False), 6 * 3600)
    whole = Params(at(0), at(4 * 3600))
    assert con.execute("SELECT count(*) FROM fact_files WHERE grain_s = 300").fetchone()[0] >= 3
    assert not compare(con, whole)
    con.close()
    facts = sorted(Path(tmp_path).rglob("facts/5m/**/*.parquet"))
    assert facts
    shift_hour(facts, ["p0", "p1"], us=True)
    shift_hour(facts, ["bucket"], us=False)
    assert compare(open_reader(tmp_path), Params(at(3600), at(3 * 3600)))  # seen


def test_a_gpu_whose_model_name_changes_within_an_hour_gives_the_raw_figures(tmp_path):
    """An exporter upgraded mid-hour may name the same GPU's model another way ("NVIDIA H100 80GB
    HBM3" -> "H100"). The Health window (facts) gives the raw figures."""
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
    compact(w, at(end + 2 * 3600), FactParams(max_gap_s=MAX_GAP), facts_hours=None)
    w.close()
    con = open_reader(tmp_path)
    for p in (Params(at(0), at(end)), Params(at(1800 + 17), at(end - 7))):
        bad = compare(con, p)
        assert not bad, (p, "\n".join(bad))


@pytest.mark.parametrize("compact_at", [6 * 3600, 3 * 3600], ids=["all facts", "a raw tail"])
def test_events_read_only_the_gpus_whose_health_moved(tmp_path, compact_at):
    """health.events reads only the GPUs whose health moved in the window, found from the facts
    rounded out to their buckets and the raw tail upkeep has not reached: a GPU whose ECC counter
    is 0 in the window's first (raw-cut) minutes and 5 from the next bucket on, and one whose XID
    shows only in the last (raw-cut) minutes, are found; one whose counter stands still and one
    with nothing are not. The events equal the raw path's, alone and beside the GPUs' figures."""
    s, e = 3600 + 37, 3 * 3600 + 150  # edges inside 5-minute buckets

    def fields(g, t) -> dict:
        return {"ecc_dbe_vol": (0 if t < 3600 + 300 else 5) if g["gpu"] == 0 else None,
                "ecc_sbe_vol": 3 if g["gpu"] == 1 else None,
                "xid_last": 79 if g["gpu"] == 2 and 3 * 3600 + 60 <= t < 3 * 3600 + 150 else 0, "gpu_up": 1.0}

    w = StoreWriter(tmp_path)
    for b in split(steady(4, 4 * 3600), 1, False, fields=fields):
        w.commit(b)
    compact(w, at(compact_at), FactParams(max_gap_s=MAX_GAP), facts_hours=None)
    w.close()
    con = open_reader(tmp_path)
    p = Params(at(s), at(e))
    raw, got = raw_health(con, p, ("events",))["events"], health.events(con, p)
    assert sorted(raw["kind"]) == ["ecc_dbe", "xid"] and raw["gpu_uuid"].n_unique() == 2
    assert con.execute("SELECT count(*) FROM fact_files WHERE grain_s = 300 AND bucket < ?", [at(compact_at - 3600)]).fetchone()[0] >= 2
    assert sorted(health._moved_gpus(con, p)) == sorted(raw["gpu_uuid"])
    assert not same(raw, got, EVENT_KEYS)
    # the Health page's window finds the same GPUs from its GPUs' figures (their `moved`), and the same events
    assert not same(raw, health.window_health(con, p)["events"], EVENT_KEYS)


def test_moved_gpus_read_the_open_hours_settled_facts_then_raw(tmp_path):
    """An XID inside the open hour's settled 5 minutes (their file written by upkeep) is found from those facts; the raw read
    of the GPUs whose health moved starts where they end, not at the hour (on a running collector's store: the hour's
    minutes before them are a file per round)."""
    from gpufleet.analytics.raw_reads import READS
    from gpufleet.times import epoch_us

    fleet = steady(2, 2 * 3600 + 40 * 60)

    def fields(g, t) -> dict:
        return {"xid_last": 79 if g["gpu"] == 0 and 2 * 3600 + 5 * 60 <= t < 2 * 3600 + 7 * 60 else 0}

    w = StoreWriter(tmp_path)
    for batch in split(fleet, 1, False, fields=fields):
        w.commit(batch)
    compact(w, at(2 * 3600 + 30 * 60), FactParams(max_gap_s=MAX_GAP), facts_hours=None)  # 02:00-02:20 settled: the open hour's file
    w.close()
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM fact_files WHERE open_upto IS NOT NULL").fetchone()[0] >= 1
    p = Params(at(3600), at(2 * 3600 + 40 * 60))
    mark = READS.mark()
    events = health.events(con, p)
    assert (events.filter(pl.col("kind") == "xid")["gpu_uuid"].to_list(), events.filter(pl.col("kind") == "xid")["code"].to_list()) == (["GPU-prop-0"], [79])
    moved = [r for r in READS.since(mark) if r.kind == "health events" and r.hi_us == epoch_us(at(2 * 3600 + 40 * 60))]
    assert moved and moved[0].lo_us == epoch_us(at(2 * 3600 + 20 * 60)), moved
    assert not compare(con, p)


def test_an_event_without_a_model_in_its_samples_takes_the_inventory_s():
    """A lost GPU reports no model (its exporter cannot read it): its "GPU lost" event is named by the inventory's model,
    where the event's own samples named one it keeps that; a GPU the inventory has no model for stays unknown."""
    import duckdb
    from datetime import datetime

    from gpufleet.collector.schema import GPUS_DDL

    con = duckdb.connect()
    con.execute(GPUS_DDL)
    con.execute("INSERT INTO gpus (cluster, host, gpu_uuid, gpu_instance, model, first_seen, last_seen) VALUES "
                "('c', 'n1', 'GPU-A', -1, 'NVIDIA H100 80GB HBM3', '2026-11-01', '2026-11-02')")
    t = datetime(2026, 11, 1, 12)
    ev = pl.DataFrame({"ts": [t, t, t], "cluster": ["c"] * 3, "host": ["n1", "n1", "n2"], "gpu": [0, 0, 1],
                       "gpu_uuid": ["GPU-A", "GPU-A", "GPU-B"], "gi": [-1, -1, -1], "model": [None, "NVIDIA H100 80GB HBM3 (sampled)", None],
                       "kind": ["gpu_lost", "xid", "gpu_lost"]})
    named = health.with_inventory_models(con, ev)
    assert named.columns == ev.columns and named["kind"].to_list() == ev["kind"].to_list()
    assert named["model"].to_list() == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3 (sampled)", None]
