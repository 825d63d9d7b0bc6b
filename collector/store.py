"""The store: one writer (the collector), any number of readers, nothing half-written.

DuckDB refuses a second process on a database file a writer holds, so readers never open the
writer's file. Instead:

- Samples go to date-partitioned Parquet (`samples/date=YYYY-MM-DD/*.parquet`), each file
  written to a temporary name, fsynced, and renamed into place.
- Mutable tables (jobs, allocations, gpus) live in the writer's `state.duckdb` and are
  published as Parquet. Jobs and allocations grow with history, so their settled rows (a job
  ended, an allocation last seen, SETTLE_AFTER ago) are written once into immutable segment
  files by settle(), and a publish writes only the open rest: its cost follows what is open,
  not how long the store has run. A settled row that changes anyway (sacct corrects a job, an
  allocation seen again) goes back to the open part, which overrides segment rows by key, until
  consolidation rewrites its segment; segments are merged so their count stays logarithmic.
  The small tables (gpus, job_throughput) are published as whole snapshots.
- `manifest.json` lists the files that make up the store right now; it is replaced atomically
  after every commit. Readers build DuckDB views over exactly those files, so a reader never
  sees a batch that is not fully committed, and files retired by compaction stay readable for a
  grace period so a reader holding an older manifest still works. It also lists the inputs the
  collector did not recognize in the last days (`unrecognized`, see note_unrecognized), for
  the dashboard's Health page.

Idempotency: every batch has a deterministic key; the ledger (`batches` table) remembers the key
and a checksum of its rows, so re-ingesting a window is a no-op. Crash safety: sample files are
renamed in before the ledger commit; files not in the ledger at start are leftovers of the batch
in flight and are removed, and the source's watermark (committed with the ledger) makes it
fetch that batch again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa

from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.shard import SHARDS_DIR
from gpufleet.times import epoch_us, utcnow

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
UNRECOGNIZED_KEEP = timedelta(days=7)  # how long an unrecognized input stays listed after it was last seen
MAX_UNRECOGNIZED = 200
STATE_DB = "state.duckdb"
RETIRE_GRACE = timedelta(minutes=10)

# Tables published as segments of settled rows + the open rest: name -> (key columns, when a row
# is settled; $h: the settle horizon, now - SETTLE_AFTER). Settled means "will most likely not
# change": readers are right whatever it says, a settled row that changes is only more work.
SEGMENTED: dict[str, tuple[tuple[str, ...], str]] = {
    "jobs": (("cluster", "scheduler", "job_key"), '"end" < $h'),  # NULL end (not ended): never
    "allocations": (("cluster", "scheduler", "job_key", "host", "gpu_uuid", "gpu_instance"), "last_seen < $h"),
}
SEG = schema.SEGMENT_COLUMN
SETTLE_AFTER = timedelta(hours=6)  # sacct corrections, requeues and exporter outages come sooner
MERGE_RATIO = 2  # consolidation: a segment at most this many times the rows of the next newer is merged with it
FOLD_RATIO = 64  # a segment is rewritten once 1/FOLD_RATIO of its rows are settled corrections
CORRECTIONS_MAX = 10_000  # ... or when a table's settled corrections pass this (they are published every round)


class StoreError(Exception):
    """The store cannot be used (locked by another writer, written by a newer version, ...)."""


class NoStoreError(StoreError):
    """There is no store where a reader looked: a command named the wrong directory (STORE_FIX)."""


# how a command that found no store is pointed at one
STORE_FIX = "pass --config gpufleet.toml (its [collector] or [analytics] store) or --store DIR"
# The threads of each reader's DuckDB: DuckDB's own default (one per core) unless this environment
# variable gives a number. Where several readers run side by side on one host's cores (the test
# suite's parallel workers, dashboard replicas), 1 each spares their threads contending for them.
READER_THREADS_ENV = "GPUFLEET_DUCKDB_THREADS"
# A reader's in-memory DuckDB never checkpoints its window tables. DuckDB checkpoints an in-memory
# database once its committed changes pass checkpoint_threshold (16 MiB by default), and a window's
# temp tables (analytics.facts' wpe, wheld, ...) pass it: the statement that crossed it then paid
# for rewriting them (the 1,024-GPU week's holder table: 0.25-0.30 s instead of 0.02 s) to reclaim
# nothing, as they go with their cursor.
READER_CHECKPOINT_THRESHOLD = "1 TiB"


@dataclass
class CommitResult:
    samples_written: int = 0
    duplicate: bool = False  # the batch key was already stored with the same rows
    conflict: bool = False  # the batch key was stored with different rows: refused
    jobs_written: int = 0


def facts_key(e: dict[str, Any]) -> str:
    """A facts manifest entry's key in StoreWriter.facts: "5m/<hour>", "day/<day>", and an open
    hour's file of its settled buckets "5m/<hour>+<from>" (maintenance._open_hour_tasks)."""
    return f"{e['grain']}/{e['bucket'] if e['grain'] == '5m' else e['bucket'][:10]}" + (f"+{e['from']}" if "upto" in e else "")


