"""The product's upkeep writes the facts (maintenance.compact -> build_facts), always: a pass
killed between writing a file and publishing loses nothing and the next one completes it; a store
from before the facts gets them over its next passes, newest hours first, and says how many are
left; whatever order samples land and upkeep runs in, the facts listed are those a rebuild from
scratch writes, byte for byte (none lost, none twice); raw retention does not rebuild a settled
hour without the sample that held into it; and a store's 5-minute rollups (a retired tier) are
retired by its first writer's start."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_analytics_properties import MAX_GAP, at, scratch
from tests.support.random_stores import split
from test_facts import NOTHING, mismatches, oracle, params, upkeep_params
from test_facts import from_facts as figures_from_facts
from test_store import samples

from gpufleet.collector import facts as cf
from gpufleet.collector.maintenance import apply_retention, build_facts, compact, rebuild_facts
from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import RETIRE_GRACE, StoreWriter, open_reader
from gpufleet.times import epoch_us

DAY = 86400


def facts_bytes(root: Path) -> dict[str, bytes]:
    """The facts files the manifest lists, with their bytes."""
    listed = json.loads((root / "manifest.json").read_text())["facts"]
    return {e["file"]: (root / e["file"]).read_bytes() for e in listed}


def hourly(hours: int, offset: int = 10, step: int = 15) -> dict:
    """Two GPUs sampled every `step` s from `offset` s for `hours` hours (with offset 10 the last
    sample of each hour holds 10 s into the next), a job on one of them."""
    return {"gpus": [{"gpu": g, "host": "h0", "uuid": f"GPU-prop-{g}", "samples": [(t, 30.0 + g, 1.0) for t in range(offset, hours * 3600, step)]}
                     for g in range(2)],
            "jobs": [{"key": "1", "account": "alpha", "user": "u", "start": 600, "end": hours * 3600 - 600, "seen_until": hours * 3600,
                      "gpus": 1, "held": [0]}],
            "cuts": [0, 3600], "now": 2 * DAY, "idle_min": 300}


def written(root: Path, fleet: dict, hours: int) -> StoreWriter:
    """The fleet's samples committed a file per hour and GPU, nothing built yet: the open writer."""
    w = StoreWriter(root)
    for b in split(fleet, hours, False):
        w.commit(b)
    w.publish()
    return w


def test_a_pass_killed_between_writing_and_publishing_loses_nothing_and_the_next_completes(tmp_path, monkeypatch):
    fleet = hourly(6)
    whole = written(tmp_path / "whole", fleet, 6)
    compact(whole, at(DAY), upkeep_params(fleet))
    whole.close()
    w = written(tmp_path / "s", fleet, 6)
    before = json.loads((tmp_path / "s" / "manifest.json").read_text())
    calls = []

    def killed(key, entry):  # the third file written, then the process dies before it is listed
        calls.append(key)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        StoreWriter.put_facts(w, key, entry)

    monkeypatch.setattr(w, "put_facts", killed)
    with pytest.raises(KeyboardInterrupt):
        compact(w, at(DAY), upkeep_params(fleet))
    # nothing published: readers go on with the manifest they had, every file it names still there
    assert json.loads((tmp_path / "s" / "manifest.json").read_text()) == before
    assert all((tmp_path / "s" / f).exists() for f in before["samples"])
    w.db.close()  # (the process is gone: no close(), no publish)
    w = StoreWriter(tmp_path / "s")
    assert not w.facts
    compact(w, at(DAY), upkeep_params(fleet))
    assert facts_bytes(tmp_path / "s") == facts_bytes(tmp_path / "whole")
    assert build_facts(w, epoch_us(at(DAY)), cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=300)) == NOTHING
    # the file written before the kill and never listed: deleted after the grace period, unless listed since
    w.clock = lambda: datetime.now() + RETIRE_GRACE * 2
    w.publish()
    w.close()
    on_disk = {str(f.relative_to(tmp_path / "s")) for f in (tmp_path / "s" / "facts").rglob("*.parquet")}
    assert on_disk == set(facts_bytes(tmp_path / "s"))


