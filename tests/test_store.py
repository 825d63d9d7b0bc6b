"""The store's promises: readers see whole batches only, re-ingesting is a no-op, a crash loses
at most the batch in flight, one writer at a time, versioned schema."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import READER_THREADS_ENV, StoreError, StoreWriter, open_reader, samples_between

T0 = datetime(2026, 11, 16, 23, 59, 30)


def samples(ts: list[datetime], util: list[float], host="n1", uuid="GPU-a") -> pa.Table:
    n = len(ts)
    cols = {f.name: [None] * n for f in schema.SAMPLE_SCHEMA}
    cols.update(ts=ts, cluster=["c"] * n, host=[host] * n, gpu=[0] * n, gpu_uuid=[uuid] * n, model=["H100"] * n, source=["scrape"] * n, gpu_util=util)
    return pa.Table.from_pydict(cols, schema=schema.SAMPLE_SCHEMA)


def job(job_key: str, state: str, **kw) -> dict:
    row = {c: None for c in schema.JOB_COLUMNS}
    row.update(cluster="c", scheduler="slurm", job_key=job_key, job_id=job_key, state=state, source="sacct", updated_at=T0, gpus=2, account="physics")
    row.update(kw)
    return row


def dump(root) -> dict:
    con = open_reader(root)
    return {
        "samples": con.execute("SELECT ts, host, gpu_uuid, gpu_util FROM gpu_samples ORDER BY ALL").fetchall(),
        "jobs": con.execute("SELECT * FROM jobs ORDER BY job_key").fetchall(),
        "allocations": con.execute("SELECT * FROM allocations ORDER BY ALL").fetchall(),
    }


def test_commit_publish_and_read(tmp_path):
    w = StoreWriter(tmp_path)
    r = w.commit(Batch(key="scrape:n1:1", samples=samples([T0, T0 + timedelta(seconds=45)], [10, 20]), jobs=[job("5", "RUNNING")]))
    assert (r.samples_written, r.jobs_written, r.duplicate) == (2, 1, False)
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT gpu_util FROM gpu_samples ORDER BY ts").fetchall() == [(10.0,), (20.0,)]
    assert con.execute("SELECT job_key, state, gpus FROM jobs").fetchall() == [("5", "RUNNING", 2)]
    # the two samples straddle midnight: two date partitions, both listed
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(f.split("/")[1] for f in manifest["samples"]) == ["date=2026-11-16", "date=2026-11-17"]
    w.close()


def test_a_read_of_some_minutes_opens_only_their_days_files(tmp_path):
    """samples_between: the files of the days a range touches (a sample file holds its date
    partition's samples alone), the same rows as the whole view; none where no day has files."""
    from gpufleet.times import epoch_us

    w = StoreWriter(tmp_path)
    days = [T0 + timedelta(days=d, minutes=1) for d in range(4)]  # 00:00:30 of four days
    for i, t in enumerate(days):
        w.commit(Batch(key=f"scrape:n1:{i}", samples=samples([t, t + timedelta(hours=12)], [i, i + 0.5])))
    w.publish()
    w.close()
    con = open_reader(tmp_path)
    lo, hi = epoch_us(days[1] - timedelta(seconds=10)), epoch_us(days[2] + timedelta(hours=1))
    source = samples_between(con, lo, hi)
    assert "date=2026-11-17" not in source and "date=2026-11-20" not in source, source
    assert "date=2026-11-18" in source and "date=2026-11-19" in source, source
    q = "SELECT ts, gpu_util FROM {} WHERE ts >= make_timestamp($lo) AND ts < make_timestamp($hi) ORDER BY ts"
    got = con.execute(q.format(source), {"lo": lo, "hi": hi}).fetchall()
    assert got == con.execute(q.format("gpu_samples"), {"lo": lo, "hi": hi}).fetchall() == [(days[1], 1.0), (days[1] + timedelta(hours=12), 1.5), (days[2], 2.0)]
    before = epoch_us(T0 - timedelta(days=3))
    assert con.execute(q.format(samples_between(con, before, before + 3_600_000_000)), {"lo": before, "hi": before + 1}).fetchall() == []


def test_reader_threads_are_duckdbs_default_unless_the_environment_names_a_number(tmp_path, monkeypatch):
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="scrape:n1:1", samples=samples([T0], [10])))
    w.publish()
    w.close()
    monkeypatch.delenv(READER_THREADS_ENV, raising=False)
    default = open_reader(tmp_path).execute("SELECT current_setting('threads')").fetchone()[0]
    monkeypatch.setenv(READER_THREADS_ENV, "1")
    assert open_reader(tmp_path).execute("SELECT current_setting('threads')").fetchone()[0] == 1 <= default
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(READER_THREADS_ENV, bad)
        with pytest.raises(ValueError, match=f"{READER_THREADS_ENV}=.*whole number of threads"):
            open_reader(tmp_path)