def _fsync_write(path: Path, write) -> None:
    """Write via a temporary name in the same directory, fsync, then rename: all or nothing."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make the names created or replaced in `directory` durable (a rename, a hard link)."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _checksum(table: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return hashlib.blake2b(sink.getvalue().to_pybytes(), digest_size=16).hexdigest()


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key)[:80]


def parquet_encodings(schema_: pa.Schema) -> tuple[list[str], dict[str, str]]:
    """(dictionary-encoded columns, other columns' encodings) for a table's schema.

    Chosen on a simulated week of GPU samples (bench/collector.py), compacted hour files sorted
    by GPU then time; against dictionaries on every column they take 35 % fewer bytes:
    - strings and small ints (host, UUID, model, gpu index): dictionary, which then run-length
      encodes the long runs of one GPU's rows;
    - timestamps and 32/64-bit integers (counters such as energy, NVLink bytes): delta encoding,
      so a rising counter costs its increments, not its magnitude;
    - floats (utilization, power, activity ratios, PCIe rates): byte-stream split, which puts
      the exponent and high mantissa bytes of consecutive values side by side for zstd, where a
      dictionary of noisy values is as large as the data and compresses worse.
    """
    dictionary, encoding = [], {}
    for f in schema_:
        t = f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_int8(t) or pa.types.is_int16(t):
            dictionary.append(f.name)
        elif pa.types.is_timestamp(t) or pa.types.is_int32(t) or pa.types.is_int64(t):
            encoding[f.name] = "DELTA_BINARY_PACKED"
        elif pa.types.is_float32(t) or pa.types.is_float64(t):
            encoding[f.name] = "BYTE_STREAM_SPLIT"
    return dictionary, encoding


# Rows per Parquet row group (4 x DuckDB's own 122,880). Files are sorted by host (then GPU and
# time), so a reader that wants a few hosts (a job's report) skips the
# other row groups by their statistics; pyarrow's default (1M rows) made a compacted hour of
# 16,384 GPUs 4 row groups of ~500 hosts each, and a 16-GPU job's report read ~1M rows an hour
# (its first load 2.4-2.5 s, now 1.6-1.8 s). Smaller groups (122,880) made it 1.4-1.6 s but cost
# the reads of every GPU's last minutes (Fleet now, Health: +0.6 s each at 16,384 GPUs).
ROW_GROUP_ROWS = 491_520


def write_parquet(table: pa.Table, path: Path) -> None:
    """Parquet tuned for GPU samples (see parquet_encodings), zstd, with statistics, in row groups
    of ROW_GROUP_ROWS."""
    import pyarrow.parquet as pq  # (the writer's alone: a reader's start-up goes without it)

    dictionary, encoding = parquet_encodings(table.schema)
    _fsync_write(
        path,
        lambda tmp: pq.write_table(
            table,
            tmp,
            compression="zstd",
            compression_level=3,
            row_group_size=ROW_GROUP_ROWS,
            use_dictionary=dictionary,
            column_encoding=encoding or None,
            write_statistics=True,
        ),
    )


class StoreWriter:
    """The single writer. Open it once per process; a second writer gets a clear StoreError."""

    def __init__(self, root: str | Path, *, clock=utcnow):
        self.root = Path(root)
        self.clock = clock
        if (self.root / SHARDS_DIR).exists():
            raise StoreError(f"store {self.root} is sharded ({self.root / SHARDS_DIR}): its writers are the shard collectors "
                             f"(gpufleet collect --shard K/N); write to one shard's directory, {self.root / SHARDS_DIR}/K-of-N")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "samples").mkdir(exist_ok=True)
        (self.root / "tables").mkdir(exist_ok=True)
        try:
            self.db = duckdb.connect(str(self.root / STATE_DB))
        except duckdb.IOException as e:
            raise StoreError(f"store {self.root} is locked by another writer (only one collector may write a store): {e}") from None
        # The writer runs small transactions back to back: one thread spares DuckDB the cost of
        # scheduling tiny parallel tasks (10 % of a scrape round's commit); parallel() lifts it.
        self.db.execute("SET threads = 1")
        self._migrate()
        self._schema_version = self.schema_version()
        self._dirty_tables: set[str] = set(schema.TABLES)
        previous = self._manifest()
        self._publish_seq = previous.get("version", 0)
        self._tables: dict[str, str] = dict(previous.get("tables", {}))  # table -> published snapshot (segmented: the open part)
        # table -> the segment files the open part overrides rows of (see publish)
        self._superseded: dict[str, list[str]] = dict(previous.get("superseded", {}))
        self._segments: dict[str, list[str]] | None = None  # table -> live segment files (None: read at the next publish)
        self._segment_ids: dict[str, dict[int, str]] = {}  # table -> segment id -> file, with _segments
        self._reset_stale_segments()
        # Inputs the collector did not recognize, as published in the manifest (kept across
        # restarts through it): (source, input, kind) -> entry; see note_unrecognized().
        self._unrecognized: dict[tuple[str, str, str], dict[str, Any]] = {
            (u["source"], u["input"], u["kind"]): u for u in previous.get("unrecognized", [])
            if isinstance(u, dict) and {"source", "input", "kind"} <= set(u)}
        # What publish() lists, kept in memory so a publish costs the same on day 1 and day 300
        # (None: read from the ledger at the next publish; see invalidate()): each sample file with
        # its samples' first and last ts (epoch us), so a reader opens only the files a range meets
        self._sample_files: dict[str, tuple[int, int]] | None = None
        self._cleanup_due: datetime | None = None  # when a retired file next passes its grace period
        # Table snapshots replaced by a publish, with when: deleted after the grace period. Kept in
        # memory (not in retired_files) because a publish replaces them every round; after a crash
        # the sweep at start finds them, as they are not in the manifest.
        self._retired_snapshots: list[tuple[str, datetime]] = []
        # Mirrors of the interval tables' recent rows: the scrape path's fast lane, see _observe()
        self._mirrors: dict[str, _Mirror] = {}
        self._gpu_disagreements: set[tuple] = set()  # job GPU counts two sources disagree on, logged once each
        # Facts (gpufleet.collector.facts), as published: "5m/<hour>" or "day/<day>" -> {grain,
        # bucket, file, inputs, tag}; kept across restarts through the manifest, rebuilt by upkeep
        # when their inputs change.
        self.facts: dict[str, dict[str, Any]] = {
            facts_key(e): e for e in previous.get("facts", []) if isinstance(e, dict) and {"grain", "bucket", "file", "inputs", "tag"} <= set(e)}
        # What the last upkeep pass left of the facts to build (maintenance.build_facts: "hours",
        # "days"), for gpufleet_collect_facts_awaiting_build; empty before the first pass
        self.facts_backlog: dict[str, int] = {}
        self._remove_uncommitted_files()
        self._sweep_snapshots(previous)
        self.publish()

    # --- schema ---

    def _migrate(self) -> None:
        self.db.execute(schema.STATE_DDL[0])
        current = self.db.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        if current > schema.SCHEMA_VERSION:
            raise StoreError(
                f"store {self.root} has schema version {current}, newer than this gpufleet's {schema.SCHEMA_VERSION}: upgrade gpufleet"
            )
        for version in sorted(v for v in schema.MIGRATIONS if v > current):
            self.db.execute("BEGIN")
            for stmt in schema.MIGRATIONS[version]:
                binds = {k: f() for k, f in (("now", self.clock), ("retired", lambda: _retired_tier_files(self.root))) if f"${k}" in stmt}
                self.db.execute(stmt, binds or None)
            self.db.execute("INSERT INTO schema_version VALUES (?, ?)", [version, self.clock()])
            self.db.execute("COMMIT")
            log.info("store %s migrated to schema version %d", self.root, version)

    def schema_version(self) -> int:
        return self.db.execute("SELECT max(version) FROM schema_version").fetchone()[0]

    # --- crash recovery ---

    def _remove_uncommitted_files(self) -> None:
        known = {r[0] for r in self.db.execute(
            "SELECT file FROM batches UNION SELECT file FROM retired_files").fetchall()}
        for top in ("samples", "rollup_5m"):  # (rollup_5m: a retired tier, schema.MIGRATIONS[9]: only leftovers there now)
            for path in (self.root / top).rglob("*"):
                if path.is_file() and str(path.relative_to(self.root)) not in known:
                    log.warning("removing %s: left by work that was not committed", path.relative_to(self.root))
                    path.unlink()

    def _sweep_snapshots(self, manifest: dict[str, Any]) -> None:
        """Table snapshots, segments and facts files neither the manifest nor the ledger names
        (replaced shortly before a crash, or written and never committed) go after the grace
        period: a reader may hold an older manifest. A segment committed but not yet published
        stays (the ledger has it)."""
        current = self._live_files() | {f for files in manifest.get("segments", {}).values() for f in files}
        now = self.clock()
        for path in sorted([*(self.root / "tables").iterdir(), *(self.root / "facts").rglob("*.parquet*")]):
            rel = str(path.relative_to(self.root))
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
            elif path.is_file() and rel not in current:
                self._retired_snapshots.append((rel, now))

    def _live_files(self) -> set[str]:
        """The table files the store is made of now: never deleted, whatever the retired lists say
        (a crash may have left a file of the same name there before it was written again)."""
        return (set(self._tables.values()) | {f for files in self._live_segments().values() for f in files}
                | {e["file"] for e in self.facts.values()})

    def _reset_stale_segments(self) -> None:
        """Segments written under an older schema go back to the open part (the next settle()
        writes them again): a migration may have added columns or rewritten values of their rows."""
        stale = self.db.execute("SELECT tbl, list(id), list(file) FROM segments WHERE schema_version < ? GROUP BY tbl",
                                [self._schema_version]).fetchall()
        if not stale:
            return
        now = self.clock()
        self.db.execute("BEGIN")
        try:
            for table, ids, files in stale:
                self.db.execute(f"UPDATE {table} SET {SEG} = NULL WHERE list_contains(?, abs({SEG}))", [ids])
                self.db.execute("DELETE FROM segments WHERE list_contains(?, id)", [ids])
                for f in files:
                    self.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
            self.db.execute("COMMIT")
        except Exception:
            self.db.execute("ROLLBACK")
            raise
        log.info("store %s: %d segments written under an older schema go back to the open part", self.root, sum(len(s[1]) for s in stale))

    # --- watermarks ---

    def watermark(self, name: str) -> str | None:
        row = self.db.execute("SELECT value FROM watermarks WHERE source = ?", [name]).fetchone()
        return row[0] if row else None

    # --- commit ---

    def has_batch(self, key: str) -> bool:
        """Whether a batch of this key is stored: a writer that names its batches before making them
        (a backfill) skips the work of those it already wrote."""
        return self.db.execute("SELECT 1 FROM batches WHERE batch_key = ? LIMIT 1", [key]).fetchone() is not None

    def commit(self, batch: Batch) -> CommitResult:
        result = CommitResult()
        now = self.clock()
        files: list[tuple[str, int, datetime, datetime]] = []
        checksum = ""
        if batch.samples is not None and batch.samples.num_rows:
            # one chunk: a scrape round concatenates one table per target, and both the checksum
            # and the Parquet writer pay per chunk (128 targets: 3x slower); it also makes the
            # checksum depend on the rows only, not on how they were split
            samples = batch.samples
            if not samples.schema.equals(schema.SAMPLE_SCHEMA):
                samples = samples.cast(schema.SAMPLE_SCHEMA)
            samples = samples.combine_chunks()
            checksum = _checksum(samples)
            prior = self.db.execute("SELECT checksum FROM batches WHERE batch_key = ? LIMIT 1", [batch.key]).fetchone()
            if prior is not None:
                if prior[0] == checksum:
                    result.duplicate = True
                else:
                    result.conflict = True
                    log.warning("batch %s was already stored with different rows; keeping the stored rows", batch.key)
            else:
                files = self._write_sample_files(batch.key, samples, checksum)
                result.samples_written = samples.num_rows
        reports_only = not files and not result.duplicate and not result.conflict and bool(batch.throughput or batch.shares or batch.checkpoints)
        if reports_only and self.has_batch(batch.key):
            result.duplicate, reports_only = True, False  # job reports of a batch already stored: count them once
        try:
            self.db.execute("BEGIN")
            if reports_only:  # a ledger row without a file remembers the key
                self.db.execute("INSERT INTO batches VALUES (?, '', 0, '', NULL, NULL, ?)", [batch.key, now])
            for rel, rows, lo, hi in files:
                self.db.execute(
                    "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [f"{batch.key}#{rel}" if len(files) > 1 else batch.key, rel, rows, checksum, lo, hi, now],
                )
            if len(files) > 1:  # a batch spanning dates: one ledger row per file, plus the key itself
                self.db.execute("INSERT INTO batches VALUES (?, ?, 0, ?, NULL, NULL, ?)", [batch.key, "", checksum, now])
            self._upsert_attempts(batch.attempts, now)
            result.jobs_written = self._upsert_jobs(batch.jobs, now)
            if batch.jobs_complete:
                result.jobs_written += self._close_vanished_jobs(batch.jobs_complete, batch.jobs)
            self._observe("allocations", batch.allocations)
            self._observe("gpus", batch.gpus)
            if not (result.duplicate or result.conflict):  # a batch stored before: its reports are counted
                self._upsert_throughput(batch.throughput)
                self._upsert_shares(batch.shares)
            self._upsert_checkpoints(batch.checkpoints)  # idempotent: one row per checkpoint, however often seen
            if batch.watermark:
                self.db.execute(
                    # watermarks only move forward: a backfill of an old window must not rewind them
                    "INSERT INTO watermarks VALUES (?, ?, ?) ON CONFLICT (source) DO UPDATE SET "
                    "value = greatest(watermarks.value, excluded.value), updated_at = excluded.updated_at",
                    [batch.watermark[0], batch.watermark[1], now],
                )
            self.db.execute("COMMIT")
        except Exception:
            self.db.execute("ROLLBACK")
            self._mirrors.clear()  # they may hold changes that were rolled back: reload when needed
            for rel, *_ in files:
                (self.root / rel).unlink(missing_ok=True)
            raise
        if self._sample_files is not None:
            self._sample_files.update((rel, (epoch_us(lo), epoch_us(hi))) for rel, _, lo, hi in files)
        if files:
            self._drop_facts(min(f[2] for f in files), max(f[3] for f in files))
        return result

    def _drop_facts(self, lo: datetime, hi: datetime) -> None:
        """Samples landed in [lo, hi]: the facts of the hours (and days) they reach no longer stand
        for their samples (a sample holds up to max_gap, at most 5 minutes, into the next bucket).
        Unlisted at the next publish, so no reader sums stale facts; upkeep writes them again."""
        reach = timedelta(minutes=5)
        for key, e in list(self.facts.items()):
            b = datetime.fromisoformat(e["from"] if "upto" in e else e["bucket"])
            # (an open hour's file holds [from, upto) alone: the collector's newest samples, after it, leave it be)
            end = datetime.fromisoformat(e["upto"]) if "upto" in e else b + (timedelta(hours=1) if e["grain"] == "5m" else timedelta(days=1))
            if b - reach <= hi and end > lo:
                self._retired_snapshots.append((e["file"], self.clock()))
                del self.facts[key]

    def put_facts(self, key: str, entry: dict[str, Any]) -> None:
        """List a facts file (gpufleet.collector.facts.upkeep) under `key`; the one it replaces is
        deleted after the grace period (a reader may hold an older manifest)."""
        old = self.facts.get(key)
        if old is not None and old["file"] != entry["file"]:
            self._retired_snapshots.append((old["file"], self.clock()))
        self.facts[key] = entry

    def retire_facts(self, key: str) -> None:
        """Unlist the facts file under `key` (retention); deleted after the grace period."""
        e = self.facts.pop(key, None)
        if e is not None:
            self._retired_snapshots.append((e["file"], self.clock()))

    def _write_sample_files(self, key: str, samples: pa.Table, checksum: str) -> list[tuple[str, int, datetime, datetime]]:
        import pyarrow.compute as pc  # (the writer's alone: a reader's start-up goes without it)

        lo, hi = (v.as_py() for v in pc.min_max(samples["ts"]).values())
        if lo.date() == hi.date():  # the common case (a scrape round): no per-row date strings
            parts = [(f"{lo:%Y-%m-%d}", samples, lo, hi)]
        else:
            dates = pc.strftime(samples["ts"], format="%Y-%m-%d")
            parts = []
            for date in sorted(set(dates.to_pylist())):
                part = samples.filter(pc.equal(dates, date))
                plo, phi = (v.as_py() for v in pc.min_max(part["ts"]).values())
                parts.append((date, part, plo, phi))
        out = []
        for date, part, plo, phi in parts:
            d = self.root / "samples" / f"date={date}"
            d.mkdir(exist_ok=True)
            path = d / f"{_safe(key)}-{checksum[:10]}.parquet"
            write_parquet(part, path)
            out.append((str(path.relative_to(self.root)), part.num_rows, plo, phi))
        return out

    def _upsert_jobs(self, jobs: list[dict[str, Any]], now: datetime) -> int:
        """Merge job rows into the store by JOB_MERGE: one rule for a job's fields whichever
        source read it (sacct, slurmdbd, slurmctld, files, the job mapping), in any order."""
        if not jobs:
            return 0
        cols = schema.JOB_COLUMNS
        staged = pa.Table.from_pylist([{c: j.get(c) for c in cols} for j in jobs],
                                      schema=pa.schema([(c, _ARROW_JOB_TYPES.get(c, pa.string())) for c in cols]))
        quoted = [f'"{c}"' for c in cols]
        key = ("cluster", "scheduler", "job_key")
        merged = {c: _job_merge(c) for c in cols if c not in key and c != "updated_at"}
        changed = " OR ".join(f'jobs."{c}" IS DISTINCT FROM {expr}' for c, expr in merged.items())
        updates = ", ".join(f'"{c}" = {expr}' for c, expr in merged.items())
        self.db.register("rows", staged)
        try:
            self._log_gpu_disagreements()
            # a requeue or restart: the record with the later start is the job's, the other an earlier
            # attempt (one scan of jobs says whether any row starts otherwise than its stored record)
            restarted = self.db.execute(_RESTARTED_ROWS).fetchone()[0] > 0
            if restarted and self.db.execute(_SUPERSEDED_ATTEMPTS).fetchone()[0]:
                self._dirty_tables.add("job_attempts")
            older = f"NOT EXISTS (SELECT 1 FROM jobs o WHERE {_STARTED_BEFORE.format(a='rows', b='o')})" if restarted else "true"
            self.db.execute(
                f"""INSERT INTO jobs ({", ".join(quoted)})
                    SELECT {", ".join(f'CAST("{c}" AS {_JOB_TYPES[c]})' for c in cols)} FROM rows
                    WHERE {older}
                    ON CONFLICT (cluster, scheduler, job_key) DO UPDATE SET {updates},
                      updated_at = CASE WHEN {changed} THEN excluded.updated_at ELSE jobs.updated_at END,
                      {SEG} = CASE WHEN {changed} THEN -abs(jobs.{SEG}) ELSE jobs.{SEG} END"""
            )
            self.db.execute(_FILL_GPUS_FROM_JOB_MAP.format(keys="SELECT cluster, scheduler, job_key FROM rows"))
        finally:
            self.db.unregister("rows")
        self._dirty_tables.add("jobs")
        return len(jobs)

    def _upsert_attempts(self, attempts: list[dict[str, Any]], now: datetime) -> None:
        """Store the earlier attempts a source read (schema.JOB_ATTEMPTS_DDL), one row per job and
        start: a later read fills what an earlier one did not know, and a known value stays."""
        rows = [{**{c: a.get(c) for c in schema.ATTEMPT_COLUMNS}, "updated_at": a.get("updated_at") or now}
                for a in attempts if a.get("start") is not None]
        if not rows:
            return
        self._run_staged(pa.Table.from_pylist(rows, schema=_ATTEMPT_OBS), _UPSERT_ATTEMPTS.format(source="rows"))
        self._dirty_tables.add("job_attempts")

    def _log_gpu_disagreements(self) -> None:
        """Two sources with different known GPU counts for one job (staged as `rows`): said once
        per job and pair of values, with both and which one the store keeps (JOB_MERGE)."""
        for cluster, job_id, old, old_src, new, new_src in self.db.execute(_GPU_DISAGREEMENTS).fetchall():
            said = (cluster, job_id, old, old_src, new, new_src)
            if said in self._gpu_disagreements:
                continue
            self._gpu_disagreements.add(said)
            keep = (new, new_src) if _gpus_rank(new_src) >= _gpus_rank(old_src) else (old, old_src)
            log.warning("job %s (cluster %s): %s says %s GPUs, %s says %s; keeping %s from %s (the more authoritative source)",
                        job_id, cluster, old_src or "an unnamed source", old, new_src or "an unnamed source", new, *keep)

    def _fill_gpus_from_job_map(self, obs: list[dict[str, Any]]) -> None:
        """New allocations (the exporters' job mapping): the GPU count of their jobs that no
        scheduler source knows is the number of GPUs the mapping saw them hold (gpus_source job_map)."""
        keys = {(o.get("cluster"), o.get("scheduler"), o.get("job_key")) for o in obs}
        self.db.register("rows", pa.Table.from_pylist([dict(zip(("cluster", "scheduler", "job_key"), k)) for k in keys]))
        try:
            if self.db.execute(_FILL_GPUS_FROM_JOB_MAP.format(keys="SELECT cluster, scheduler, job_key FROM rows")).fetchone()[0]:
                self._dirty_tables.add("jobs")
        finally:
            self.db.unregister("rows")

    def job_gpus_fallbacks(self) -> dict[tuple[str, str], int]:
        """(cluster, gpus_source) -> Slurm jobs whose GPU count accounting did not give: ended ones
        from slurmctld or the job mapping, and those of any state nobody gave (gpus_source unknown);
        0 for a cluster's source once none is left, so a gauge drops back."""
        rows = self.db.execute(_JOB_GPUS_FALLBACKS).fetchall()
        out = {(c, s): 0 for c in {r[0] for r in rows} for s in ("slurmctld", "job_map", "unknown")}
        out.update({(c, s): n for c, s, n in rows if s is not None})
        return out

    def _close_vanished_jobs(self, scope: tuple[str, str, datetime], jobs: list[dict[str, Any]]) -> int:
        """Close the scope's PENDING/RUNNING jobs missing from a complete listing (see Batch).

        The scheduler no longer knows them, so their real end is unknown: it lies between the
        last listing that had them and `as_of`; `as_of` is recorded, with state_raw DELETED."""
        cluster, scheduler, as_of = scope
        keys = [j["job_key"] for j in jobs if j.get("cluster") == cluster and j.get("scheduler") == scheduler]
        n = self.db.execute(
            f"""UPDATE jobs SET state = 'CANCELLED', state_raw = 'DELETED', "end" = coalesce("end", ?), updated_at = ?, {SEG} = -abs({SEG})
               WHERE cluster = ? AND scheduler = ? AND state IN ('PENDING', 'RUNNING') AND NOT list_contains(?::VARCHAR[], job_key)""",
            [as_of, as_of, cluster, scheduler, keys],
        ).fetchone()[0]
        if n:
            self._dirty_tables.add("jobs")
        return n

    def _observe(self, table: str, obs: list[dict[str, Any]]) -> None:
        """Apply inventory or allocation observations (one per GPU or job/GPU and scrape).

        Every scrape round observes every GPU again, and almost always the only news is a later
        last_seen. Those observations take a fast lane: the writer mirrors the tables' recent
        rows in memory, and observations of a known row with the same attributes become one
        UPDATE of last_seen (see _extend_last_seen; for 1,024 GPUs ~3 ms all told, against
        ~12 ms for the upsert). The rest (new rows, changed or missing attributes, anything
        unusual) take the full upsert, with every other observation of their row, so the table
        ends up exactly as the upsert alone makes it. Nothing changed: the table is not even republished.
        """
        if not obs:
            return
        keys, _ = _INTERVAL_TABLES[table]
        nk = len(keys)
        identity = _IDENTITY[table]
        rows = self._mirror(table).rows
        extend: dict[tuple, datetime] = {}
        seen: list[tuple | None] = []
        slow_keys: set[tuple | None] = set()
        for o in obs:
            try:
                ident, ts = identity(o), o["ts"]
            except KeyError:
                ident = ts = None
            seen.append(ident)
            m = rows.get(ident)
            if m is None or type(ts) is not datetime or ts < m[0]:
                slow_keys.add(_row_key(ident, nk))
            elif ts > m[1] and ts > extend.get(ident, m[1]):
                extend[ident] = ts
        if slow_keys:
            slow = [o for o, ident in zip(obs, seen) if _row_key(ident, nk) in slow_keys]
            extend = {ident: ts for ident, ts in extend.items() if _row_key(ident, nk) not in slow_keys}
            if table == "gpus":
                self._upsert_gpus(slow)
            else:
                self._upsert_allocations(slow)
                self._fill_gpus_from_job_map(slow)  # only new rows add GPUs to a job: the fast lane cannot
            self._refresh_mirror(table, slow)
        if extend:
            self._extend_last_seen(table, extend, rows)
            for ident, ts in extend.items():
                rows[ident][1] = ts  # later than the mirrored last_seen, or it would not be here
            self._dirty_tables.add(table)

    def _extend_last_seen(self, table: str, extend: dict[tuple, datetime], rows: dict[tuple, list[datetime]]) -> None:
        """Move the mirrored rows' last_seen to the later times in `extend` (identity -> time).

        A scrape round moves every row it saw from one last_seen (the previous round's) to one
        time (this round's). When no other row has that old last_seen, matching on it alone
        names exactly those rows, which spares the join on the key columns (~3 ms per table and
        round for 1,024 GPUs). The mirror holds each row's stored last_seen, so counting the rows
        with it is the whole check; a group that fails it (say a job that just ended, its row
        left behind) is joined on the keys instead.
        """
        groups: dict[tuple[datetime, datetime], int] = {}
        for ident, ts in extend.items():
            group = (rows[ident][1], ts)
            groups[group] = groups.get(group, 0) + 1
        if len(groups) > MAX_SHORTCUT_GROUPS:
            joined = set(groups)
        else:
            joined = {group for group, n in groups.items() if not self._shift_last_seen(table, *group, n)}
        if joined:
            self._join_last_seen(table, {i: ts for i, ts in extend.items() if (rows[i][1], ts) in joined})

    def _shift_last_seen(self, table: str, old: datetime, new: datetime, n: int) -> bool:
        """Set last_seen = new where it is old, if exactly n rows have it; whether it did."""
        updated = self.db.execute(
            # one statement: the subquery counts the rows before any of them changes
            f"UPDATE {table} SET last_seen = $new{_touch(table, 'TRUE')} WHERE last_seen = $old "
            f"AND (SELECT count(*) FROM {table} WHERE last_seen = $old) = $n",
            {"new": new, "old": old, "n": n},
        ).fetchone()[0]
        return updated == n

    def _join_last_seen(self, table: str, extend: dict[tuple, datetime]) -> None:
        """The general way of _extend_last_seen: an UPDATE joined with the rows on the key columns."""
        keys = _INTERVAL_TABLES[table][0]
        columns = list(zip(*extend))  # the identities, column by column
        staged = pa.table({**{k: columns[i] for i, k in enumerate(keys)}, "ts": list(extend.values())})
        match = " AND ".join(f"t.{k} = rows.{k}" for k in keys)
        self._run_staged(staged, f"UPDATE {table} AS t SET last_seen = greatest(t.last_seen, rows.ts)"
                                 f"{_touch(table, 'rows.ts > t.last_seen', 't.')} FROM rows WHERE {match}")

    def _mirror(self, table: str) -> _Mirror:
        """The table's rows seen lately (within MIRROR_KEEP_HOURS of the newest)."""
        mirror = self._mirrors.get(table)
        if mirror is None or len(mirror.rows) > MIRROR_MAX_ROWS:
            keys, attrs = _INTERVAL_TABLES[table]
            rows = self.db.execute(
                f"SELECT {', '.join(keys + attrs)}, first_seen, last_seen FROM {table} "
                f"WHERE last_seen >= (SELECT max(last_seen) FROM {table}) - INTERVAL {MIRROR_KEEP_HOURS} HOUR"
            ).fetchall()
            mirror = self._mirrors[table] = _Mirror()
            self._fill_mirror(table, rows)
        return mirror

    def _refresh_mirror(self, table: str, obs: list[dict[str, Any]]) -> None:
        keys, attrs = _INTERVAL_TABLES[table]
        staged = pa.Table.from_pylist([{k: o.get(k) for k in keys} for o in obs])
        self.db.register("rows", staged)
        try:
            rows = self.db.execute(
                f"SELECT {', '.join(f't.{c}' for c in keys + attrs)}, t.first_seen, t.last_seen FROM {table} AS t "
                f"SEMI JOIN rows ON {' AND '.join(f't.{k} = rows.{k}' if k != 'gpu_instance' else 't.gpu_instance = coalesce(rows.gpu_instance, -1)' for k in keys)}"
            ).fetchall()
        finally:
            self.db.unregister("rows")
        self._fill_mirror(table, rows)

    def _fill_mirror(self, table: str, rows: list[tuple]) -> None:
        nk = len(_INTERVAL_TABLES[table][0])
        mirror = self._mirrors.setdefault(table, _Mirror())
        for r in rows:
            ident, key = r[:-2], r[:nk]
            old = mirror.by_key.get(key)
            if old is not None and old != ident:
                del mirror.rows[old]  # the row's attributes changed
            mirror.by_key[key] = ident
            mirror.rows[ident] = [r[-2], r[-1]]

    def _upsert_throughput(self, obs: list[dict[str, Any]]) -> None:
        """Fold job-reported FLOP/s into hourly rows: a running mean of the hour's reports, with
        their count, so the table grows by one row per job, host and hour, not per scrape."""
        if not obs:
            return
        self._run_staged(
            pa.Table.from_pylist(obs, schema=_THROUGHPUT_OBS),
            """INSERT INTO job_throughput
               SELECT date_trunc('hour', ts) AS hour, cluster, scheduler, job_key, host, count(*), avg(flops),
                      arg_max(gpus, ts) FILTER (WHERE gpus IS NOT NULL), arg_max(basis, ts)
               FROM rows GROUP BY hour, cluster, scheduler, job_key, host
               ON CONFLICT (cluster, scheduler, job_key, host, ts) DO UPDATE SET
                 flops = (job_throughput.flops * job_throughput.reports + excluded.flops * excluded.reports)
                         / (job_throughput.reports + excluded.reports),
                 reports = job_throughput.reports + excluded.reports,
                 gpus = coalesce(excluded.gpus, job_throughput.gpus), basis = coalesce(excluded.basis, job_throughput.basis)"""
        )
        self._dirty_tables.add("job_throughput")

    def _upsert_checkpoints(self, obs: list[dict[str, Any]]) -> None:
        """Keep each checkpoint a job reported once (schema.JOB_CHECKPOINTS_DDL): its first sighting,
        and its duration as soon as one is known (a known one is never replaced by NULL)."""
        if not obs:
            return
        self._run_staged(
            pa.Table.from_pylist(obs, schema=_CHECKPOINT_OBS),
            """INSERT INTO job_checkpoints
               SELECT cluster, scheduler, job_key, saved_at, arg_max(duration_s, seen) FILTER (WHERE duration_s IS NOT NULL), min(seen)
               FROM rows GROUP BY cluster, scheduler, job_key, saved_at
               ON CONFLICT (cluster, scheduler, job_key, saved_at) DO UPDATE SET
                 duration_s = coalesce(excluded.duration_s, job_checkpoints.duration_s),
                 first_seen = least(excluded.first_seen, job_checkpoints.first_seen)"""
        )
        self._dirty_tables.add("job_checkpoints")

    def _upsert_shares(self, obs: list[dict[str, Any]]) -> None:
        """Fold shared GPUs' split into hourly rows per GPU and job (schema.GPU_JOB_SHARES_DDL): every
        row of a GPU-hour counts the GPU's shared scrapes, the job's own rows its reports, SM sum
        and memory high-water (NULL stays NULL until a value is known). A batch holds whole scrapes
        (a scrape round, a TSDB window): a GPU's scrape split across two batches would count twice."""
        if not obs:
            return
        gpu_hour = "cluster, host, gpu_uuid, gpu_instance, date_trunc('hour', ts)"
        self.db.register("share_rows", pa.Table.from_pylist(obs, schema=_SHARE_OBS))
        try:
            self.db.execute(f"""CREATE OR REPLACE TEMP TABLE share_scrapes AS
                SELECT s.*, coalesce(prior.n, 0) AS prior
                FROM (SELECT {gpu_hour} AS hour, count(DISTINCT ts)::INTEGER AS n FROM share_rows GROUP BY ALL) s
                LEFT JOIN (SELECT cluster, host, gpu_uuid, gpu_instance, ts AS hour, max(shared_scrapes) AS n
                           FROM gpu_job_shares WHERE ts IN (SELECT date_trunc('hour', ts) FROM share_rows)  -- the batch's hours only
                           GROUP BY ALL) prior USING (cluster, host, gpu_uuid, gpu_instance, hour)""")
            self.db.execute("""UPDATE gpu_job_shares g SET shared_scrapes = g.shared_scrapes + s.n FROM share_scrapes s
                WHERE (g.cluster, g.host, g.gpu_uuid, g.gpu_instance, g.ts) = (s.cluster, s.host, s.gpu_uuid, s.gpu_instance, s.hour)""")
            self.db.execute(f"""INSERT INTO gpu_job_shares
                SELECT date_trunc('hour', r.ts) AS hour, r.cluster, r.host, r.gpu_uuid, r.gpu_instance, scheduler, job_key,
                       any_value(s.prior + s.n), count(*), count(sm_ratio), sum(sm_ratio), max(memory_bytes)
                FROM share_rows r JOIN share_scrapes s ON (r.cluster, r.host, r.gpu_uuid, r.gpu_instance, date_trunc('hour', r.ts))
                                                          = (s.cluster, s.host, s.gpu_uuid, s.gpu_instance, s.hour)
                GROUP BY ALL
                ON CONFLICT (cluster, host, gpu_uuid, gpu_instance, scheduler, job_key, ts) DO UPDATE SET
                  reports = gpu_job_shares.reports + excluded.reports,
                  sm_reports = gpu_job_shares.sm_reports + excluded.sm_reports,
                  sm_sum = CASE WHEN excluded.sm_sum IS NULL THEN gpu_job_shares.sm_sum
                                ELSE coalesce(gpu_job_shares.sm_sum, 0) + excluded.sm_sum END,
                  memory_max_bytes = greatest(gpu_job_shares.memory_max_bytes, excluded.memory_max_bytes)""")
        finally:
            self.db.unregister("share_rows")
            self.db.execute("DROP TABLE IF EXISTS share_scrapes")
        self._dirty_tables.add("gpu_job_shares")

    def _upsert_allocations(self, obs: list[dict[str, Any]]) -> None:
        if not obs:
            return
        staged = pa.Table.from_pylist(obs)
        self._run_staged(
            staged,
            f"""INSERT INTO allocations (cluster, scheduler, job_key, host, gpu_uuid, gpu_instance, gpu, first_seen, last_seen, source)
               SELECT cluster, scheduler, job_key, host, gpu_uuid, coalesce(gpu_instance, -1), any_value(gpu),
                      min(ts), max(ts), any_value(source)
               FROM rows GROUP BY cluster, scheduler, job_key, host, gpu_uuid, coalesce(gpu_instance, -1)
               ON CONFLICT (cluster, scheduler, job_key, host, gpu_uuid, gpu_instance) DO UPDATE SET
                 first_seen = least(allocations.first_seen, excluded.first_seen),
                 last_seen = greatest(allocations.last_seen, excluded.last_seen),
                 gpu = coalesce(excluded.gpu, allocations.gpu),
                 {SEG} = CASE WHEN excluded.first_seen < allocations.first_seen OR excluded.last_seen > allocations.last_seen
                                   OR coalesce(excluded.gpu, allocations.gpu) IS DISTINCT FROM allocations.gpu
                              THEN -abs(allocations.{SEG}) ELSE allocations.{SEG} END"""
        )
        self._dirty_tables.add("allocations")

    def _upsert_gpus(self, obs: list[dict[str, Any]]) -> None:
        if not obs:
            return
        staged = pa.Table.from_pylist(obs)
        self._run_staged(
            staged,
            """INSERT INTO gpus
               SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1), any_value(gpu), any_value(mig_profile),
                      any_value(model), max(fb_total_mib), any_value(driver_version), min(ts), max(ts)
               FROM rows GROUP BY cluster, host, gpu_uuid, coalesce(gpu_instance, -1)
               ON CONFLICT (cluster, host, gpu_uuid, gpu_instance) DO UPDATE SET
                 gpu = coalesce(excluded.gpu, gpus.gpu), mig_profile = coalesce(excluded.mig_profile, gpus.mig_profile),
                 model = coalesce(excluded.model, gpus.model), fb_total_mib = coalesce(excluded.fb_total_mib, gpus.fb_total_mib),
                 driver_version = coalesce(excluded.driver_version, gpus.driver_version),
                 first_seen = least(gpus.first_seen, excluded.first_seen),
                 last_seen = greatest(gpus.last_seen, excluded.last_seen)"""
        )
        self._dirty_tables.add("gpus")

    def _run_staged(self, staged: pa.Table, sql: str) -> None:
        """Run `sql` with the Arrow table visible as `rows`."""
        self.db.register("rows", staged)
        try:
            self.db.execute(sql)
        finally:
            self.db.unregister("rows")

    # --- unrecognized input ---

    def note_unrecognized(self, source: str, entries: list[schema.Unrecognized]) -> None:
        """Remember input a source did not recognize, for the manifest (published next): one entry
        per (source, input, kind) with the latest detail, first and last time and a count.
        Entries not seen for UNRECOGNIZED_KEEP go; at most MAX_UNRECOGNIZED, the latest kept."""
        now = self.clock().replace(microsecond=0).isoformat()
        for u in entries:
            key = (source, u.input, u.kind)
            e = self._unrecognized.get(key)
            if e is None:
                e = self._unrecognized[key] = {"source": source, "input": u.input, "kind": u.kind, "first_seen": now, "count": 0}
            e.update(detail=u.detail, last_seen=now, count=int(e.get("count", 0)) + 1)
        if entries:
            self._prune_unrecognized()

    def _prune_unrecognized(self) -> None:
        oldest = (self.clock() - UNRECOGNIZED_KEEP).isoformat()
        keep = sorted((e for e in self._unrecognized.values() if str(e.get("last_seen", "")) >= oldest),
                      key=lambda e: str(e.get("last_seen", "")), reverse=True)[:MAX_UNRECOGNIZED]
        self._unrecognized = {(e["source"], e["input"], e["kind"]): e for e in keep}

    # --- the idle-GPU policy's audit trail ---

    POLICY_AUDIT_COLUMNS = ("ts", "cluster", "scheduler", "job_key", "job_id", "user_name", "account", "action", "rule",
                            "reason", "idle_s", "idle_gpus", "enforce", "result", "detail", "attempt")

    def record_policy(self, rows: list[dict[str, Any]]) -> int:
        """Append policy audit rows (POLICY_AUDIT_COLUMNS) in one transaction; publish() makes
        them visible to readers. Returns rows written."""
        if not rows:
            return 0
        cols = self.POLICY_AUDIT_COLUMNS
        values = [[r.get(c) for c in cols] for r in rows]
        self.db.execute("BEGIN")
        try:
            self.db.executemany(f"INSERT INTO policy_audit ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", values)
            self.db.execute("COMMIT")
        except Exception:
            self.db.execute("ROLLBACK")
            raise
        self._dirty_tables.add("policy_audit")
        return len(rows)

    # --- publishing ---

    def _manifest(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}

    @contextmanager
    def parallel(self) -> Iterator[None]:
        """Let DuckDB use every core for the statements inside (compaction's sorts and scans)."""
        self.db.execute("RESET threads")
        try:
            yield
        finally:
            self.db.execute("SET threads = 1")

    def invalidate(self) -> None:
        """Forget what the writer caches of the ledger and retired files: call after
        changing those tables directly (compaction and retention do), before publish()."""
        self._sample_files = None
        self._segments = None
        self._cleanup_due = None
        self._mirrors.clear()

    def publish(self) -> None:
        """Snapshot changed tables and atomically replace the manifest readers go by.

        A segmented table's snapshot holds its open part only: the rows in no segment, and the
        rows changed since their segment was written (which override it, see open_reader). Both
        are found through the segment column's zone maps, so the cost follows the open rows, not
        the history.
        """
        self._publish_seq += 1
        seq = self._publish_seq
        now = self.clock()
        segments = self._live_segments()
        for name in sorted(self._dirty_tables):
            if name in SEGMENTED:
                arrow = self.db.sql(f"SELECT * EXCLUDE ({SEG}) FROM {name} WHERE {SEG} IS NULL OR {SEG} < 0").to_arrow_table()
                overridden = {r[0] for r in self.db.execute(f"SELECT DISTINCT -{SEG} FROM {name} WHERE {SEG} < 0").fetchall()}
                files = self._segment_files(name)
                self._superseded[name] = [files[i] for i in sorted(overridden)]
            else:
                arrow = self.db.sql(f"SELECT * FROM {name}").to_arrow_table()
            path = self.root / "tables" / f"{name}-{seq:09d}.parquet"
            write_parquet(arrow, path)
            if name in self._tables:
                self._retired_snapshots.append((self._tables[name], now))
            self._tables[name] = str(path.relative_to(self.root))
        self._dirty_tables.clear()
        if self._sample_files is None:
            self._sample_files = {f: (t0, t1) for f, t0, t1 in self.db.execute(SAMPLE_FILE_SPANS).fetchall()}
        manifest = {
            "version": seq,
            "schema_version": self._schema_version,
            "published_at": self.clock().isoformat(),
            "samples": sorted(self._sample_files),
            "sample_spans": {f: list(span) for f, span in sorted(self._sample_files.items())},
            "tables": self._tables,
            "facts": sorted(self.facts.values(), key=itemgetter("grain", "bucket")),
            # segmented tables: their immutable segments, and those the open part overrides rows of
            "segments": segments,
            "superseded": {k: v for k, v in self._superseded.items() if v},
            "unrecognized": sorted(self._unrecognized.values(), key=lambda e: str(e.get("last_seen", "")), reverse=True),
        }
        _fsync_write(self.root / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest, separators=(",", ":"))))
        self._delete_retired()

    def _live_segments(self) -> dict[str, list[str]]:
        """Segmented table -> its live segment files, oldest first (from the ledger, cached)."""
        if self._segments is None:
            self._segment_ids = {name: {} for name in SEGMENTED}
            for sid, table, rel in self.db.execute("SELECT id, tbl, file FROM segments ORDER BY id").fetchall():
                self._segment_ids[table][sid] = rel
            self._segments = {name: list(ids.values()) for name, ids in self._segment_ids.items()}
        return self._segments

    def _segment_files(self, name: str) -> dict[int, str]:
        self._live_segments()
        return self._segment_ids[name]

    def _delete_retired(self) -> None:
        now = self.clock()
        cutoff = now - RETIRE_GRACE
        live = None
        while self._retired_snapshots and self._retired_snapshots[0][1] < cutoff:
            rel = self._retired_snapshots.pop(0)[0]
            live = self._live_files() if live is None else live
            if rel not in live:  # the name written again since (after a crash): it is live now
                (self.root / rel).unlink(missing_ok=True)
        if self._cleanup_due is not None and now <= self._cleanup_due:
            return  # nothing in retired_files has passed its grace period yet: no query
        for (rel,) in self.db.execute("SELECT file FROM retired_files WHERE retired_at < ?", [cutoff]).fetchall():
            (self.root / rel).unlink(missing_ok=True)
        self.db.execute("DELETE FROM retired_files WHERE retired_at < ?", [cutoff])
        oldest = self.db.execute("SELECT min(retired_at) FROM retired_files").fetchone()[0]
        self._cleanup_due = oldest + RETIRE_GRACE if oldest is not None else datetime.max

    # --- segments ---

    def settle(self, now: datetime) -> int:
        """Write the rows settled by `now` (see SEGMENTED) into new segments, and consolidate:
        merge segments so they stay few (each at least MERGE_RATIO times the next newer), and
        rewrite those whose settled corrections pile up. Returns rows written to segment files.

        Each segment file is written before the ledger commit that names it (a crash in between
        leaves a file no one names, swept at the next start); the files it replaces are retired,
        so a reader on an older manifest still reads them for the grace period. Callers publish().
        """
        horizon = now - SETTLE_AFTER
        written = 0
        for name in SEGMENTED:
            written += self._rewrite(name, [], horizon)
            while True:  # a rewritten group takes the newest id, after segments it was older than: again until none moves
                before = self._segment_rows(name)
                written += self._consolidate(name, horizon)
                if self._segment_rows(name) == before:
                    break
        return written

    def _segment_rows(self, name: str) -> list[tuple[int, int]]:
        """(id, rows) of each segment of `name`, oldest first."""
        return self.db.execute("SELECT id, rows FROM segments WHERE tbl = ? ORDER BY id", [name]).fetchall()

    def _settled(self, name: str) -> str:
        return SEGMENTED[name][1]

    def _consolidate(self, name: str, horizon: datetime) -> int:
        segs = self._segment_rows(name)
        corrections = dict(self.db.execute(
            f"SELECT -{SEG}, count(*) FROM {name} WHERE {SEG} < 0 AND {self._settled(name)} GROUP BY 1", {"h": horizon}).fetchall())
        groups: list[tuple[list[int], int]] = []  # oldest first: ([segment ids], rows)
        for sid, rows in segs:
            groups.append(([sid], rows))
            while len(groups) > 1 and groups[-2][1] <= MERGE_RATIO * groups[-1][1]:
                ids, rows = groups.pop()
                groups[-1] = (groups[-1][0] + ids, groups[-1][1] + rows)
        many = sum(corrections.values()) > CORRECTIONS_MAX
        written = 0
        for ids, rows in groups:
            fixes = sum(corrections.get(i, 0) for i in ids)
            if len(ids) > 1 or (fixes and (many or fixes * FOLD_RATIO >= rows)):
                written += self._rewrite(name, ids, horizon)
        return written

    def _rewrite(self, name: str, ids: list[int], horizon: datetime) -> int:
        """One new segment of `name`: its rows not in any segment and settled (ids empty), or the
        rows of segments `ids`, with their corrections folded in (those settled; the others go
        back to the open part), replacing them. Returns the rows written."""
        if ids:
            pick = f"list_contains($ids, abs({SEG})) AND ({SEG} > 0 OR {self._settled(name)})"
            params = {"ids": ids, "h": horizon}
        else:
            pick = f"{SEG} IS NULL AND {self._settled(name)}"
            params = {"h": horizon}
        now = self.clock()
        sid = self._next_segment_id()
        rel = f"tables/{name}-segment-{sid:09d}.parquet"
        old = self.db.execute("SELECT file FROM segments WHERE list_contains(?, id)", [ids]).fetchall() if ids else []
        self.db.execute("BEGIN")
        try:
            arrow = self.db.sql(f"SELECT * EXCLUDE ({SEG}) FROM {name} WHERE {pick}", params=params).to_arrow_table()
            if arrow.num_rows:
                write_parquet(arrow, self.root / rel)
                marked = self.db.execute(f"UPDATE {name} SET {SEG} = $sid WHERE {pick}", {**params, "sid": sid}).fetchone()[0]
                if marked != arrow.num_rows:
                    raise StoreError(f"segment {rel}: {arrow.num_rows} rows written, {marked} marked")
                self.db.execute("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?)", [sid, name, rel, arrow.num_rows, self._schema_version, now])
            if ids:  # what is left of them: corrections not settled, open again
                self.db.execute(f"UPDATE {name} SET {SEG} = NULL WHERE list_contains(?, abs({SEG}))", [ids])
                self.db.execute("DELETE FROM segments WHERE list_contains(?, id)", [ids])
                for (f,) in old:
                    self.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [f, now])
            self.db.execute("COMMIT")
        except Exception:
            self.db.execute("ROLLBACK")
            (self.root / rel).unlink(missing_ok=True)
            raise
        if arrow.num_rows or ids:
            self._dirty_tables.add(name)
            self._segments = None
            self._cleanup_due = None  # retired_files has new rows
            log.info("%s: segment %s, %d rows%s", name, rel if arrow.num_rows else "(none)", arrow.num_rows,
                     f", replacing {len(ids)} segments" if ids else "")
        return arrow.num_rows

    def _next_segment_id(self) -> int:
        """Above every id the ledger or a file in tables/ has: a name is never used twice."""
        top = self.db.execute("SELECT coalesce(max(id), 0) FROM segments").fetchone()[0]
        for path in (self.root / "tables").glob("*-segment-*.parquet"):
            m = re.search(r"-segment-(\d+)\.parquet$", path.name)
            if m:
                top = max(top, int(m.group(1)))
        return top + 1

    def close(self) -> None:
        self.db.close()