def test_a_store_without_facts_gets_them_newest_first_over_its_next_passes(tmp_path, caplog):
    fleet = hourly(30)  # 30 hours of samples (and the hour after, its last sample holding into it): 31 hours, 2 days
    w = written(tmp_path, fleet, 30)
    caplog.set_level("INFO", logger="gpufleet.collector.maintenance")
    compact(w, at(3 * DAY), upkeep_params(fleet), facts_hours=20)  # (FACTS_HOURS_PER_PASS a pass in the product)
    hours = sorted(k for k in w.facts if k.startswith("5m/"))
    assert hours == [f"5m/{at(h * 3600).isoformat()}" for h in range(11, 31)]  # the newest 20
    # a day waits for all its hours: the second (its 7 hours built) is written, the first is left
    assert [k for k in w.facts if k.startswith("day/")] == [f"day/{at(DAY).isoformat()[:10]}"]
    assert w.facts_backlog == {"hours": 11, "days": 1}
    assert "facts: built 20 hours of 5-minute facts and 1 days of hour and day facts; 11 hours and 1 days left for the next passes" in caplog.text
    compact(w, at(3 * DAY), upkeep_params(fleet), facts_hours=20)
    assert len([k for k in w.facts if k.startswith("5m/")]) == 31 and len([k for k in w.facts if k.startswith("day/")]) == 2
    assert w.facts_backlog == {"hours": 0, "days": 0}
    w.close()
    con = open_reader(tmp_path)
    p = params(fleet, 0, 30 * 3600)
    got, fw = figures_from_facts(con, p, at(3 * DAY))
    assert fw.raw_us == 0 and not mismatches(oracle(con, p, at(3 * DAY)), got)


def test_raw_retention_does_not_rebuild_a_settled_hour_without_the_sample_held_into_it(tmp_path):
    """The last sample of 00:00-01:00 (00:59:55) holds 10 s into 01:00: once retention retires
    its hour's file, 01:00's facts stay as they were built - not rebuilt from its own samples
    alone, 10 s of data short per GPU - by upkeep or by a rebuild of the whole store."""
    fleet = hourly(3)
    w = written(tmp_path, fleet, 3)
    now = at(DAY + 5000)  # raw_days = 1: the cutoff at 5000 s retires the first hour's file (its last sample 3595 s), not the second's
    compact(w, now, upkeep_params(fleet))
    before = facts_bytes(tmp_path)
    con = open_reader(tmp_path)
    p = params(fleet, 3600, 3 * 3600)
    figures = figures_from_facts(con, p, now)[0]
    assert figures["totals.data_gpu_h"] == pytest.approx(2 * 2.0)  # (3610 s to 3 h: the second hour's first 10 s held by 00:59:55)
    con.close()
    assert apply_retention(w, now, raw_days=1) == 1  # the first hour's (compacted) file
    fp = cf.FactParams(max_gap_s=MAX_GAP, idle_min_s=fleet["idle_min"])
    assert build_facts(w, epoch_us(now), fp) == NOTHING
    assert rebuild_facts(w, now, fp)["hours"] == 2  # (the other two hours with samples: written again, the same)
    assert facts_bytes(tmp_path) == before
    w.close()
    con = open_reader(tmp_path)
    got, fw = figures_from_facts(con, p, now)
    assert fw.raw_us == 0 and got == figures


# one step: samples of some hours of three days (late or not) land, or upkeep runs at a clock
steps = st.one_of(
    st.tuples(st.just("ingest"), st.lists(st.integers(0, 71), min_size=1, max_size=6), st.sampled_from(["GPU-a", "GPU-b"]),
              st.integers(0, 100)),
    st.tuples(st.just("upkeep"), st.integers(1, 80)),
)
T0 = datetime(2026, 11, 16)
COVERED_SAMPLES = ("SELECT count(*) FROM gpu_samples s JOIN fact_files f ON f.grain_s = 300 AND s.ts >= coalesce(f.open_from, f.bucket) "
                   "AND s.ts < coalesce(f.open_upto, f.bucket + INTERVAL 1 HOUR)")
LISTED_SAMPLES = "SELECT coalesce(sum(samples_n), 0) FROM fact_parts WHERE lead AND grain_s = 300"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=2, max_size=12))
def test_facts_are_a_fresh_builds_whatever_the_order_samples_land_and_upkeep_runs_in(ops):
    """(The property the 5-minute rollups had, test_rollup_days before #52, held by the facts.)"""
    with scratch() as tmp:
        root = Path(tmp)
        w = StoreWriter(root, clock=lambda: T0)
        try:
            for i, op in enumerate(ops):
                if op[0] == "ingest":
                    _, hours, uuid, util = op
                    # a distinct minute per step: a new sample each time, never a conflicting one
                    times = [T0 + timedelta(hours=h + (i % 50 + 1) / 60) for h in sorted(set(hours))]
                    groups = [[t for t in times if t.hour == k] for k in sorted({t.hour for t in times})] if util % 2 == 0 else [times]
                    for g, ts in enumerate(groups):
                        w.commit(Batch(key=f"b{i}/{g}", samples=samples(ts, [float(util)] * len(ts), uuid=uuid)))
                    w.publish()
                else:
                    now = T0 + timedelta(hours=op[1], minutes=op[1] % 7 * 7 + 6)  # (open hours' buckets too)
                    w.clock = lambda now=now: now
                    compact(w, now)
                    w.publish()
                    # between passes too: every sample of what the listed 5-minute facts cover (whole
                    # hours; an open hour's settled buckets) in exactly one of their parts
                    con = open_reader(root)
                    assert con.execute(COVERED_SAMPLES).fetchone() == con.execute(LISTED_SAMPLES).fetchone()
                    con.close()
            now = T0 + timedelta(days=4)
            w.clock = lambda: now
            compact(w, now, facts_hours=None)
            upkept = facts_bytes(root)
            # every sample of the store in exactly one 5-minute part
            con = open_reader(root)
            assert con.execute("SELECT coalesce(sum(samples_n), 0) FROM fact_parts WHERE lead AND grain_s = 300").fetchone() == \
                con.execute("SELECT count(*) FROM gpu_samples").fetchone()
            con.close()
            assert rebuild_facts(w, now, cf.FactParams())["hours"] == len([f for f in upkept if "/5m/" in f])
            assert facts_bytes(root) == upkept
        finally:
            w.close()