def test_reingesting_the_same_window_changes_nothing(tmp_path):
    w = StoreWriter(tmp_path, clock=lambda: T0)
    batch = lambda: Batch(key="prom:0-60", samples=samples([T0], [42]), jobs=[job("5", "COMPLETED")],  # noqa: E731
                          allocations=[{"ts": T0, "cluster": "c", "scheduler": "slurm", "job_key": "5", "host": "n1", "gpu_uuid": "GPU-a", "gpu_instance": -1, "gpu": 0, "source": "exporter"}])
    w.commit(batch())
    w.publish()
    before = dump(tmp_path)
    files_before = sorted(p.name for p in (tmp_path / "samples").rglob("*.parquet"))
    w.clock = lambda: T0 + timedelta(hours=1)  # later re-ingest
    r = w.commit(batch())
    w.publish()
    assert r.duplicate and r.samples_written == 0
    assert dump(tmp_path) == before
    assert sorted(p.name for p in (tmp_path / "samples").rglob("*.parquet")) == files_before


def test_conflicting_rows_under_a_known_key_are_refused(tmp_path):
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="k", samples=samples([T0], [1])))
    r = w.commit(Batch(key="k", samples=samples([T0], [99])))
    w.publish()
    assert r.conflict and not r.duplicate
    assert dump(tmp_path)["samples"] == [(T0, "n1", "GPU-a", 1.0)]


def test_job_updates_and_allocation_intervals(tmp_path):
    w = StoreWriter(tmp_path)
    obs = lambda ts: {"ts": ts, "cluster": "c", "scheduler": "slurm", "job_key": "7", "host": "n1", "gpu_uuid": "GPU-a", "gpu_instance": -1, "gpu": 0, "source": "exporter"}  # noqa: E731
    w.commit(Batch(key="a", jobs=[job("7", "RUNNING")], allocations=[obs(T0)]))
    w.commit(Batch(key="b", jobs=[job("7", "COMPLETED", end=T0 + timedelta(hours=1))], allocations=[obs(T0 + timedelta(minutes=30)), obs(T0 + timedelta(minutes=10))]))
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute('SELECT state, "end" FROM jobs').fetchall() == [("COMPLETED", T0 + timedelta(hours=1))]
    assert con.execute("SELECT first_seen, last_seen FROM allocations").fetchall() == [(T0, T0 + timedelta(minutes=30))]


def test_unchanged_job_keeps_its_updated_at(tmp_path):
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="a", jobs=[job("7", "RUNNING", updated_at=T0)]))
    w.commit(Batch(key="b", jobs=[job("7", "RUNNING", updated_at=T0 + timedelta(hours=1))]))
    w.commit(Batch(key="c", jobs=[job("7", "COMPLETED", updated_at=T0 + timedelta(hours=2))]))
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT updated_at FROM jobs").fetchall() == [(T0 + timedelta(hours=2),)]
    w.commit(Batch(key="d", jobs=[job("7", "COMPLETED", updated_at=T0 + timedelta(hours=3))]))
    w.publish()
    assert open_reader(tmp_path).execute("SELECT updated_at FROM jobs").fetchall() == [(T0 + timedelta(hours=2),)]


def test_watermark_commits_with_the_batch(tmp_path):
    w = StoreWriter(tmp_path)
    assert w.watermark("prom") is None
    w.commit(Batch(key="x", samples=samples([T0], [1]), watermark=("prom", "2026-11-17T00:00:00")))
    assert w.watermark("prom") == "2026-11-17T00:00:00"
    w.close()
    assert StoreWriter(tmp_path).watermark("prom") == "2026-11-17T00:00:00"


def test_second_writer_is_refused_readers_are_not(tmp_path):
    import subprocess
    import sys

    w = StoreWriter(tmp_path)
    w.commit(Batch(key="x", samples=samples([T0], [5])))
    w.publish()
    code = f"from gpufleet.collector.store import StoreWriter; StoreWriter({str(tmp_path)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "locked by another writer" in r.stderr
    code = f"from gpufleet.collector.store import open_reader; print(open_reader({str(tmp_path)!r}).execute('select gpu_util from gpu_samples').fetchall())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[(5.0,)]", r.stderr


def test_leftovers_of_an_uncommitted_batch_are_removed_at_start(tmp_path):
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="x", samples=samples([T0], [5])))
    w.publish()
    w.close()
    part = tmp_path / "samples" / "date=2026-11-16"
    (part / "orphan-abc.parquet").write_bytes(b"PAR1 half written")
    (part / ".tmpfile.parquet.tmp").write_bytes(b"junk")
    w = StoreWriter(tmp_path)
    remaining = sorted(p.name for p in part.iterdir())
    assert len(remaining) == 1 and remaining[0].startswith("x-") and remaining[0].endswith(".parquet")
    assert dump(tmp_path)["samples"] == [(T0, "n1", "GPU-a", 5.0)]