# One job-reported throughput observation (gpufleet.collector.exposition_parse emits them).
_THROUGHPUT_OBS = pa.schema([
    ("ts", pa.timestamp("ms")), ("cluster", pa.string()), ("scheduler", pa.string()), ("job_key", pa.string()),
    ("host", pa.string()), ("flops", pa.float64()), ("gpus", pa.int32()), ("basis", pa.string()),
])

# One checkpoint observation (gpufleet.collector.exposition_parse emits them).
_CHECKPOINT_OBS = pa.schema([
    ("seen", pa.timestamp("ms")), ("cluster", pa.string()), ("scheduler", pa.string()), ("job_key", pa.string()),
    ("saved_at", pa.timestamp("ms")), ("duration_s", pa.float64()),
])

# One share observation of a shared GPU (gpufleet.collector.exposition_parse emits them).
_SHARE_OBS = pa.schema([
    ("ts", pa.timestamp("ms")), ("cluster", pa.string()), ("host", pa.string()), ("gpu_uuid", pa.string()),
    ("gpu_instance", pa.int16()), ("scheduler", pa.string()), ("job_key", pa.string()), ("sm_ratio", pa.float64()),
    ("memory_bytes", pa.float64()),
])

# Interval tables widened by observations: (key columns, attribute columns). An observation's
# non-null attribute replaces the stored one; first_seen/last_seen widen to cover it.
_INTERVAL_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpus": (("cluster", "host", "gpu_uuid", "gpu_instance"), ("gpu", "mig_profile", "model", "fb_total_mib", "driver_version")),
    "allocations": (("cluster", "scheduler", "job_key", "host", "gpu_uuid", "gpu_instance"), ("gpu",)),
}
# An observation's identity as the mirror knows its row: key columns, then attribute columns.
_IDENTITY = {name: itemgetter(*keys, *attrs) for name, (keys, attrs) in _INTERVAL_TABLES.items()}
MIRROR_KEEP_HOURS = 48  # rows last seen this long before the newest are left out of the mirror
MIRROR_MAX_ROWS = 500_000  # beyond this the mirror is reloaded (and so pruned to the recent rows)
MAX_SHORTCUT_GROUPS = 4  # _extend_last_seen: more (old, new) last_seen pairs than this go straight to the join