def test_a_stores_rollups_are_retired_by_its_first_writer(tmp_path):
    """A store written before #52 has 5-minute rollup files, a `rollups` ledger and a manifest
    listing them: the writer's start (schema migration 9) retires them - out of the manifest,
    deleted after the grace period - and its upkeep writes facts instead."""
    t = datetime(2026, 11, 16, 10)
    w = StoreWriter(tmp_path, clock=lambda: t)
    w.commit(Batch(key="r", samples=samples([t + timedelta(seconds=15 * i) for i in range(8)], [10.0] * 8)))
    # what the version before wrote beside it
    rollup = "rollup_5m/date=2026-11-16/hour-10-abc.parquet"
    (tmp_path / rollup).parent.mkdir(parents=True)
    (tmp_path / rollup).write_bytes(b"PAR1")
    w.db.execute("CREATE TABLE rollups (hour TIMESTAMP PRIMARY KEY, file VARCHAR NOT NULL)")
    w.db.execute("INSERT INTO rollups VALUES (?, ?)", [t, rollup])
    w.db.execute("DELETE FROM schema_version WHERE version >= 9")  # (a store of schema 8)
    w.publish()
    w.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "rollup_5m": [rollup]}))
    now = t + timedelta(hours=1, minutes=6)
    w = StoreWriter(tmp_path, clock=lambda: now)
    assert w.schema_version() == schema.SCHEMA_VERSION
    assert w.db.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'rollups'").fetchone() == (0,)
    compact(w, now)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "rollup_5m" not in manifest and [e["grain"] for e in manifest["facts"]] == ["5m"]
    assert (tmp_path / rollup).exists()  # a reader may still hold the manifest that listed it
    w.clock = lambda: now + RETIRE_GRACE * 2
    w.publish()
    assert not (tmp_path / rollup).exists()
    w.close()


def test_a_stores_summaries_are_retired_by_its_first_writer(tmp_path):
    """A store written before the summaries were retired (#52) lists per-GPU summaries with their
    joined segments and run facts, and merged health day files, under summaries/ (a rebuild's parts
    too): the writer's start (schema migration 11) retires every file there - out of the manifest,
    deleted after the grace period - and its upkeep writes facts instead."""
    t = datetime(2026, 11, 16, 10)
    w = StoreWriter(tmp_path, clock=lambda: t)
    w.commit(Batch(key="r", samples=samples([t + timedelta(seconds=15 * i) for i in range(8)], [10.0] * 8)))
    old = ["summaries/date=2026-11-16/sum-10-abc-def.parquet", "summaries/date=2026-11-16/hsum-e-10-abc-def.parquet",
           "summaries/date=2026-11-16/health3-10-abc-def.parquet", "summaries/date=2026-11-16/healthday2-000000000000.parquet",
           "summaries/parts/2026-11-16-0-of-1-abc.parquet"]
    for f in old:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"PAR1")
    w.db.execute("DELETE FROM schema_version WHERE version >= 11")  # (a store of schema 10)
    w.publish()
    w.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    entry = {"hour": t.isoformat(), "file": old[0], "coarse": old[1], "health": old[2], "lo": t.isoformat(), "hi": t.isoformat(), "sources": []}
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "summaries": [entry],
                                                        "health_days": [{"day": "2026-11-16", "file": old[3], "hours": {}}]}))
    now = t + timedelta(hours=1, minutes=6)
    w = StoreWriter(tmp_path, clock=lambda: now)
    assert w.schema_version() == schema.SCHEMA_VERSION == 11
    compact(w, now)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert "summaries" not in manifest and "health_days" not in manifest and [e["grain"] for e in manifest["facts"]] == ["5m"]
    assert all((tmp_path / f).exists() for f in old)  # a reader may still hold the manifest that listed them
    w.clock = lambda: now + RETIRE_GRACE * 2
    w.publish()
    assert not any((tmp_path / f).exists() for f in old)
    w.close()
    w = StoreWriter(tmp_path, clock=lambda: now + RETIRE_GRACE * 3)  # started again: nothing left to retire
    assert w.db.execute("SELECT count(*) FROM retired_files WHERE file LIKE 'summaries/%'").fetchone() == (0,)
    w.close()