def test_schema_version_recorded_and_newer_store_refused(tmp_path):
    w = StoreWriter(tmp_path)
    assert w.schema_version() == schema.SCHEMA_VERSION
    w.db.execute("INSERT INTO schema_version VALUES (?, ?)", [schema.SCHEMA_VERSION + 1, T0])
    w.close()
    with pytest.raises(StoreError, match="newer than this gpufleet"):
        StoreWriter(tmp_path)


def test_empty_store_reads_as_empty_views_and_missing_store_is_clear(tmp_path):
    StoreWriter(tmp_path / "s").close()
    con = open_reader(tmp_path / "s")
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    with pytest.raises(StoreError, match="no store at"):
        open_reader(tmp_path / "nothing")


def test_samples_are_plain_parquet_another_engine_reads(tmp_path):
    """The growth path: the partition files are ordinary Parquet with hive-style date folders."""
    import pyarrow.dataset as ds

    w = StoreWriter(tmp_path)
    w.commit(Batch(key="x", samples=samples([T0, T0 + timedelta(minutes=1)], [5, 6])))
    w.publish()
    dataset = ds.dataset(tmp_path / "samples", format="parquet", partitioning="hive")
    table = dataset.to_table(columns=["date", "gpu_util"]).sort_by("gpu_util")
    assert table.to_pydict() == {"date": ["2026-11-16", "2026-11-17"], "gpu_util": [5.0, 6.0]}


def test_fact_views_exist_before_the_first_upkeep(tmp_path):
    """Readers may query the facts on a store whose first hour is still open: empty, with the
    columns upkeep will give them, not "table does not exist"."""
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="x", samples=samples([T0], [5])))
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT count(*) FROM fact_parts").fetchone() == (0,) == con.execute("SELECT count(*) FROM fact_files").fetchone()
    cols = [r[0] for r in con.execute("DESCRIBE fact_parts").fetchall()]
    assert "data_s" in cols and "busy_s" in cols and "samples_n" in cols


def test_facts_count_the_time_that_has_utilization(tmp_path):
    """A blank gpu_util (dcgm-exporter's sentinel, a MIG row) is no utilization: the facts' busy
    over data seconds is the time-weighted mean of the samples that have one."""
    from gpufleet.collector.maintenance import compact

    t = datetime(2026, 11, 16, 10, 0, 0)
    w = StoreWriter(tmp_path, clock=lambda: t)
    # one 5-minute bucket: utils 10, blank, 40, blank 15 s apart (the last holds max_gap, 30 s)
    w.commit(Batch(key="r", samples=samples([t + timedelta(seconds=15 * i) for i in range(4)], [10.0, None, 40.0, None])))
    compact(w, now=t + timedelta(hours=1, minutes=6))
    row = open_reader(tmp_path).execute(
        "SELECT sum(samples_n), sum(covered_s), sum(data_s), sum(busy_s) FROM fact_parts WHERE lead AND samples_n > 0 AND grain_s = 300").fetchall()
    assert row == [(4, 75.0, 30.0, 7.5)]  # utilization 7.5 / 30 = 25 %: (10 + 40) / 2, each held 15 s


