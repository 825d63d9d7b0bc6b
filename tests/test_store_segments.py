"""Settled history in immutable segments: readers see exactly the rows a full snapshot of the
writer's tables would give (the store before segments), whatever the sequence of upserts,
ends, corrections, settle passes, restarts and crashes; segments stay few."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector import schema, store
from gpufleet.collector.maintenance import settle
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import SEG, StoreWriter, open_reader

T0 = datetime(2026, 11, 2)
TABLES = ("jobs", "allocations", "gpus")


def job(key: str, state: str = "RUNNING", end: datetime | None = None, **kw) -> dict:
    row = {c: None for c in schema.JOB_COLUMNS}
    row.update(cluster="c", scheduler="slurm", job_key=key, job_id=key, state=state, source="sacct", updated_at=T0,
               gpus=1, account="physics", start=T0, end=end)
    row.update(kw)
    return row


def alloc(ts: datetime, key: str, n: int = 0, **kw) -> dict:
    """An observation of job `key` on GPU number `n` of host n1."""
    row = {"ts": ts, "cluster": "c", "scheduler": "slurm", "job_key": key, "host": "n1", "gpu_uuid": f"GPU-{n}",
           "gpu_instance": -1, "gpu": n, "source": "exporter"}
    row.update(kw)
    return row


def full_snapshot(w: StoreWriter) -> dict[str, list[tuple]]:
    """What the store published before segments: every table whole, from the writer's state."""
    return {t: w.db.execute(f"SELECT * {'EXCLUDE (' + SEG + ')' if t in store.SEGMENTED else ''} FROM {t} ORDER BY ALL").fetchall()
            for t in TABLES}


def read(root: Path) -> dict[str, list[tuple]]:
    con = open_reader(root)
    return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}


def manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def segment_rows(w: StoreWriter, table: str) -> list[int]:
    return [r[0] for r in w.db.execute("SELECT rows FROM segments WHERE tbl = ? ORDER BY id", [table]).fetchall()]


def check_segments(w: StoreWriter) -> None:
    """Consolidated segments: each more than MERGE_RATIO times the next newer, so at most
    log_MERGE_RATIO(rows) + 1 of them; and the manifest names what the ledger has."""
    for table in store.SEGMENTED:
        rows = segment_rows(w, table)
        assert all(a > store.MERGE_RATIO * b for a, b in zip(rows, rows[1:])), (table, rows)
        assert manifest(w.root)["segments"][table] == [
            r[0] for r in w.db.execute("SELECT file FROM segments WHERE tbl = ? ORDER BY id", [table]).fetchall()]


# --- the property: random histories read as the full snapshot ---

keys = st.sampled_from(["1", "2", "3", "4", "5"])
hours = st.integers(0, 30)
settles = st.tuples(st.just("settle"), st.integers(0, 40))
ops = st.one_of(
    st.tuples(st.just("job"), keys, st.sampled_from(["PENDING", "RUNNING", "COMPLETED", "FAILED"]),
              st.one_of(st.none(), hours), st.sampled_from(["physics", "chem"])),
    st.tuples(st.just("alloc"), keys, hours, st.integers(0, 1), st.sampled_from([0, 1, None])),
    settles,
    st.tuples(st.just("vanish"), st.lists(keys, max_size=3)),
    st.tuples(st.just("correct"), keys, st.sampled_from(["physics", "chem", "bio"])),
    settles,
    st.tuples(st.just("restart"),),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=8, max_size=30))