def _touch(table: str, changed: str, prefix: str = "") -> str:
    """The SET clause tail that marks a segmented table's row changed (when `changed`): its segment,
    if it has one, now holds an older version (see publish). Nothing for other tables."""
    if table not in SEGMENTED:
        return ""
    col = f"{prefix}{SEG}"
    return f", {SEG} = -abs({col})" if changed == "TRUE" else f", {SEG} = CASE WHEN {changed} THEN -abs({col}) ELSE {col} END"


def _row_key(ident: tuple | None, nk: int) -> tuple | None:
    """The table key of an observation's identity (gpu_instance, the last key column: None is -1)."""
    if ident is None:
        return None
    key = ident[:nk]
    return key if key[-1] is not None else key[:-1] + (-1,)


class _Mirror:
    """Recent rows of an interval table: identity (key + attributes) -> [first_seen, last_seen]."""

    __slots__ = ("rows", "by_key")

    def __init__(self) -> None:
        self.rows: dict[tuple, list[datetime]] = {}
        self.by_key: dict[tuple, tuple] = {}  # key -> its row's current identity


_JOB_TYPES = {
    "het_job_offset": "INTEGER", "gpus": "INTEGER", "node_count": "INTEGER",
    "submit": "TIMESTAMP", "eligible": "TIMESTAMP", "start": "TIMESTAMP", "end": "TIMESTAMP", "updated_at": "TIMESTAMP",
}
_JOB_TYPES = {c: _JOB_TYPES.get(c, "VARCHAR") for c in schema.JOB_COLUMNS}
_ARROW_JOB_TYPES = {"het_job_offset": pa.int32(), "gpus": pa.int32(), "node_count": pa.int32(),
                    **{c: pa.timestamp("us") for c in ("submit", "eligible", "start", "end", "updated_at")}}