def test_compaction_merges_closed_hours_and_writes_their_facts(tmp_path):
    from gpufleet.collector.maintenance import compact

    t = datetime(2026, 11, 16, 10, 0, 0)
    w = StoreWriter(tmp_path, clock=lambda: t)
    # 8 rounds at 15 s in the 10:00 hour (two 5-minute buckets: 10:00 and 10:05) and one at 11:00
    for i in range(8):
        ts = t + timedelta(seconds=15 * i + (240 if i >= 4 else 0))
        w.commit(Batch(key=f"scrape:{i}", samples=samples([ts], [10.0 * i])))
    w.commit(Batch(key="scrape:late", samples=samples([t + timedelta(hours=1)], [99])))
    w.publish()
    before = dump(tmp_path)["samples"]
    assert compact(w, now=t + timedelta(hours=1, minutes=1)) == 0  # 10:00 not settled yet
    assert compact(w, now=t + timedelta(hours=1, minutes=6)) == 1
    after = open_reader(tmp_path)
    assert dump(tmp_path)["samples"] == before  # same rows, fewer files
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert len([f for f in manifest["samples"] if "compact-10" in f]) == 1
    assert len(manifest["samples"]) == 2  # the compacted 10:00 hour and the open 11:00 round
    # the settled 10:00 hour's facts: 4 samples in each of its buckets 10:00 and 10:05 (the open 11:00 has none yet)
    rows = after.execute("SELECT bucket, sum(samples_n) FROM fact_parts WHERE lead AND samples_n > 0 AND grain_s = 300 GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [(t, 4), (t + timedelta(minutes=5), 4)]
    # re-ingesting a compacted window is still a no-op
    r = w.commit(Batch(key="scrape:3", samples=samples([t + timedelta(seconds=45)], [30.0])))
    assert r.duplicate
    # a reader holding the old manifest can still read retired files during the grace period
    old_files = [f for f in json.loads(json.dumps(manifest))["samples"]]
    assert all((tmp_path / f).exists() for f in old_files)


def test_an_hour_of_one_batch_in_compact_order_is_adopted_not_written_again(tmp_path):
    """A backfill's hour-long batch already in compact order (host, GPU, instance, time) becomes
    the compacted file as it is (a second name of the same file); an hour of one batch out of
    that order, or of two batches, is written again, sorted. The rows read the same either way,
    and the batch's own name stays readable to a snapshot from before."""
    import os

    import pyarrow.parquet as pq

    from gpufleet.collector.maintenance import compact

    t = datetime(2026, 11, 16, 10)
    w = StoreWriter(tmp_path, clock=lambda: t)
    def both(first: str, second: str, hour: int) -> pa.Table:
        ts = [t + timedelta(hours=hour, seconds=15 * i) for i in range(4)]
        return pa.concat_tables([samples(ts, [1.0] * 4, host=first), samples(ts, [2.0] * 4, host=second)])

    w.commit(Batch(key="sorted", samples=both("a", "b", 0)))  # 10:00: in order
    w.commit(Batch(key="unsorted", samples=both("b", "a", 1)))  # 11:00: host b first
    for i in range(2):  # 12:00: two batches
        w.commit(Batch(key=f"round:{i}", samples=samples([t + timedelta(hours=2, seconds=15 * i)], [3.0], host="a")))
    w.publish()
    batch = {k: tmp_path / f for k, f in w.db.execute("SELECT batch_key, file FROM batches").fetchall()}
    before = dump(tmp_path)["samples"]
    assert compact(w, now=t + timedelta(hours=4)) == 3
    files = dict(w.db.execute("SELECT batch_key, file FROM batches").fetchall())
    compacted = {k: tmp_path / f for k, f in files.items()}
    assert os.path.samefile(compacted["sorted"], batch["sorted"])  # adopted: one file, two names
    assert not os.path.samefile(compacted["unsorted"], batch["unsorted"]) and compacted["round:0"] == compacted["round:1"]
    assert dump(tmp_path)["samples"] == before
    hosts = lambda f: pq.read_table(f, columns=["host"])["host"].to_pylist()  # noqa: E731
    assert hosts(compacted["unsorted"]) == ["a"] * 4 + ["b"] * 4  # written again, in compact order
    assert hosts(batch["sorted"]) == hosts(compacted["sorted"]) and batch["unsorted"].exists()  # (retired, not yet deleted)


def test_retention_retires_old_files_but_remembers_their_keys(tmp_path):
    from gpufleet.collector.maintenance import apply_retention

    t = datetime(2026, 11, 1)
    w = StoreWriter(tmp_path, clock=lambda: t)
    w.commit(Batch(key="old", samples=samples([t], [1])))
    w.commit(Batch(key="new", samples=samples([t + timedelta(days=30)], [2])))
    w.publish()
    now = t + timedelta(days=31)
    w.clock = lambda: now
    assert apply_retention(w, now, raw_days=7) == 1
    assert [r[3] for r in dump(tmp_path)["samples"]] == [2.0]
    assert w.commit(Batch(key="old", samples=samples([t], [1]))).duplicate
    w.clock = lambda: now + timedelta(hours=1)  # past the grace period: the file is deleted
    w.publish()
    assert len(list((tmp_path / "samples").rglob("*.parquet"))) == 1


def test_retention_deletes_old_job_throughput_rows(tmp_path):
    from gpufleet.collector.maintenance import apply_retention

    t = datetime(2026, 11, 1)
    w = StoreWriter(tmp_path, clock=lambda: t)
    row = dict(cluster="c", scheduler="slurm", job_key="5", host="n1", flops=1e15, gpus=8, basis="flops")
    w.commit(Batch(key="r1", throughput=[dict(row, ts=t)]))
    w.commit(Batch(key="r2", throughput=[dict(row, ts=t + timedelta(days=10))]))
    w.publish()
    now = t + timedelta(days=12)
    assert apply_retention(w, now, raw_days=35, facts_days=11) == 1  # 12 days old > 11: gone; 2 days old stays
    w.publish()
    assert open_reader(tmp_path).execute("SELECT ts FROM job_throughput").fetchall() == [(t + timedelta(days=10),)]


def gpu_obs(ts, uuid="GPU-a", host="n1", **kw) -> dict:
    row = {"ts": ts, "cluster": "c", "host": host, "gpu_uuid": uuid, "gpu_instance": -1, "gpu": 0, "mig_profile": None,
           "model": "H100", "fb_total_mib": 81559.0, "driver_version": "550.54.15"}
    row.update(kw)
    return row


def alloc_obs(ts, job_key="5", uuid="GPU-a", **kw) -> dict:
    row = {"ts": ts, "cluster": "c", "scheduler": "slurm", "job_key": job_key, "host": "n1", "gpu_uuid": uuid,
           "gpu_instance": -1, "gpu": 0, "source": "exporter"}
    row.update(kw)
    return row


def test_repeated_observations_widen_inventory_and_allocations_like_the_full_upsert(tmp_path):
    """Observations of known rows take the writer's fast lane; the tables must read exactly as if
    every observation had gone through the full upsert, whatever the order they come in."""
    w = StoreWriter(tmp_path, clock=lambda: T0)
    rounds = [T0 + timedelta(seconds=15 * i) for i in range(6)]
    for i, ts in enumerate(rounds):
        gpus = [gpu_obs(ts), gpu_obs(ts, uuid="GPU-b", gpu=1, fb_total_mib=40536.5)]
        allocs = [alloc_obs(ts)] + ([alloc_obs(ts, job_key="6", uuid="GPU-b", gpu=1)] if i >= 3 else [])
        if i >= 4:
            gpus[0]["driver_version"] = "560.1"  # an attribute changes (the driver was upgraded): the full upsert
        if i == 4:
            gpus[1]["model"] = None  # an attribute missing: the stored one stays
        w.commit(Batch(key=f"r{i}", gpus=gpus, allocations=allocs))
    late = gpu_obs(T0 - timedelta(minutes=1), driver_version=None)  # first_seen moves back
    w.commit(Batch(key="late", gpus=[late], allocations=[alloc_obs(rounds[2])]))
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT gpu_uuid, gpu, model, fb_total_mib, driver_version, first_seen, last_seen FROM gpus ORDER BY 1").fetchall() == [
        ("GPU-a", 0, "H100", 81559.0, "560.1", T0 - timedelta(minutes=1), rounds[-1]),
        ("GPU-b", 1, "H100", 40536.5, "550.54.15", T0, rounds[-1]),
    ]
    assert con.execute("SELECT job_key, gpu_uuid, gpu, first_seen, last_seen FROM allocations ORDER BY 1").fetchall() == [
        ("5", "GPU-a", 0, T0, rounds[-1]), ("6", "GPU-b", 1, rounds[3], rounds[-1])]
    # a writer opened later (empty mirror) continues from the stored rows
    w.close()
    w = StoreWriter(tmp_path, clock=lambda: T0)
    w.commit(Batch(key="next", gpus=[gpu_obs(T0 + timedelta(hours=1))], allocations=[alloc_obs(T0 + timedelta(hours=1))]))
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute("SELECT last_seen FROM gpus WHERE gpu_uuid = 'GPU-a'").fetchone() == (T0 + timedelta(hours=1),)
    assert con.execute("SELECT last_seen FROM allocations WHERE job_key = '5'").fetchone() == (T0 + timedelta(hours=1),)