def test_readers_see_the_full_snapshot_after_any_history(history):
    """Upserts, ends, sacct corrections of settled jobs, allocations seen again after they
    settled, vanished jobs, settle passes (new segments, merges, folded corrections) and writer
    restarts, in any order: the reader's rows equal a full snapshot of the writer's tables."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-seg-") as d, pytest.MonkeyPatch.context() as mp:
        # small thresholds, so that short histories merge, fold and overflow the corrections
        mp.setattr(store, "SETTLE_AFTER", timedelta(hours=4))
        mp.setattr(store, "FOLD_RATIO", 2)
        mp.setattr(store, "CORRECTIONS_MAX", 2)
        root = Path(d)
        now = [T0]
        w = StoreWriter(root, clock=lambda: now[0])
        try:
            for i, op in enumerate(history):
                kind = op[0]
                if kind == "job":
                    _, key, state, end, account = op
                    end_ts = T0 + timedelta(hours=end) if end is not None and state not in ("PENDING", "RUNNING") else None
                    w.commit(Batch(key=f"b{i}", jobs=[job(key, state, end_ts, account=account)]))
                elif kind == "alloc":
                    _, key, h, gpu, gpu_index = op
                    w.commit(Batch(key=f"b{i}", allocations=[alloc(T0 + timedelta(hours=h), key, gpu, gpu=gpu_index)]))
                elif kind == "correct":  # sacct changes one field of a job, which stays as settled as it was
                    _, key, account = op
                    cur = w.db.execute("SELECT * FROM jobs WHERE job_key = ?", [key])
                    rows = [dict(zip([c[0] for c in cur.description], r)) for r in cur.fetchall()]
                    w.commit(Batch(key=f"b{i}", jobs=[dict(r, account=account) for r in rows]))
                elif kind == "vanish":
                    listed = [job(k) for k in op[1]]
                    w.commit(Batch(key=f"b{i}", jobs=listed, jobs_complete=("c", "slurm", now[0])))
                elif kind == "settle":
                    now[0] = max(now[0], T0 + timedelta(hours=op[1]))
                    settle(w, now[0])
                    check_segments(w)
                else:
                    w.close()
                    w = StoreWriter(root, clock=lambda: now[0])
                w.publish()
                assert read(root) == full_snapshot(w), (i, op)
            now[0] += timedelta(hours=100)  # everything settles: the open parts empty out
            settle(w, now[0])
            check_segments(w)
            assert read(root) == full_snapshot(w)
        finally:
            w.close()


# --- examples ---


def fleet_history(w: StoreWriter, days: int, gpus: int = 4) -> None:
    """`days` of jobs, one per GPU and day, each seen at the start and end of its day."""
    for d in range(days):
        for g in range(gpus):
            key = f"{d}-{g}"
            start, end = T0 + timedelta(days=d), T0 + timedelta(days=d, hours=23)
            w.commit(Batch(key=f"h{key}", jobs=[job(key, "COMPLETED", end, start=start)],
                           allocations=[alloc(start, key, g), alloc(end, key, g)]))
    w.publish()


def test_settled_rows_are_written_once_and_a_round_publishes_only_the_open_part(tmp_path):
    now = [T0 + timedelta(days=10)]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    fleet_history(w, days=10)
    before = read(tmp_path)
    assert settle(w, now[0]) == 2 * 36  # days 0-8 of jobs and allocations; day 9 ended 1 h ago, within SETTLE_AFTER
    assert read(tmp_path) == before == full_snapshot(w)
    m = manifest(tmp_path)
    assert len(m["segments"]["jobs"]) == len(m["segments"]["allocations"]) == 1 and m["superseded"] == {}
    assert pq.read_metadata(tmp_path / m["tables"]["allocations"]).num_rows == 4  # the open part: day 9
    # a round that changes an open row publishes the open part, never the segments again
    w.commit(Batch(key="round", allocations=[alloc(now[0], "9-0", 0)]))
    w.publish()
    m2 = manifest(tmp_path)
    assert m2["segments"] == m["segments"] and m2["tables"]["allocations"] != m["tables"]["allocations"]
    assert pq.read_metadata(tmp_path / m2["tables"]["allocations"]).num_rows == 4
    assert read(tmp_path) == full_snapshot(w)
    # a settle pass with nothing newly settled writes nothing
    assert settle(w, now[0]) == 0 and manifest(tmp_path)["segments"] == m["segments"]


def test_corrections_of_settled_rows_override_their_segment_until_it_is_rewritten(tmp_path, monkeypatch):
    now = [T0 + timedelta(days=10)]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    fleet_history(w, days=10)
    settle(w, now[0])
    (jobs_seg,) = manifest(tmp_path)["segments"]["jobs"]
    (alloc_seg,) = manifest(tmp_path)["segments"]["allocations"]
    # sacct corrects an old job (state and end); the same job listed again unchanged is no correction
    w.commit(Batch(key="fix", jobs=[job("2-1", "FAILED", T0 + timedelta(days=2, hours=20), start=T0 + timedelta(days=2)),
                                     job("3-1", "COMPLETED", T0 + timedelta(days=3, hours=23), start=T0 + timedelta(days=3))]))
    # a settled allocation seen again (the job's GPU reported late through a backfill), and one
    # seen at an earlier time than it had (first_seen moves back)
    w.commit(Batch(key="late", allocations=[alloc(T0 + timedelta(days=1, hours=23, minutes=30), "1-0", 0),
                                            alloc(T0 - timedelta(hours=1), "0-0", 0)]))
    w.publish()
    m = manifest(tmp_path)
    assert m["superseded"] == {"jobs": [jobs_seg], "allocations": [alloc_seg]}
    assert read(tmp_path) == full_snapshot(w)
    con = open_reader(tmp_path)
    assert con.execute("""SELECT state, "end" FROM jobs WHERE job_key = '2-1'""").fetchall() == [("FAILED", T0 + timedelta(days=2, hours=20))]
    assert con.execute("SELECT count(*) FROM jobs").fetchone() == (40,)  # no key twice
    assert w.db.execute(f"SELECT count(*) FROM jobs WHERE {SEG} < 0").fetchone() == (1,)  # only the changed job
    # settled corrections are folded in when they pass 1/FOLD_RATIO of their segment
    monkeypatch.setattr(store, "FOLD_RATIO", 16)
    settle(w, now[0])
    assert manifest(tmp_path)["superseded"] == {"jobs": [jobs_seg], "allocations": [alloc_seg]}  # 1 and 2 of 36: not yet
    monkeypatch.setattr(store, "FOLD_RATIO", 36)
    settle(w, now[0])
    m = manifest(tmp_path)
    assert m["superseded"] == {} and m["segments"]["jobs"] != [jobs_seg] and len(m["segments"]["jobs"]) == 1
    assert read(tmp_path) == full_snapshot(w)
    assert w.db.execute(f"SELECT count(*) FROM allocations WHERE {SEG} IS NULL OR {SEG} < 0").fetchone() == (4,)
    # the replaced segments stay for readers of older manifests, then go
    assert (tmp_path / jobs_seg).exists()
    now[0] += store.RETIRE_GRACE + timedelta(minutes=1)
    w.publish()
    assert not (tmp_path / jobs_seg).exists() and read(tmp_path) == full_snapshot(w)


def test_a_correction_that_reopens_a_row_leaves_its_segment_when_the_segment_is_rewritten(tmp_path, monkeypatch):
    """A requeued job runs again: its segment row is overridden; when the segment is rewritten the
    row is not settled, so it goes back to the open part for good (no segment holds it)."""
    monkeypatch.setattr(store, "FOLD_RATIO", 1)
    now = [T0 + timedelta(days=3)]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    fleet_history(w, days=3, gpus=1)
    settle(w, now[0])
    w.commit(Batch(key="requeue", jobs=[job("0-0", "PENDING", None)], allocations=[alloc(now[0], "0-0", 0)]))
    w.publish()
    assert read(tmp_path) == full_snapshot(w) and manifest(tmp_path)["superseded"]
    # a merge of the segments holding it (the new day's segment is as large as the older one)
    now[0] += timedelta(days=1)
    for d in (3, 4):
        w.commit(Batch(key=f"d{d}", jobs=[job(f"{d}-0", "COMPLETED", T0 + timedelta(days=d, hours=1))],
                       allocations=[alloc(T0 + timedelta(days=d), f"{d}-0", 0)]))
    settle(w, now[0])
    assert len(manifest(tmp_path)["segments"]["jobs"]) == 1
    assert manifest(tmp_path)["superseded"] == {}
    assert w.db.execute(f"SELECT {SEG} FROM jobs WHERE job_key = '0-0'").fetchone() == (None,)
    assert read(tmp_path) == full_snapshot(w)


def test_segment_count_stays_logarithmic(tmp_path):
    now = [T0]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    for day in range(64):  # one settle pass per simulated day, a day of jobs settling each time
        for g in range(3):
            key = f"{day}-{g}"
            w.commit(Batch(key=key, jobs=[job(key, "COMPLETED", T0 + timedelta(days=day, hours=1))],
                           allocations=[alloc(T0 + timedelta(days=day), key, g)]))
        now[0] = T0 + timedelta(days=day + 1)
        settle(w, now[0])
        check_segments(w)
    rows = segment_rows(w, "jobs")
    assert sum(rows) == 3 * 64 and len(rows) <= 6  # each more than twice the next: at most log2(192 / 3) + 1 = 7
    assert read(tmp_path) == full_snapshot(w)


class Crash(BaseException):
    """The process dies here: no except clause of the store runs."""


def test_a_crash_before_the_ledger_commit_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    now = [T0 + timedelta(days=5)]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    fleet_history(w, days=5)
    before, m0 = read(tmp_path), manifest(tmp_path)
    real = store.write_parquet

    def crash_after_segment(table, path):
        real(table, path)
        if "-segment-" in path.name:
            raise Crash

    monkeypatch.setattr(store, "write_parquet", crash_after_segment)
    with pytest.raises(Crash):
        settle(w, now[0])
    w.db.close()  # the open transaction dies with the process
    monkeypatch.setattr(store, "write_parquet", real)
    orphans = sorted(p.name for p in (tmp_path / "tables").glob("*-segment-*"))
    assert orphans and manifest(tmp_path) == m0 and read(tmp_path) == before
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    assert read(tmp_path) == before == full_snapshot(w)
    assert w.db.execute(f"SELECT count(*) FROM jobs WHERE {SEG} IS NOT NULL").fetchone() == (0,)
    settle(w, now[0])  # a fresh id: the orphan's name is not written again
    assert not set(orphans) & {Path(f).name for fs in manifest(tmp_path)["segments"].values() for f in fs}
    now[0] += store.RETIRE_GRACE + timedelta(minutes=1)
    w.publish()
    assert not any((tmp_path / "tables" / o).exists() for o in orphans)
    assert read(tmp_path) == before == full_snapshot(w)


def test_a_crash_between_the_ledger_commit_and_the_manifest_keeps_the_segment(tmp_path, monkeypatch):
    now = [T0 + timedelta(days=5)]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    fleet_history(w, days=5)
    before, m0 = read(tmp_path), manifest(tmp_path)

    def crash(self):
        raise Crash

    monkeypatch.setattr(StoreWriter, "publish", crash)
    with pytest.raises(Crash):
        settle(w, now[0])
    w.db.close()
    monkeypatch.undo()
    assert manifest(tmp_path) == m0 and read(tmp_path) == before  # readers: the old manifest, whole
    w = StoreWriter(tmp_path, clock=lambda: now[0])  # the segment is in the ledger: published, not swept
    segs = manifest(tmp_path)["segments"]
    assert len(segs["jobs"]) == len(segs["allocations"]) == 1
    now[0] += store.RETIRE_GRACE + timedelta(minutes=1)
    w.publish()
    assert all((tmp_path / f).exists() for fs in segs.values() for f in fs)
    assert read(tmp_path) == before == full_snapshot(w)


def test_a_snapshot_written_again_after_a_crash_is_not_deleted_as_the_orphan_it_replaced(tmp_path, monkeypatch):
    """A publish that dies before the manifest leaves tables/jobs-<seq>.parquet; the next writer
    starts from the manifest's seq, so it writes that very name again: live, it must stay."""
    now = [T0]
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    w.commit(Batch(key="a", jobs=[job("1")]))
    real = store._fsync_write

    def crash_at_manifest(path, write):
        if path.name == "manifest.json":
            raise Crash
        real(path, write)

    monkeypatch.setattr(store, "_fsync_write", crash_at_manifest)
    with pytest.raises(Crash):
        w.publish()
    w.db.close()
    monkeypatch.undo()
    w = StoreWriter(tmp_path, clock=lambda: now[0])
    now[0] += store.RETIRE_GRACE + timedelta(minutes=1)
    w.publish()
    w.close()
    assert all((tmp_path / f).exists() for f in manifest(tmp_path)["tables"].values())
    assert open_reader(tmp_path).execute("SELECT job_key FROM jobs").fetchall() == [("1",)]


