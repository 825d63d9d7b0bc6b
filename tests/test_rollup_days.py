"""A closed day's 5-minute rollups live in one file (a week's per-GPU mean opens 7 files, not
168), and whatever order hours are compacted, merged, re-rolled with late data or retired in,
the rollup view holds exactly the rollup of the samples: no hour twice, none lost."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector import schema
from gpufleet.collector.maintenance import _compact_hour, apply_retention, compact, compact_hours
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader
from test_analytics_properties import scratch
from test_store import samples

DAY = datetime(2026, 11, 16)
ROLLUP_OF_SAMPLES = schema.ROLLUP_SELECT.format(source="gpu_samples")


def rollup_files(root) -> list[str]:
    return json.loads((root / "manifest.json").read_text())["rollup_5m"]


# a batch spanning hours is compacted with its first hour, so a GPU's bucket may have a row in
# two hours' rollups: they compose (sums, counts, maxima) to the rollup of its samples
COMPOSED = """SELECT bucket, host, gpu_uuid, gpu_instance, sum(samples), sum(gpu_util_samples),
                     round(sum(gpu_util_avg * gpu_util_samples), 6), max(gpu_util_max)
              FROM ({rows}) GROUP BY ALL ORDER BY ALL"""


def assert_rollups_are_the_samples(root) -> None:
    con = open_reader(root)
    have = con.execute(COMPOSED.format(rows="SELECT * FROM gpu_rollup_5m")).fetchall()
    assert have == con.execute(COMPOSED.format(rows=ROLLUP_OF_SAMPLES)).fetchall()
    assert [r[0] for r in con.execute("DESCRIBE gpu_rollup_5m").fetchall()] == [
        r[0] for r in con.execute(f"DESCRIBE {ROLLUP_OF_SAMPLES}").fetchall()]


def ingest(w: StoreWriter, key: str, hours: list[float], util: float, uuid: str = "GPU-a", per_hour: bool = True) -> None:
    """Samples at DAY + `hours`: a batch per hour (as scrape rounds come), or one for them all."""
    groups = [[h for h in hours if int(h) == k] for k in sorted({int(h) for h in hours})] if per_hour else [hours]
    for i, g in enumerate(groups):
        w.commit(Batch(key=f"{key}/{i}", samples=samples([DAY + timedelta(hours=h) for h in g], [util] * len(g), uuid=uuid)))
    w.publish()


def test_a_closed_day_rolls_up_into_one_file_and_late_data_rewrites_it(tmp_path):
    w = StoreWriter(tmp_path, clock=lambda: DAY)
    ingest(w, "d1", [h + 0.1 for h in range(24)], 10.0)  # every hour of the 16th
    ingest(w, "d2", [24.1, 25.1], 20.0)  # two hours of the 17th
    now = DAY + timedelta(days=1, hours=3)
    w.clock = lambda: now
    assert compact(w, now) == 26
    files = rollup_files(tmp_path)
    # the 16th is closed: one file; the 17th is open: one file per hour
    assert [f.split("/")[-1].split("-")[0] for f in files] == ["day", "hour", "hour"]
    assert files[0].startswith("rollup_5m/date=2026-11-16/")
    assert_rollups_are_the_samples(tmp_path)
    # late samples for 05:00 of the merged day: the day is written again with the hour's new rows,
    # in the hour's own commit (published before any merge, as after a crash, it reads right)
    ingest(w, "late", [5.2, 5.3], 90.0)
    files_05 = [r[0] for r in w.db.execute("SELECT DISTINCT file FROM batches WHERE file LIKE '%date=2026-11-16/%' "
                                           "AND date_trunc('hour', min_ts) = ? ORDER BY 1", [DAY + timedelta(hours=5)]).fetchall()]
    _compact_hour(w, DAY + timedelta(hours=5), files_05, now)
    w.invalidate()
    w.publish()
    assert_rollups_are_the_samples(tmp_path)
    assert compact(w, now) == 0  # nothing left to do
    after = rollup_files(tmp_path)
    assert len(after) == 3 and after[0] != files[0] and after[0].split("/")[-1].startswith("day-")
    assert_rollups_are_the_samples(tmp_path)
    # a GPU seen for the first time in an hour of the merged day (an hour with no rollup of its
    # own before, then a second file of the day until the next merge)
    ingest(w, "new-gpu", [7.5], 30.0, uuid="GPU-b")
    assert compact(w, now) == 1
    assert len(rollup_files(tmp_path)) == 3
    assert_rollups_are_the_samples(tmp_path)
    # the 17th closes: merged too
    later = DAY + timedelta(days=2, hours=1)
    w.clock = lambda: later
    compact(w, later)
    assert [f.split("/")[-1].split("-")[0] for f in rollup_files(tmp_path)] == ["day", "day"]
    assert_rollups_are_the_samples(tmp_path)
    # retention: a day's file goes with its last hour, not its first
    # (the 16th's last hour, 23:00, passes a day's retention at 23:00 on the 17th)
    assert apply_retention(w, DAY + timedelta(days=1, hours=22, minutes=30), raw_days=400, rollup_days=1) == 0
    assert apply_retention(w, DAY + timedelta(days=1, hours=23, minutes=30), raw_days=400, rollup_days=1) == 1
    assert [f.split("/")[1] for f in rollup_files(tmp_path)] == ["date=2026-11-17"]
    w.close()


def test_superseded_rollup_files_are_deleted_after_the_grace_period(tmp_path):
    w = StoreWriter(tmp_path, clock=lambda: DAY)
    ingest(w, "d1", [0.1, 1.1, 2.1], 10.0)
    now = DAY + timedelta(days=1, hours=1)
    w.clock = lambda: now
    compact(w, now)
    w.clock = lambda: now + timedelta(days=1)  # past the grace period
    w.publish()
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "rollup_5m").rglob("*.parquet"))
    assert on_disk == rollup_files(tmp_path) and len(on_disk) == 1


# one step: ingest samples of some hours of three days (late or not), or compact at a clock
steps = st.one_of(
    st.tuples(st.just("ingest"), st.lists(st.integers(0, 71), min_size=1, max_size=6), st.sampled_from(["GPU-a", "GPU-b"]),
              st.integers(0, 100)),
    st.tuples(st.just("compact"), st.integers(1, 80)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=2, max_size=12))
def test_rollups_equal_the_rollup_of_the_samples_whatever_the_order(ops):
    with scratch() as tmp:  # (a tmpfs where there is one: the fsyncs of a disk were a tenth of each example)
        rollups_equal_the_rollup_of_the_samples(Path(tmp), ops)


def rollups_equal_the_rollup_of_the_samples(root: Path, ops) -> None:
    w = StoreWriter(root, clock=lambda: DAY)
    try:
        for i, op in enumerate(ops):
            if op[0] == "ingest":
                _, hours, uuid, util = op
                # a distinct minute per step: a new sample each time, never a conflicting one
                ingest(w, f"b{i}", [h + (i % 50 + 1) / 60 for h in sorted(set(hours))], float(util), uuid, per_hour=util % 2 == 0)
            else:
                now = DAY + timedelta(hours=op[1], minutes=6)
                w.clock = lambda now=now: now
                compact(w, now, health_hours=0)
        now = DAY + timedelta(days=4)
        w.clock = lambda: now
        # (health_hours=0: upkeep without health summaries - they hold no rollup, and they were half
        # of each example; test_health_summaries has them)
        compact(w, now, health_hours=0)
        assert_rollups_are_the_samples(root)
        # every closed day is one file
        days = [f.split("/")[1] for f in rollup_files(root)]
        assert len(days) == len(set(days))
    finally:
        w.close()


def test_compact_hours_merges_and_rolls_up_but_leaves_the_summaries_to_summarize(tmp_path):
    w = StoreWriter(tmp_path, clock=lambda: DAY)
    ingest(w, "d1", [h + 0.1 for h in range(24)], 10.0)
    now = DAY + timedelta(days=1, hours=3)
    w.clock = lambda: now
    assert compact_hours(w, now) == (24, 1)  # 24 hours compacted, the closed day's rollups merged
    assert rollup_files(tmp_path) == []  # not published yet: the caller publishes
    w.publish()
    assert [f.split("/")[-1].split("-")[0] for f in rollup_files(tmp_path)] == ["day"]
    assert not w.summaries
    assert compact(w, now) == 0  # nothing left to compact: compact only builds the summaries now
    assert len(w.summaries) == 24