# How a stored job row (jobs) and a newly read one (excluded) make one, column by column, for
# every source and in any order:
# - the GPU count (gpus, gpu_type, gpus_source) goes by authority (schema.GPUS_SOURCES): a known
#   count is never replaced by an unknown one, and of two known counts the higher rank wins (the
#   newer on a tie), so the stored count is the most authoritative one ever read;
# - what describes the job (its names, owner, submit time, nodes, TRES) is never replaced by unknown;
# - its lifecycle (eligible, start, end, state, exit code, node count, the source) is the latest
#   read's, whose NULL says "not yet" (a running job has no end; a requeued one starts again).
_JOB_DESCRIPTION = frozenset({"job_id", "array_job_id", "array_task_id", "het_job_id", "het_job_offset", "name",
                              "user_name", "account", "partition", "qos", "submit", "nodes", "alloc_tres"})
_RANK_NEW, _RANK_OLD = schema.GPUS_RANK.format(col="excluded.gpus_source"), schema.GPUS_RANK.format(col="jobs.gpus_source")
_TAKE_NEW_GPUS = f"(excluded.gpus IS NOT NULL AND (jobs.gpus IS NULL OR {_RANK_NEW} >= {_RANK_OLD}))"


def _job_merge(c: str) -> str:
    """JOB_MERGE's SQL for column `c` of an ON CONFLICT update of jobs (see above)."""
    if c in ("gpus", "gpus_source"):
        return f'CASE WHEN {_TAKE_NEW_GPUS} THEN excluded."{c}" ELSE jobs."{c}" END'
    if c == "gpu_type":
        return f"CASE WHEN {_TAKE_NEW_GPUS} THEN coalesce(excluded.gpu_type, jobs.gpu_type) ELSE coalesce(jobs.gpu_type, excluded.gpu_type) END"
    if c in _JOB_DESCRIPTION:
        return f'coalesce(excluded."{c}", jobs."{c}")'
    return f'excluded."{c}"'