def test_a_store_of_schema_4_is_migrated_and_its_rows_read_the_same(tmp_path):
    """A store written before segments: its tables gain the segment column, every row starts
    open, and settling moves the settled ones to segments without changing what readers see."""
    db = duckdb.connect(str(tmp_path / store.STATE_DB))
    db.execute(schema.STATE_DDL[0])
    for version in (1, 2, 3, 4):
        for stmt in schema.MIGRATIONS[version]:
            db.execute(stmt)
        db.execute("INSERT INTO schema_version VALUES (?, ?)", [version, T0])
    db.execute("INSERT INTO jobs (cluster, scheduler, job_key, job_id, state, \"end\", source, updated_at) VALUES "
               "('c', 'slurm', '1', '1', 'COMPLETED', ?, 'sacct', ?), ('c', 'slurm', '2', '2', 'RUNNING', NULL, 'sacct', ?)", [T0, T0, T0])
    db.execute("INSERT INTO allocations VALUES ('c', 'slurm', '1', 'n1', 'GPU-0', -1, 0, ?, ?, 'exporter')", [T0, T0 + timedelta(hours=1)])
    old = {t: db.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    old["jobs"] = [r + (None,) for r in old["jobs"]]  # + gpus_source (MIGRATIONS[6]): their GPU counts were never known
    db.close()
    now = T0 + timedelta(days=1)
    w = StoreWriter(tmp_path, clock=lambda: now)
    assert w.schema_version() == schema.SCHEMA_VERSION and read(tmp_path) == old
    settle(w, now)
    assert read(tmp_path) == old and manifest(tmp_path)["segments"]["jobs"]


def test_segments_of_an_older_schema_go_back_to_the_open_part(tmp_path, monkeypatch):
    """A later migration may rewrite rows (here: normalise account names) without touching the
    segment column: the writer rewrites every segment written under the older schema."""
    now = T0 + timedelta(days=5)
    w = StoreWriter(tmp_path, clock=lambda: now)
    fleet_history(w, days=5)
    settle(w, now)
    old_segments = manifest(tmp_path)["segments"]
    w.close()
    monkeypatch.setattr(schema, "SCHEMA_VERSION", schema.SCHEMA_VERSION + 1)
    monkeypatch.setitem(schema.MIGRATIONS, schema.SCHEMA_VERSION, ("UPDATE jobs SET account = upper(account)",))
    w = StoreWriter(tmp_path, clock=lambda: now)
    assert manifest(tmp_path)["segments"] == {"jobs": [], "allocations": []}
    assert read(tmp_path) == full_snapshot(w)
    assert {r[0] for r in open_reader(tmp_path).execute("SELECT account FROM jobs").fetchall()} == {"PHYSICS"}
    settle(w, now)
    assert manifest(tmp_path)["segments"]["jobs"] != old_segments["jobs"] and read(tmp_path) == full_snapshot(w)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=60))
def test_distinct_is_numpy_s_unique(values):
    import numpy as np

    from gpufleet.collector.intervals import distinct

    x = np.array(values, dtype=np.int64)
    assert distinct(x).tolist() == np.unique(x).tolist()