def test_a_rolled_back_commit_leaves_no_trace_in_the_fast_lane(tmp_path):
    w = StoreWriter(tmp_path, clock=lambda: T0)
    w.commit(Batch(key="a", gpus=[gpu_obs(T0)]))
    bad = Batch(key="b", gpus=[gpu_obs(T0 + timedelta(minutes=1))], jobs=[{"cluster": "c"}])  # a job without its key: the commit fails
    with pytest.raises(Exception):
        w.commit(bad)
    w.commit(Batch(key="c", gpus=[gpu_obs(T0 + timedelta(seconds=30))]))
    w.publish()
    assert open_reader(tmp_path).execute("SELECT last_seen FROM gpus").fetchall() == [(T0 + timedelta(seconds=30),)]


def test_nothing_new_republishes_nothing_and_replaced_snapshots_go_after_the_grace_period(tmp_path):
    now = [T0]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    w.commit(Batch(key="a", gpus=[gpu_obs(T0)]))
    w.publish()
    first = json.loads((tmp_path / "manifest.json").read_text())["tables"]["gpus"]
    w.commit(Batch(key="a2", gpus=[gpu_obs(T0)]))  # the same observation again: nothing changes
    w.publish()
    assert json.loads((tmp_path / "manifest.json").read_text())["tables"]["gpus"] == first
    w.commit(Batch(key="b", gpus=[gpu_obs(T0 + timedelta(seconds=15))]))
    w.publish()
    second = json.loads((tmp_path / "manifest.json").read_text())["tables"]["gpus"]
    assert second != first and (tmp_path / first).exists()  # a reader of the older manifest still reads it
    now[0] = T0 + timedelta(minutes=11)
    w.publish()
    assert not (tmp_path / first).exists() and (tmp_path / second).exists()
    # snapshots a crash left behind (named by no manifest) are swept by the next writer, after
    # the grace period, as a reader may have opened the manifest that named them
    w.close()
    stale = tmp_path / "tables" / "gpus-000000001.parquet"
    stale.write_bytes(b"PAR1 from before a crash")
    (tmp_path / "tables" / ".gpus-000000009.parquet.tmp").write_bytes(b"half written")
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    assert stale.exists() and not (tmp_path / "tables" / ".gpus-000000009.parquet.tmp").exists()
    now[0] += timedelta(minutes=11)
    w.publish()
    w.close()
    assert not stale.exists()
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == sorted(
        Path(f).name for f in json.loads((tmp_path / "manifest.json").read_text())["tables"].values())
    assert open_reader(tmp_path).execute("SELECT last_seen FROM gpus").fetchall() == [(T0 + timedelta(seconds=15),)]