def _gpus_rank(source: str | None) -> int:
    return schema.GPUS_SOURCES.get(source or "", 0)


# Attempts (schema.JOB_ATTEMPTS_DDL) from {source}, a relation of ATTEMPT_COLUMNS: one row per
# job and start; what a row knows is kept, what it did not know is filled (an end, a state after
# RUNNING, an exit code). Lifecycle columns are the newer read's where it has them.
_ATTEMPT_COLS = ", ".join(f'"{c}"' for c in schema.ATTEMPT_COLUMNS)
_UPSERT_ATTEMPTS = (f"INSERT INTO job_attempts ({_ATTEMPT_COLS}) SELECT {_ATTEMPT_COLS} FROM {{source}} "
                    "ON CONFLICT (cluster, scheduler, job_key, start) DO UPDATE SET "
                    + ", ".join(f'"{c}" = coalesce(excluded."{c}", job_attempts."{c}")'
                                for c in schema.ATTEMPT_COLUMNS if c not in ("cluster", "scheduler", "job_key", "start")))
_ATTEMPT_OBS = pa.schema([(c, _ARROW_JOB_TYPES.get(c, pa.string())) for c in schema.ATTEMPT_COLUMNS])
# {a} is an earlier attempt of {b}'s job: both started, {a} first
_STARTED_BEFORE = ("{a}.cluster = {b}.cluster AND {a}.scheduler = {b}.scheduler AND {a}.job_key = {b}.job_key "
                   "AND {a}.start IS NOT NULL AND {b}.start IS NOT NULL AND {a}.start < {b}.start")
