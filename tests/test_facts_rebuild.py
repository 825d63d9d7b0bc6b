"""`gpufleet collect --rebuild-facts [START END]` (maintenance.rebuild_facts): builds the facts of a
store that has none, byte for byte as upkeep writes them, and builds a range's again from the
samples (lost or damaged files): its hours and days only, and the figures then equal the raw path's."""

from __future__ import annotations

from pathlib import Path

from test_analytics_properties import at
from tests.support.random_stores import split
from test_facts import from_facts as figures_from_facts
from test_facts import mismatches, oracle, params, upkeep_params

from gpufleet.collector.maintenance import compact, compact_hours
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.collect import run_collect

DAY = 86400
FLEET = {"gpus": [{"gpu": g, "host": "h0", "uuid": f"GPU-prop-{g}", "samples": [(t, 20.0 * g + (t // 900) % 3, 1.0) for t in range(0, 2 * DAY, 30)]}
                  for g in range(2)],
         "jobs": [{"key": "1", "account": "alpha", "user": "u", "start": 5000, "end": DAY + 7000, "seen_until": DAY + 7000, "gpus": 1, "held": [0]}],
         "cuts": [0, DAY, 2 * DAY], "now": 4 * DAY, "idle_min": 300}


def store(root: Path, with_facts: bool) -> None:
    """The fleet's store after an upkeep pass at FLEET["now"]; without facts: compacted only, as
    a store from before the facts was."""
    w = StoreWriter(root)
    for b in split(FLEET, 1, False):
        w.commit(b)
    if with_facts:
        compact(w, at(FLEET["now"]), upkeep_params(FLEET), facts_hours=None)
    else:
        compact_hours(w, at(FLEET["now"]))
    w.publish()
    w.close()


def facts_bytes(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("facts/**/*.parquet"))}


def rebuild(root: Path, tmp: Path, *span: str) -> tuple[int, str]:
    return run_collect(tmp, root, f"max_gap_seconds = 30.0\nidle_min_duration_seconds = {FLEET['idle_min']}.0\n", "--rebuild-facts", *span)


def test_a_store_without_facts_gets_upkeeps_facts_byte_for_byte(tmp_path):
    store(tmp_path / "upkeep", with_facts=True)
    store(tmp_path / "none", with_facts=False)
    assert not facts_bytes(tmp_path / "none")
    rc, text = rebuild(tmp_path / "none", tmp_path)
    assert rc == 0, text
    assert "rebuilding the facts of the whole store" in text
    # 48 hours, and the hour after them (the last sample's interval reaches into it); their 3 days
    assert "facts: 49 hours of 5-minute facts and 3 days of hour and day facts built" in text
    assert facts_bytes(tmp_path / "none") == facts_bytes(tmp_path / "upkeep")


def test_a_range_is_built_again_from_the_samples_and_nothing_else(tmp_path):
    root = tmp_path / "s"
    store(root, with_facts=True)
    before = facts_bytes(root)
    # the files of the hours 10:00-12:00 of the second day lost, the first day's file damaged
    hour_files = [f for f in before if "/5m/" in f and at(DAY).isoformat()[:10] in f and any(f"hour-{h}-" in f for h in ("10", "11"))]
    day_file = next(f for f in before if "/day/" in f and at(0).isoformat()[:10] in f)
    assert len(hour_files) == 2
    for f in hour_files:
        (root / f).unlink()
    (root / day_file).write_bytes(b"damaged")
    untouched = {f: (root / f).stat().st_mtime_ns for f in before if f not in hour_files and f != day_file and "/5m/" in f}
    rc, text = rebuild(root, tmp_path, at(DAY + 10 * 3600 + 60).isoformat(), at(DAY + 11 * 3600 + 60).isoformat())
    assert rc == 0, text
    assert "facts: 2 hours of 5-minute facts and 1 days of hour and day facts built" in text
    assert {f: (root / f).read_bytes() for f in hour_files} == {f: before[f] for f in hour_files}
    assert (root / day_file).read_bytes() == b"damaged"  # (the first day is not in the range)
    assert {f: (root / f).stat().st_mtime_ns for f in untouched} == untouched
    rc, text = rebuild(root, tmp_path, at(0).isoformat(), at(3600).isoformat())
    assert "facts: 1 hours of 5-minute facts and 1 days of hour and day facts built" in text
    assert facts_bytes(root) == before
    con = open_reader(root)
    p = params(FLEET, 0, 2 * DAY)
    got, fw = figures_from_facts(con, p, at(FLEET["now"]))
    assert fw.raw_us == 0 and not mismatches(oracle(con, p, at(FLEET["now"])), got)


def test_a_range_must_be_two_times_in_order(tmp_path, caplog):
    store(tmp_path / "s", with_facts=False)
    assert rebuild(tmp_path / "s", tmp_path, at(0).isoformat())[0] == 2
    assert "--rebuild-facts" in caplog.text and "expected START END" in caplog.text
    assert rebuild(tmp_path / "s", tmp_path, at(DAY).isoformat(), at(0).isoformat())[0] == 2
    assert "START must be before END" in caplog.text