def test_sample_files_use_the_tuned_encodings(tmp_path):
    import pyarrow.parquet as pq

    w = StoreWriter(tmp_path)
    w.commit(Batch(key="x", samples=samples([T0, T0 + timedelta(seconds=15)], [5, 6])))
    w.publish()
    (path,) = [tmp_path / f for f in json.loads((tmp_path / "manifest.json").read_text())["samples"]]
    meta = pq.ParquetFile(path).metadata.row_group(0)
    enc = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in enc["ts"] and "DELTA_BINARY_PACKED" in enc["energy_mj"]
    assert "BYTE_STREAM_SPLIT" in enc["gpu_util"]
    assert "RLE_DICTIONARY" in enc["host"] and "RLE_DICTIONARY" in enc["gpu"]


@pytest.mark.parametrize("seed", range(5))
def test_fast_lane_and_full_upsert_agree_on_random_observations(tmp_path, seed):
    import random

    from gpufleet.collector.store import _Mirror

    rng = random.Random(seed)
    fast, full = StoreWriter(tmp_path / "fast", clock=lambda: T0), StoreWriter(tmp_path / "full", clock=lambda: T0)
    full._mirror = lambda table: _Mirror()  # an empty mirror: every observation through the full upsert
    for i in range(40):
        gpus, allocs = [], []
        for _ in range(rng.randint(0, 6)):
            ts = T0 + timedelta(seconds=15 * rng.randint(-20, 60))
            uuid = rng.choice(["GPU-a", "GPU-b", "GPU-c"])
            gpus.append(gpu_obs(ts, uuid=uuid, gpu=rng.choice([0, 1, None]), model=rng.choice(["H100", "A100", None]),
                                fb_total_mib=rng.choice([81559.0, 40536.5, 0.1, None]), driver_version=rng.choice(["550", "560", None])))
            allocs.append(alloc_obs(ts, job_key=rng.choice(["5", "6"]), uuid=uuid, gpu=rng.choice([0, 1, None]), gpu_instance=rng.choice([-1, None, 2])))
        batch = lambda: Batch(key=f"b{i}", gpus=[dict(g) for g in gpus], allocations=[dict(a) for a in allocs])  # noqa: E731
        fast.commit(batch())
        full.commit(batch())
    assert_same_tables(fast, full, tmp_path)


def assert_same_tables(fast: StoreWriter, full: StoreWriter, tmp_path) -> None:
    """The shortcut writer (`fast`) and the full-upsert one published the same gpus and allocations."""
    for w in (fast, full):
        w.publish()
        w.close()
    for table in ("gpus", "allocations"):
        q = f"SELECT * FROM {table} ORDER BY ALL"
        assert open_reader(tmp_path / "fast").execute(q).fetchall() == open_reader(tmp_path / "full").execute(q).fetchall(), table