# Before the staged job rows (`rows`) merge into jobs: a stored record that a row with a later start
# supersedes (the job was requeued or restarted; its listing showed the new record only), and a
# row older than the stored record (a listing of an earlier window with --duplicates), are
# earlier attempts of their job
_SUPERSEDED_ATTEMPTS = _UPSERT_ATTEMPTS.format(source=f"""(
    SELECT {", ".join(f'j."{c}"' for c in schema.ATTEMPT_COLUMNS)} FROM jobs j SEMI JOIN rows r ON {_STARTED_BEFORE.format(a="j", b="r")}
    UNION ALL
    SELECT {", ".join(f'r."{c}"' for c in schema.ATTEMPT_COLUMNS)} FROM rows r SEMI JOIN jobs j ON {_STARTED_BEFORE.format(a="r", b="j")})""")

# how many staged rows (`rows`) start otherwise than their job's stored record (both started)
_RESTARTED_ROWS = ("SELECT count(*) FROM rows r JOIN jobs j USING (cluster, scheduler, job_key) "
                   "WHERE r.start IS NOT NULL AND j.start IS NOT NULL AND r.start <> j.start")

# staged rows (`rows`) whose known GPU count differs from the stored known one
_GPU_DISAGREEMENTS = """SELECT r.cluster, j.job_id, j.gpus, j.gpus_source, r.gpus, r.gpus_source
FROM rows r JOIN jobs j USING (cluster, scheduler, job_key)
WHERE r.gpus IS NOT NULL AND j.gpus IS NOT NULL AND r.gpus <> j.gpus AND r.gpus_source IS DISTINCT FROM j.gpus_source"""

# Slurm jobs by where their GPU count came from when accounting did not give it (job_gpus_fallbacks);
# every cluster with Slurm jobs has a row (source NULL) so its gauges exist at 0
_JOB_GPUS_FALLBACKS = """SELECT cluster, CASE WHEN gpus IS NULL THEN 'unknown' ELSE gpus_source END AS s, count(*)::INTEGER
FROM jobs WHERE scheduler = 'slurm' AND (gpus IS NULL OR ("end" IS NOT NULL AND gpus_source IN ('slurmctld', 'job_map')))
GROUP BY ALL
UNION ALL SELECT DISTINCT cluster, NULL, 0 FROM jobs WHERE scheduler = 'slurm'"""

# The last resort for a job's GPU count: the GPUs (and MIG instances) the exporters' job mapping
# saw it hold, for the jobs of {keys} whose count no scheduler source knows (or only the mapping)
_FILL_GPUS_FROM_JOB_MAP = f"""UPDATE jobs SET gpus = m.n, gpus_source = 'job_map', updated_at = greatest(jobs.updated_at, m.seen), {SEG} = -abs({SEG})
FROM (SELECT a.cluster, a.scheduler, a.job_key, count(*)::INTEGER AS n, max(a.last_seen) AS seen
      FROM allocations a SEMI JOIN ({{keys}}) k ON k.cluster = a.cluster AND k.scheduler = a.scheduler AND k.job_key = a.job_key
      GROUP BY ALL) m
WHERE jobs.cluster = m.cluster AND jobs.scheduler = m.scheduler AND jobs.job_key = m.job_key
  AND (jobs.gpus IS NULL OR jobs.gpus_source = 'job_map') AND jobs.gpus IS DISTINCT FROM m.n"""


def read_manifests(root: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, manifest) of each part of the store: the store itself, or each of its shards
    (gpufleet.collector.shard), whose union is the store. StoreError when there is none."""
    root = Path(root)
    own = root / MANIFEST
    shards = sorted((root / SHARDS_DIR).glob(f"*/{MANIFEST}"))
    if own.exists() and shards:
        raise StoreError(f"store {root} holds both a single collector's {MANIFEST} and shards ({root / SHARDS_DIR}): "
                         "a store is written by one collector or by shards; move one of them to a store of its own")
    out = []
    for path in shards or [own]:
        try:
            manifest = json.loads(path.read_text())
        except FileNotFoundError:
            if shards:
                continue  # a shard that has not published yet
            raise NoStoreError(f"no store at {root}: expected a directory written by `gpufleet collect` (manifest.json missing)") from None
        except ValueError as e:
            raise StoreError(f"store {root}: {path} is not a manifest: {e}") from None
        if manifest.get("schema_version", 0) > schema.SCHEMA_VERSION:
            raise StoreError(f"store {path.parent} has schema version {manifest['schema_version']}, newer than this gpufleet's: upgrade gpufleet")
        out.append((path.parent, manifest))
    if not out:
        raise StoreError(f"no store at {root}: no shard has published yet ({root / SHARDS_DIR}/*/{MANIFEST} missing)")
    return out


def store_version(root: str | Path) -> int | None:
    """A number that grows with every publish of any part of the store (None: no store yet).
    Cheap: one small file per shard. Readers key their caches by it."""
    try:
        return sum(int(m.get("version", 0)) for _, m in read_manifests(root))
    except (StoreError, TypeError, ValueError):
        return None


def _reader_config() -> dict[str, int | str]:
    config: dict[str, int | str] = {"checkpoint_threshold": READER_CHECKPOINT_THRESHOLD}
    threads = os.environ.get(READER_THREADS_ENV, "").strip()
    if not threads:
        return config
    if not threads.isdigit() or int(threads) < 1:
        raise ValueError(f"{READER_THREADS_ENV}={threads!r}: expected a whole number of threads, 1 or more (unset: one per core)")
    return {**config, "threads": int(threads)}


def open_reader(root: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with views over the store's current manifest (the union of its shards'
    when sharded): never locks a writer.

    Views: gpu_samples, jobs, allocations, gpus and the facts' (fact_parts, fact_files); the table
    sample_files (each sample file's date partition and first and last sample). An empty store, or one
    whose first hour is not compacted yet, gives empty ones (same columns), never a missing view.
    """
    parts = read_manifests(root)
    con = duckdb.connect(":memory:", config=_reader_config())
    files = [str(d / f) for d, m in parts for f in m.get("samples", [])]
    plain = bool(files) and _full_sample_schema(con, files)
    if files:
        con.execute(f"CREATE VIEW gpu_samples AS SELECT * FROM {sample_source(con, files, plain)}")
    else:
        _empty_table(con, "gpu_samples", schema.SAMPLE_SCHEMA)
    # each sample file by its date partition and its samples' first and last time (the manifest's
    # sample_spans; None where it has none): where raw samples can be, without reading them
    spans = [tuple(m.get("sample_spans", {}).get(f) or (None, None)) for _, m in parts for f in m.get("samples", [])]
    _table_of_lists(con, "sample_files", {"day": ("DATE", [Path(f).parent.name.removeprefix("date=") for f in files]),
                                          "file": ("VARCHAR", files), "plain": ("BOOLEAN", [plain] * len(files)),
                                          "t0": ("BIGINT", [t0 for t0, _ in spans]), "t1": ("BIGINT", [t1 for _, t1 in spans])})
    _fact_views(con, parts)
    for name, ddl in schema.TABLES.items():
        views = [_table_view(d, m, name, m["tables"][name]) for d, m in parts if m.get("tables", {}).get(name)]
        if len(views) > 1 and name == "jobs":
            # shards: the accounting shard alone writes jobs, but after accounting moved to
            # another shard the former one still holds a job's older version: the latest wins.
            # (Interval tables need no such rule: a GPU reports to one shard at a time.)
            union = " UNION ALL BY NAME ".join(f"({v})" for v in views)
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM ({union}) QUALIFY row_number() OVER "
                        f"(PARTITION BY {', '.join(SEGMENTED[name][0])} ORDER BY updated_at DESC) = 1")
        elif views:
            con.execute(f"CREATE VIEW {name} AS " + " UNION ALL BY NAME ".join(f"({v})" for v in views))
        else:
            con.execute(ddl.replace("IF NOT EXISTS ", ""))
    return con


def _retired_tier_files(root: Path) -> list[str]:
    """The files of the derived tiers the facts replaced (schema.MIGRATIONS[11]): everything under
    summaries/ - per-GPU summaries, their joined segments, run facts and health day files, a
    rebuild's parts - relative to the store's root, for retired_files."""
    return sorted(str(p.relative_to(root)) for p in (root / "summaries").rglob("*") if p.is_file())


def _table_of_lists(con: duckdb.DuckDBPyConnection, name: str, columns: dict[str, tuple[str, list[Any]]]) -> None:
    """A table `name` of the columns given as (DuckDB type, Python values), built by DuckDB from
    bound lists: a reader's first Arrow array built from Python values makes pyarrow import pandas
    (0.15 s of every `gpufleet analyze` run), and a few hundred rows need no Arrow."""
    con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {t}' for c, (t, _) in columns.items())})")
    if any(values for _, values in columns.values()):
        picks = ", ".join(f"unnest(${i}::{t}[])" for i, (t, _) in enumerate(columns.values(), 1))
        con.execute(f"INSERT INTO {name} SELECT {picks}", [values for _, values in columns.values()])


