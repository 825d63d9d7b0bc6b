"""The store: one writer (the collector), any number of readers, nothing half-written.

DuckDB refuses a second process on a database file a writer holds, so readers never open the
writer's file. Instead:

- Samples go to date-partitioned Parquet (`samples/date=YYYY-MM-DD/*.parquet`), each file
  written to a temporary name, fsynced, and renamed into place.
- Mutable tables (jobs, allocations, gpus) live in the writer's `state.duckdb` and are
  published as Parquet snapshots.
- `manifest.json` lists the files that make up the store right now; it is replaced atomically
  after every commit. Readers build DuckDB views over exactly those files, so a reader never
  sees a batch that is not fully committed, and files retired by compaction stay readable for a
  grace period so a reader holding an older manifest still works.

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
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collector import schema
from collector.sources.base import Batch

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATE_DB = "state.duckdb"
RETIRE_GRACE = timedelta(minutes=10)


class StoreError(Exception):
    """The store cannot be used (locked by another writer, written by a newer version, ...)."""


@dataclass
class CommitResult:
    samples_written: int = 0
    duplicate: bool = False  # the batch key was already stored with the same rows
    conflict: bool = False  # the batch key was stored with different rows: refused
    jobs_written: int = 0


def _fsync_write(path: Path, write) -> None:
    """Write via a temporary name in the same directory, fsync, then rename: all or nothing."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
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


def write_parquet(table: pa.Table, path: Path) -> None:
    """Parquet tuned for GPU samples: zstd, dictionaries for keys, delta-encoded timestamps."""
    _fsync_write(
        path,
        lambda tmp: pq.write_table(
            table,
            tmp,
            compression="zstd",
            compression_level=3,
            use_dictionary=[c for c in table.column_names if c != "ts"],
            column_encoding={"ts": "DELTA_BINARY_PACKED"} if "ts" in table.column_names else None,
            write_statistics=True,
        ),
    )