@pytest.mark.parametrize("doc, said", [
    ({"collector": {"retention": {"summary_days": 90}}}, "summary_days was retired with the per-GPU summaries"),
    ({"analytics": {"summaries": True}}, "[analytics]: summaries was retired"),
    ({"analytics": {"rebuild_gpu_shards": 4}}, "[analytics]: rebuild_gpu_shards was retired"),
])
def test_a_retired_summary_key_is_refused_with_what_replaced_it(doc, said):
    from gpufleet.analytics.params import analytics_options
    from gpufleet.collector import config
    from gpufleet.config import ConfigError

    loads = [config.load] + ([analytics_options] if "analytics" in doc else [])  # (the collector reads [analytics] too)
    for load in loads:
        with pytest.raises(ConfigError) as e:
            load(doc, "g.toml")
        assert said in str(e.value) and "g.toml" in str(e.value)


def test_an_open_hours_settled_buckets_are_facts_each_pass_adding_those_settled_since(tmp_path):
    """A 5-minute bucket settles SETTLE + max_gap after it ends, as an hour does: upkeep writes the
    open hour's settled buckets (a file of those settled since its last pass), so a window ending
    now reads them from facts, with the raw oracle's figures; a pass with nothing new writes
    nothing; late samples in them build them again from the hour's start; the settled hour's own
    file replaces them."""
    fleet = hourly(3)
    fp = upkeep_params(fleet)
    w = written(tmp_path, fleet, 3)

    def opened() -> list[tuple[str, str]]:
        return sorted((e["from"][11:16], e["upto"][11:16]) for e in w.facts.values() if "upto" in e)

    def same_as_raw(a: int, b: int, now: datetime) -> dict[int, int]:
        w.publish()
        con = open_reader(tmp_path)
        try:
            p = params(fleet, a, b)
            got, fw = figures_from_facts(con, p, now)
            assert not mismatches(oracle(con, p, now), got)
            return fw.tiles
        finally:
            con.close()

    try:
        now = at(2 * 3600 + 30 * 60)  # 02:30: 02:00's buckets to 02:20 settled (02:24:30 = 02:30 - 5 min - max_gap 30 s)
        assert compact(w, now, fp, facts_hours=None) >= 0
        assert opened() == [("02:00", "02:20")]
        assert all(e["format"] == cf.OPEN_FORMAT for e in w.facts.values() if "upto" in e)  # (a reader of before them skips them)
        tiles = same_as_raw(3600, 2 * 3600 + 20 * 60, now)
        # 02:00-02:20 from the open hour's file, not raw (and 00:50-01:00: the reach before the window)
        assert tiles.get(cf.GRAIN_5M) == 4 + 2 and tiles.get(cf.GRAIN_1H) == 1
        assert build_facts(w, epoch_us(now), fp) == NOTHING  # nothing new: nothing written
        now = at(2 * 3600 + 40 * 60)
        assert build_facts(w, epoch_us(now), fp) == {**NOTHING, "open_hours": 1}
        assert opened() == [("02:00", "02:20"), ("02:20", "02:30")]
        same_as_raw(3600, 2 * 3600 + 30 * 60, now)
        # the collector's newest samples, after what they cover, leave them listed ...
        w.commit(Batch(key="newest", samples=samples([at(2 * 3600 + 31 * 60)], [55.0], host="h9", uuid="GPU-late")))
        assert opened() == [("02:00", "02:20"), ("02:20", "02:30")]
        # ... a late sample inside what they cover unlists those it reaches (a reader sums no stale
        # facts), and upkeep builds them again, in one file from the hour's start
        w.commit(Batch(key="late", samples=samples([at(2 * 3600 + 7 * 60)], [55.0], host="h9", uuid="GPU-late")))
        assert opened() == [("02:20", "02:30")]
        assert build_facts(w, epoch_us(now), fp)["open_hours"] == 1
        assert opened() == [("02:00", "02:30")]
        same_as_raw(3600, 2 * 3600 + 30 * 60, now)
        # the hour settled: its own file, the open hour's files retired
        now = at(3 * 3600 + 10 * 60)
        assert build_facts(w, epoch_us(now), fp)["hours"] == 1
        assert opened() == [] and f"5m/{at(2 * 3600).isoformat()}" in w.facts
        assert same_as_raw(3600, 3 * 3600, now).get(cf.GRAIN_1H) == 2
    finally:
        w.close()