def _fact_views(con: duckdb.DuckDBPyConnection, parts: list[tuple[Path, dict[str, Any]]]) -> None:
    """fact_parts (the facts files the manifest lists, gpufleet.collector.facts) and fact_files (a
    row per hour of 5-minute facts, grain_s 300, hour_parts where its file holds the hour's hour
    parts too, and per day of hour and day facts, grain_s 86400, with the parameters' tag and its
    file's path): what analytics.facts tiles a window
    with, and the files a read of some buckets opens (every file's footer costs). Sharded stores:
    none yet (each shard's facts are its own GPUs'), so their windows are cut from raw samples."""
    from gpufleet.collector import facts

    # (files of an older format - fewer columns - stay listed until upkeep writes them again: their
    # buckets are read raw meanwhile, as the parts of other parameters are)
    entries = [(d, e) for d, m in parts for e in m.get("facts", [])
               if e.get("format") == (facts.OPEN_FORMAT if "upto" in e else facts.FORMAT_VERSION)] if len(parts) == 1 else []
    # (an open hour's files of its settled buckets - "upto" - never beside the hour's own file)
    whole = {(e["bucket"], e["tag"]) for _, e in entries if e["grain"] == "5m" and "upto" not in e}
    entries = [(d, e) for d, e in entries if "upto" not in e or (e["bucket"], e["tag"]) not in whole]
    _table_of_lists(con, "fact_files", {
        "grain_s": ("INTEGER", [facts.GRAIN_5M if e["grain"] == "5m" else facts.GRAIN_1D for _, e in entries]),
        # (an hour's file that holds its hour parts too: written since they are; hour and day files hold them all)
        "hour_parts": ("BOOLEAN", [e["grain"] != "5m" or bool(e.get("hour_parts")) for _, e in entries]),
        "bucket": ("TIMESTAMP", [datetime.fromisoformat(e["bucket"]) for _, e in entries]),
        "tag": ("VARCHAR", [e["tag"] for _, e in entries]), "file": ("VARCHAR", [str(d / e["file"]) for d, e in entries]),
        # an open hour's file: the 5-minute buckets [open_from, open_upto) of it alone (null: the whole hour or day)
        "open_from": ("TIMESTAMP", [datetime.fromisoformat(e["from"]) if "upto" in e else None for _, e in entries]),
        "open_upto": ("TIMESTAMP", [datetime.fromisoformat(e["upto"]) if "upto" in e else None for _, e in entries])})
    if entries:
        con.execute(f"CREATE VIEW fact_parts AS SELECT * FROM read_parquet({_sql_list([str(d / e['file']) for d, e in entries])}, "
                    "hive_partitioning = false)")
    else:
        _empty_table(con, "fact_parts", facts.FILE_SCHEMA)


def _table_view(root: Path, manifest: dict[str, Any], name: str, rel: str) -> str:
    """A table's rows: its snapshot, or for a segmented table the union of its open part and its
    segments, where the open part overrides a segment row of the same key (a correction)."""
    open_part = f"read_parquet('{_sql_str(str(root / rel))}')"
    parts = [f"SELECT * FROM {open_part}"]
    segments = manifest.get("segments", {}).get(name, [])
    superseded = set(manifest.get("superseded", {}).get(name, []))
    clean = [str(root / f) for f in segments if f not in superseded]
    if clean:
        parts.append(f"SELECT * FROM read_parquet({_sql_list(clean)}, union_by_name = true)")
    if superseded:
        keys = SEGMENTED[name][0]
        files = _sql_list([str(root / f) for f in segments if f in superseded])
        parts.append(f"SELECT s.* FROM read_parquet({files}, union_by_name = true) AS s "
                     f"ANTI JOIN {open_part} AS o ON {' AND '.join(f's.{k} = o.{k}' for k in keys)}")
    # by name: a segment written before a column was added reads it as NULL
    return " UNION ALL BY NAME ".join(parts)


def _empty_table(con: duckdb.DuckDBPyConnection, name: str, columns: pa.Schema) -> None:
    """An empty table `name` of these columns, for a reader whose store has no such files yet (same
    columns as the view it stands for, never a missing view); a table, so its cursors see it."""
    con.register("_empty", schema.empty_table(columns))
    try:
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _empty")
    finally:
        con.unregister("_empty")


# each sample file of the ledger with its samples' first and last ts (epoch us): the manifest's sample_spans, upkeep's hours
SAMPLE_FILE_SPANS = ("SELECT file, epoch_us(min(min_ts)), epoch_us(max(max_ts)) FROM batches WHERE file <> '' AND min_ts IS NOT NULL "
                     "GROUP BY file ORDER BY file")
# the sample files of the days [$lo, $hi) touches (epoch us), and whether they read plainly
SAMPLE_FILES_BETWEEN = ("SELECT file, plain FROM sample_files WHERE day >= make_timestamp($lo)::DATE "
                        "AND day <= make_timestamp($hi - 1)::DATE AND (t1 IS NULL OR (t1 >= $lo AND t0 < $hi)) ORDER BY file")


def samples_between(con: duckdb.DuckDBPyConnection, lo_us: int, hi_us: int) -> str:
    """A reader's samples of [lo_us, hi_us) as a table expression over the files of the days it
    touches (date partitions hold their day's samples alone) whose samples' times, where the reader
    knows them (sample_files' t0, t1), meet the range: a read of some minutes. Over the gpu_samples
    view DuckDB opens every file's footer of the store to find them (0.09 s at the demo's 189
    files, growing with the store's age; 0.02 s for a day's), and the newest day holds a file per
    collector round until compaction (0.1 s for the demo's ~300; the last minutes' dozens 0.01-0.03 s).
    Rows outside the range are the caller's WHERE to drop."""
    rows = con.execute(SAMPLE_FILES_BETWEEN, {"lo": lo_us, "hi": hi_us}).fetchall()
    if not rows:
        return "(SELECT * FROM gpu_samples LIMIT 0)"
    # (the store's files all have every column, or these are reconciled as the view's are)
    return sample_source(con, [f for f, _ in rows], plain=rows[0][1])


def sample_source(con: duckdb.DuckDBPyConnection, files: list[str], plain: bool | None = None) -> str:
    """A table expression of these sample files with exactly SAMPLE_SCHEMA's columns, in its order:
    every reader of sample files (the view, compaction, facts) goes through
    it. Files written before a sample column was added (the NVLink rates, foreign processes) read
    it as NULL - union_by_name, or added here when no file has it yet: read plainly, DuckDB takes
    the first file's columns, so a mixed hour would lose the newer files' columns (or fail).
    `plain`: _full_sample_schema(con, files), where the caller knows it."""
    if _full_sample_schema(con, files) if plain is None else plain:
        return f"read_parquet({_sql_list(files)}, hive_partitioning = false)"
    # (slower: only for files of a day written across an upgrade that added a column)
    source = f"read_parquet({_sql_list(files)}, hive_partitioning = false, union_by_name = true)"
    have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    columns = ", ".join(f'"{f.name}"' if f.name in have else f'NULL::{_duck_type(f.type)} AS "{f.name}"' for f in schema.SAMPLE_SCHEMA)
    return f"(SELECT {columns} FROM {source})"


def _full_sample_schema(con: duckdb.DuckDBPyConnection, files: list[str]) -> bool:
    """Whether the sample files of the store's oldest and newest days have every column of
    SAMPLE_SCHEMA: columns are only ever added, so then every file between has them too, and the
    view reads the files plainly. A few footers, not the whole store's, each read once (see below)."""
    by_day: dict[str, list[str]] = {}
    for f in files:
        by_day.setdefault(Path(f).parent.name, []).append(f)
    days = sorted(by_day)
    checked = [f for d in {days[0], days[-1]} for f in by_day[d]]
    with _SAMPLE_FILE_LOCK:
        if len(_SAMPLE_FILE_COLUMNS) > 2 * len(files) + 1000:  # files compaction retired since
            current = set(files)
            for gone in [f for f in _SAMPLE_FILE_COLUMNS if f not in current]:
                del _SAMPLE_FILE_COLUMNS[gone]
        stamps = {f: _stamp(f) for f in checked}
        unread = [f for f in checked if _SAMPLE_FILE_COLUMNS.get(f, (None, False))[0] != stamps[f]]
        if unread:
            want = set(schema.SAMPLE_SCHEMA.names)
            for f, names in _sample_file_columns(con, unread).items():
                _SAMPLE_FILE_COLUMNS[f] = (stamps[f], want <= set(names))
        return all(_SAMPLE_FILE_COLUMNS[f][1] for f in checked)


# file -> ((size, mtime), whether its footer names every SAMPLE_SCHEMA column): a reader is opened
# for each new manifest (the dashboard's pages, after every publish), and a file's footer does not
# change under its name, size and mtime, so each file's is read once per process, not per reader
_SAMPLE_FILE_COLUMNS: dict[str, tuple[tuple[int, int], bool]] = {}
_SAMPLE_FILE_LOCK = threading.Lock()


def _stamp(file: str) -> tuple[int, int]:
    st = os.stat(file)
    return st.st_size, st.st_mtime_ns


def _sample_file_columns(con: duckdb.DuckDBPyConnection, files: list[str]) -> dict[str, list[str]]:
    """Each file's column names, from its footer (DuckDB's, not pyarrow.parquet's: a reader's
    start-up goes without that import and the filesystems and TLS it brings)."""
    got = dict(con.execute("SELECT file_name, list(name) FROM parquet_schema($files) GROUP BY file_name", {"files": files}).fetchall())
    missing = [f for f in files if f not in got]
    if missing:
        raise StoreError(f"sample files {missing[:3]} have no Parquet schema DuckDB could read: expected the store's own files")
    return got


def _duck_type(t: pa.DataType) -> str:
    """DuckDB's name of a sample column's Arrow type (gpufleet.collector.schema.SAMPLE_SCHEMA)."""
    return {pa.float32(): "FLOAT", pa.int64(): "BIGINT", pa.int16(): "SMALLINT", pa.string(): "VARCHAR",
            pa.timestamp("ms"): "TIMESTAMP"}[t]


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _sql_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{_sql_str(i)}'" for i in items) + "]"