class StoreWriter:
    """The single writer. Open it once per process; a second writer gets a clear StoreError."""

    def __init__(self, root: str | Path, *, clock=datetime.utcnow):
        self.root = Path(root)
        self.clock = clock
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "samples").mkdir(exist_ok=True)
        (self.root / "tables").mkdir(exist_ok=True)
        try:
            self.db = duckdb.connect(str(self.root / STATE_DB))
        except duckdb.IOException as e:
            raise StoreError(f"store {self.root} is locked by another writer (only one collector may write a store): {e}") from None
        self._migrate()
        self._dirty_tables: set[str] = set(schema.TABLES)
        self._publish_seq = self._manifest().get("version", 0)
        self._remove_uncommitted_files()
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
                self.db.execute(stmt)
            self.db.execute("INSERT INTO schema_version VALUES (?, ?)", [version, self.clock()])
            self.db.execute("COMMIT")
            log.info("store %s migrated to schema version %d", self.root, version)

    def schema_version(self) -> int:
        return self.db.execute("SELECT max(version) FROM schema_version").fetchone()[0]

    # --- crash recovery ---

    def _remove_uncommitted_files(self) -> None:
        known = {r[0] for r in self.db.execute(
            "SELECT file FROM batches UNION SELECT file FROM retired_files UNION SELECT file FROM rollups").fetchall()}
        for top in ("samples", "rollup_5m"):
            for path in (self.root / top).rglob("*"):
                if path.is_file() and str(path.relative_to(self.root)) not in known:
                    log.warning("removing %s: left by work that was not committed", path.relative_to(self.root))
                    path.unlink()

    # --- watermarks ---

    def watermark(self, name: str) -> str | None:
        row = self.db.execute("SELECT value FROM watermarks WHERE source = ?", [name]).fetchone()
        return row[0] if row else None

    # --- commit ---

    def commit(self, batch: Batch) -> CommitResult:
        result = CommitResult()
        now = self.clock()
        files: list[tuple[str, int, datetime, datetime]] = []
        checksum = ""
        if batch.samples is not None and batch.samples.num_rows:
            samples = batch.samples.cast(schema.SAMPLE_SCHEMA)
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
        try:
            self.db.execute("BEGIN")
            for rel, rows, lo, hi in files:
                self.db.execute(
                    "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [f"{batch.key}#{rel}" if len(files) > 1 else batch.key, rel, rows, checksum, lo, hi, now],
                )
            if len(files) > 1:  # a batch spanning dates: one ledger row per file, plus the key itself
                self.db.execute("INSERT INTO batches VALUES (?, ?, 0, ?, NULL, NULL, ?)", [batch.key, "", checksum, now])
            result.jobs_written = self._upsert_jobs(batch.jobs, now)
            self._upsert_allocations(batch.allocations)
            self._upsert_gpus(batch.gpus)
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
            for rel, *_ in files:
                (self.root / rel).unlink(missing_ok=True)
            raise
        return result

    def _write_sample_files(self, key: str, samples: pa.Table, checksum: str) -> list[tuple[str, int, datetime, datetime]]:
        dates = pc.strftime(samples["ts"], format="%Y-%m-%d")
        out = []
        for date in sorted(set(dates.to_pylist())):
            part = samples.filter(pc.equal(dates, date)) if len(set(dates.to_pylist())) > 1 else samples
            d = self.root / "samples" / f"date={date}"
            d.mkdir(exist_ok=True)
            path = d / f"{_safe(key)}-{checksum[:10]}.parquet"
            write_parquet(part, path)
            lo, hi = pc.min_max(part["ts"]).values()
            out.append((str(path.relative_to(self.root)), part.num_rows, lo.as_py(), hi.as_py()))
        return out

    def _upsert_jobs(self, jobs: list[dict[str, Any]], now: datetime) -> int:
        if not jobs:
            return 0
        cols = schema.JOB_COLUMNS
        staged = pa.Table.from_pylist([{c: j.get(c) for c in cols} for j in jobs])
        quoted = [f'"{c}"' for c in cols]
        key = ("cluster", "scheduler", "job_key")
        changed = " OR ".join(f'jobs."{c}" IS DISTINCT FROM excluded."{c}"' for c in cols if c not in key and c != "updated_at")
        updates = ", ".join(f'"{c}" = excluded."{c}"' for c in cols if c not in key and c != "updated_at")
        self._run_staged(
            staged,
            f"""INSERT INTO jobs ({", ".join(quoted)})
                SELECT {", ".join(f'CAST("{c}" AS {_JOB_TYPES[c]})' for c in cols)} FROM rows
                ON CONFLICT (cluster, scheduler, job_key) DO UPDATE SET {updates},
                  updated_at = CASE WHEN {changed} THEN excluded.updated_at ELSE jobs.updated_at END"""
        )
        self._dirty_tables.add("jobs")
        return len(jobs)

    def _upsert_allocations(self, obs: list[dict[str, Any]]) -> None:
        if not obs:
            return
        staged = pa.Table.from_pylist(obs)
        self._run_staged(
            staged,
            """INSERT INTO allocations
               SELECT cluster, scheduler, job_key, host, gpu_uuid, coalesce(gpu_instance, -1), any_value(gpu),
                      min(ts), max(ts), any_value(source)
               FROM rows GROUP BY cluster, scheduler, job_key, host, gpu_uuid, coalesce(gpu_instance, -1)
               ON CONFLICT (cluster, scheduler, job_key, host, gpu_uuid, gpu_instance) DO UPDATE SET
                 first_seen = least(allocations.first_seen, excluded.first_seen),
                 last_seen = greatest(allocations.last_seen, excluded.last_seen),
                 gpu = coalesce(excluded.gpu, allocations.gpu)"""
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

    # --- publishing ---

    def _manifest(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}

    def publish(self) -> None:
        """Snapshot changed tables and atomically replace the manifest readers go by."""
        previous = self._manifest()
        tables = dict(previous.get("tables", {}))
        self._publish_seq += 1
        seq = self._publish_seq
        for name in sorted(self._dirty_tables):
            arrow = self.db.sql(f"SELECT * FROM {name}").to_arrow_table()
            path = self.root / "tables" / f"{name}-{seq:09d}.parquet"
            write_parquet(arrow, path)
            if name in tables:
                self._retire(tables[name])
            tables[name] = str(path.relative_to(self.root))
        self._dirty_tables.clear()
        samples = [r[0] for r in self.db.execute("SELECT DISTINCT file FROM batches WHERE file <> '' ORDER BY 1").fetchall()]
        rollups = [r[0] for r in self.db.execute("SELECT file FROM rollups ORDER BY hour").fetchall()]
        manifest = {
            "version": seq,
            "schema_version": self.schema_version(),
            "published_at": self.clock().isoformat(),
            "samples": samples,
            "rollup_5m": rollups,
            "tables": tables,
        }
        _fsync_write(self.root / MANIFEST, lambda tmp: tmp.write_text(json.dumps(manifest)))
        self._delete_retired()

    def _retire(self, rel: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO retired_files VALUES (?, ?)", [rel, self.clock()])

    def _delete_retired(self) -> None:
        cutoff = self.clock() - RETIRE_GRACE
        for (rel,) in self.db.execute("SELECT file FROM retired_files WHERE retired_at < ?", [cutoff]).fetchall():
            (self.root / rel).unlink(missing_ok=True)
        self.db.execute("DELETE FROM retired_files WHERE retired_at < ?", [cutoff])

    def close(self) -> None:
        self.db.close()


_JOB_TYPES = {
    "het_job_offset": "INTEGER", "gpus": "INTEGER", "node_count": "INTEGER",
    "submit": "TIMESTAMP", "eligible": "TIMESTAMP", "start": "TIMESTAMP", "end": "TIMESTAMP", "updated_at": "TIMESTAMP",
}
_JOB_TYPES = {c: _JOB_TYPES.get(c, "VARCHAR") for c in schema.JOB_COLUMNS}


def open_reader(root: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with views over the store's current manifest: never locks the writer.

    Views: gpu_samples, gpu_rollup_5m (once an hour is compacted), jobs, allocations, gpus.
    An empty store gives empty views.
    """
    root = Path(root)
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise StoreError(f"no store at {root}: expected a directory written by `gpufleet collect` (manifest.json missing)") from None
    if manifest.get("schema_version", 0) > schema.SCHEMA_VERSION:
        raise StoreError(f"store {root} has schema version {manifest['schema_version']}, newer than this gpufleet's: upgrade gpufleet")
    con = duckdb.connect(":memory:")
    files = [str(root / f) for f in manifest.get("samples", [])]
    if files:
        con.execute(f"CREATE VIEW gpu_samples AS SELECT * FROM read_parquet({_sql_list(files)}, hive_partitioning = false)")
    else:
        con.register("_empty_samples", schema.SAMPLE_SCHEMA.empty_table())
        con.execute("CREATE TABLE gpu_samples AS SELECT * FROM _empty_samples")  # visible to cursors
        con.unregister("_empty_samples")
    rollups = [str(root / f) for f in manifest.get("rollup_5m", [])]
    if rollups:
        con.execute(f"CREATE VIEW gpu_rollup_5m AS SELECT * FROM read_parquet({_sql_list(rollups)})")
    for name, ddl in schema.TABLES.items():
        rel = manifest.get("tables", {}).get(name)
        if rel:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{_sql_str(str(root / rel))}')")
        else:
            con.execute(ddl.replace("IF NOT EXISTS ", ""))
    return con


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _sql_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{_sql_str(i)}'" for i in items) + "]"