def test_scrape_rounds_with_jobs_ending_read_as_the_full_upsert(tmp_path):
    """Rounds that move every row from one last_seen to the next take the shortcut of matching
    on last_seen alone; a row left behind (a job that ended, a GPU gone) must not move with them."""
    from gpufleet.collector.store import _Mirror

    fast, full = StoreWriter(tmp_path / "fast", clock=lambda: T0), StoreWriter(tmp_path / "full", clock=lambda: T0)
    full._mirror = lambda table: _Mirror()
    shifts = []
    shift = fast._shift_last_seen
    fast._shift_last_seen = lambda *a: shifts.append(ok := shift(*a)) or ok
    for i in range(8):
        ts = T0 + timedelta(seconds=15 * i)
        uuids = ["GPU-a", "GPU-b", "GPU-c"] if i not in (3, 4) else ["GPU-a", "GPU-b"]  # GPU-c missed two rounds
        jobs = {"GPU-a": "5" if i < 5 else "7", "GPU-b": "6", "GPU-c": "6"}  # job 5 ends, 7 starts on GPU-a
        batch = lambda: Batch(key=f"r{i}", gpus=[gpu_obs(ts, uuid=u) for u in uuids],  # noqa: E731
                              allocations=[alloc_obs(ts, job_key=jobs[u], uuid=u) for u in uuids])
        fast.commit(batch())
        full.commit(batch())
    assert True in shifts and False in shifts  # both ways were taken
    assert_same_tables(fast, full, tmp_path)


def test_sample_files_from_before_a_column_was_added_read_it_as_null(tmp_path):
    """A store upgraded in place keeps its old sample files: a column added since (the NVLink
    rates) reads as NULL (unknown) for their rows, whichever file comes first, never as an error."""
    import pyarrow.parquet as pq

    from gpufleet.times import epoch_us

    added = ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="old", samples=samples([T0], [5])))
    w.publish()
    for f in (tmp_path / "samples").rglob("*.parquet"):  # as the gpufleet before the columns wrote it
        pq.write_table(pq.read_table(f).drop_columns(list(added)), f)
    con = open_reader(tmp_path)
    assert con.execute(f"SELECT gpu_util, {', '.join(added)} FROM gpu_samples").fetchall() == [(5.0, None, None)]
    new = samples([T0 + timedelta(minutes=1)], [6])
    new = new.set_column(new.schema.get_field_index(added[1]), added[1], pa.array([7e9], pa.float32()))
    w.commit(Batch(key="new", samples=new))
    w.publish()
    con = open_reader(tmp_path)
    assert con.execute(f"SELECT gpu_util, {added[1]} FROM gpu_samples ORDER BY ts").fetchall() == [(5.0, None), (6.0, 7e9)]
    # a read of some minutes over the days' files alone reconciles them as the view does
    source = samples_between(con, epoch_us(T0 - timedelta(minutes=1)), epoch_us(T0 + timedelta(minutes=2)))
    assert con.execute(f"SELECT gpu_util, {added[1]} FROM {source} ORDER BY ts").fetchall() == [(5.0, None), (6.0, 7e9)]
    w.close()


def test_a_reader_never_checkpoints_its_window_tables(tmp_path):
    """A reader's in-memory DuckDB does not checkpoint (READER_CHECKPOINT_THRESHOLD): its cursors'
    window tables would be rewritten mid-analysis each time their sizes passed DuckDB's 16 MiB."""
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="a", samples=samples([T0], [5])))
    w.publish()
    con = open_reader(tmp_path)
    for c in (con, con.cursor()):
        assert c.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0] == "1.0 TiB"
    w.close()


def test_a_sample_files_footer_is_read_once_until_the_file_changes(tmp_path, monkeypatch):
    """open_reader checks the sample files' columns from their footers once per file (a reader is
    opened after every publish): a second reader reads none, and a file rewritten under its name
    (here as an older gpufleet wrote it) is read again and reconciled."""
    import pyarrow.parquet as pq

    from gpufleet.collector import store

    w = StoreWriter(tmp_path)
    w.commit(Batch(key="a", samples=samples([T0], [5])))
    w.publish()
    read = []
    real = store._sample_file_columns
    monkeypatch.setattr(store, "_sample_file_columns", lambda con, files: read.extend(files) or real(con, files))
    assert open_reader(tmp_path).execute("SELECT gpu_util FROM gpu_samples").fetchall() == [(5.0,)]
    first = len(read)
    assert first >= 1
    open_reader(tmp_path)
    assert len(read) == first
    added = "nvlink_rx_bytes_per_s"
    for f in (tmp_path / "samples").rglob("*.parquet"):
        pq.write_table(pq.read_table(f).drop_columns([added]), f)
    assert open_reader(tmp_path).execute(f"SELECT gpu_util, {added} FROM gpu_samples").fetchall() == [(5.0, None)]
    assert len(read) == 2 * first
    # files compaction retired are forgotten once they outnumber the store's
    monkeypatch.setitem(store._SAMPLE_FILE_COLUMNS, "/retired/0.parquet", ((0, 0), True))
    store._SAMPLE_FILE_COLUMNS.update({f"/retired/{i}.parquet": ((0, 0), True) for i in range(1, 1500)})
    open_reader(tmp_path)
    assert not [f for f in store._SAMPLE_FILE_COLUMNS if f.startswith("/retired/")]
    w.close()


def test_a_read_of_some_minutes_opens_the_files_holding_them(tmp_path):
    """samples_between picks, of the days a range touches, the files whose samples' first and last
    time (the manifest's sample_spans, from the writer's ledger) meet the range: the newest day
    holds a file per collector round until compaction, and a read of the last minutes opens those
    minutes' files, not the day's. The store's extent is its first and last sample. Compaction keeps
    the spans; a manifest without them (an older writer's) reads whole days, as before."""
    from gpufleet.analytics.facts import SAMPLE_EXTENT
    from gpufleet.collector.store import SAMPLE_FILES_BETWEEN
    from gpufleet.times import epoch_us

    start = datetime(2026, 11, 17, 10, 0)
    w = StoreWriter(tmp_path)
    for i in range(6):  # a round every 10 minutes, each a file of its own
        w.commit(Batch(key=f"r{i}", samples=samples([start + timedelta(minutes=10 * i)], [i])))
    w.publish()
    con = open_reader(tmp_path)
    t0 = epoch_us(start)
    minute = 60_000_000

    def files(lo, hi):  # (what samples_between reads)
        return len(con.execute(SAMPLE_FILES_BETWEEN, {"lo": lo, "hi": hi}).fetchall())

    assert files(t0, t0 + 60 * minute) == 6
    assert files(t0 + 25 * minute, t0 + 45 * minute) == 2  # the rounds at 30 and 40 minutes
    assert files(t0 + 51 * minute, t0 + 60 * minute) == 0
    assert con.execute(f"SELECT gpu_util FROM {samples_between(con, t0 + 25 * minute, t0 + 45 * minute)} ORDER BY ts").fetchall() == [(3.0,), (4.0,)]
    assert con.execute(SAMPLE_EXTENT).fetchone() == (t0, t0 + 50 * minute + 1)
    # compaction merges the rounds into the hour's file: its span is theirs
    from gpufleet.collector.maintenance import compact_hours

    assert compact_hours(w, start + timedelta(hours=2)) == 1
    w.invalidate()
    w.publish()
    con = open_reader(tmp_path)
    assert len(con.execute("SELECT * FROM sample_files").fetchall()) == 1
    assert files(t0 + 25 * minute, t0 + 45 * minute) == 1 and files(t0 + 51 * minute, t0 + 60 * minute) == 0
    assert con.execute(SAMPLE_EXTENT).fetchone() == (t0, t0 + 50 * minute + 1)
    # a manifest without spans (an older writer's): every file of the day, the day's edges
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["sample_spans"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    con = open_reader(tmp_path)
    assert files(t0 + 51 * minute, t0 + 60 * minute) == 1
    assert con.execute(SAMPLE_EXTENT).fetchone() == (epoch_us(datetime(2026, 11, 17)), epoch_us(datetime(2026, 11, 18)))
    w.close()


@pytest.mark.parametrize("old_first", [True, False])
def test_upkeep_of_an_hour_written_across_an_upgrade_keeps_every_column(tmp_path, old_first):
    """An hour whose files were written before and after a column was added (a store upgraded
    in place within the hour) is compacted and its facts built with every column:
    the newer file's values kept, the older rows NULL - in either order of the files (read plainly,
    DuckDB takes the first file's columns: the newer ones were lost, or the read failed)."""
    import pyarrow.parquet as pq

    from gpufleet.collector import maintenance

    added = "nvlink_rx_bytes_per_s"
    t_old, t_new = (T0 - timedelta(minutes=20), T0 - timedelta(minutes=10))
    if not old_first:
        t_old, t_new = t_new, t_old
    w = StoreWriter(tmp_path)
    w.commit(Batch(key="old", samples=samples([t_old], [5])))
    w.publish()
    for f in (tmp_path / "samples").rglob("*.parquet"):  # as the gpufleet before the column wrote it
        pq.write_table(pq.read_table(f).drop_columns([added]), f)
    new = samples([t_new], [6])
    new = new.set_column(new.schema.get_field_index(added), added, pa.array([7e9], pa.float32()))
    w.commit(Batch(key="new", samples=new))
    w.publish()
    assert maintenance.compact(w, T0 + timedelta(days=2), facts_hours=None) == 1
    files = list((tmp_path / "samples").rglob("compact-*.parquet"))
    assert len(files) == 1 and pq.read_schema(files[0]).names == schema.SAMPLE_SCHEMA.names
    con = open_reader(tmp_path)
    got = dict(con.execute(f"SELECT gpu_util, {added} FROM gpu_samples").fetchall())
    assert got == {5.0: None, 6.0: 7e9}
    assert con.execute("SELECT sum(nvlink_rx_bytes_per_s_known_s) > 0 FROM fact_parts WHERE grain_s = 300").fetchone()[0]
    w.close()
