"""A window's figures from the store's facts (gpufleet.collector.facts): SQL over parts.

The window [start, end) and its reach (idle_min_duration + max_gap either side: an idle stretch crossing an edge is judged
by its whole length) are tiled with the coarsest buckets stored for these parameters (a day, an hour, 5 minutes); the minutes
an edge cuts out of a 5-minute bucket, and buckets without facts, are cut from raw samples by collector.facts.build_parts, the
store's own rule. Every part then lies wholly inside or outside the window (`inside`); each figure is one query over them:

  data, busy, allocated data (held), stranded   sums over the lead parts inside the window
  a job's data and busy                         sums over its parts inside the window
  idle allocated, no process                    STRETCH_ROWS: edge runs chained per GPU and holder, and runs inside parts
  capacity, allocated (accounting)              the inventory and the job table, as the raw path

A filter is a WHERE clause on the parts (cluster, model) or on their holders' jobs (account, user, partition, job). The raw
path, tests/support/raw_analysis.py RawAnalysis, is the tests' oracle.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from datetime import datetime
from typing import Any, Callable

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from gpufleet.analytics import raw_reads, sql
from gpufleet.analytics.params import Params
from gpufleet.analytics.window import JOB_FILTER_DIMS, allocated_total, by_job_dimension, register_prices, window_bind
from gpufleet.collector import facts as cf
from gpufleet.collector.reading import query_rows, seen_floor
from gpufleet.collector.schema import empty_table
from gpufleet.times import epoch_us, from_epoch_us, utcnow

FIVE_US = cf.GRAIN_5M * 1_000_000
# FactWindow._raw reads raw samples in whole hours: as many a statement as give about RAW_READ_ROWS rows, 1 to RAW_READ_HOURS
RAW_READ_ROWS = 250_000
RAW_READ_HOURS = 24

# The window's parts (wpe): raw cuts (wp) then stored ones (INSERT_STORED_PARTS), with MIG share and `inside`; GPU filters apply here
_PART_COLUMNS = f"""{sql.gpu_equiv("wp")} AS equiv, wp.p0 >= $start_us AND wp.p1 <= $end_us AS inside
FROM {{parts}} wp
WHERE ($cluster IS NULL OR wp.cluster = $cluster) AND ($model IS NULL OR wp.model = $model)"""
PARTS_TABLE = "CREATE OR REPLACE TEMP TABLE {table} AS SELECT wp.*, " + _PART_COLUMNS.format(parts="wp")
# ... an in_place window's: its raw cuts' table and {stored}, each grain's SELECT_STORED_PARTS with its values inlined (a view
# takes no parameters)
IN_PLACE_PARTS = "CREATE OR REPLACE TEMP VIEW wpe AS SELECT * FROM wpr{stored}"

ONLY_GPUS = cf.only_gpus()  # (FactWindow's `gpus`)
# One grain's stored parts in [$lo, $hi) from their files alone ($files: fact_files_of; the fact_parts view opens every facts
# file). $buckets: the bucket starts wanted (epoch us; NULL: all), so a grid off the hours reads all its cells in one statement
STORED_PARTS = ("SELECT {columns} FROM read_parquet($files, hive_partitioning = false) WHERE tag = $tag AND grain_s = $grain "
                "AND bucket >= make_timestamp($lo) AND bucket < make_timestamp($hi) "
                f"AND ($buckets IS NULL OR epoch_us(bucket) IN (SELECT unnest($buckets))) AND {ONLY_GPUS}")
# ... inserted into wpe straight from the files (no Arrow copy beside DuckDB's), or read where they lie (in_place); {columns}:
# the FactWindow's `columns`
SELECT_STORED_PARTS = "SELECT wp.*, " + _PART_COLUMNS.format(parts=f"({STORED_PARTS})")
INSERT_STORED_PARTS = "INSERT INTO wpe BY NAME " + SELECT_STORED_PARTS

ALL_COLUMNS = tuple(cf.SCHEMA.names)  # a FactWindow's parts' columns unless it names fewer
# What every read of parts needs: a part's GPU, its MIG share's inputs, bucket and times, holder and whether it leads its stretch
PART_KEY_COLUMNS = ("cluster", "host", "gpu_uuid", "gi", "gpu", "model", "mig_profile", "grain_s", "bucket", "p0", "p1", "scheduler",
                    "job_key", "lead")
# The parts' columns core.Analysis' figures read (this module's queries, sql.WINDOW_STATE_JOBS), for a narrower window table (the
# health columns are the Health page's own FactWindow's). A query naming another column fails when bound; the tests run every figure.
# The profiling fields a job's states read (states.py: tensor for compute and communication, SM and PCIe RX for input-bound,
# NVLink for communication) as the parts carry them: known seconds and value x seconds; the held parts' (HELD_COLUMNS) too
STATE_FIELDS = ("tensor_active", "sm_active", "pcie_rx_bytes_per_s", "nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s")
STATE_FIELD_COLUMNS = tuple(f"{f}_{part}" for f in STATE_FIELDS for part in ("known_s", "s"))
ANALYSIS_COLUMNS = (
    *PART_KEY_COLUMNS, "covered_s", "data_s", "busy_s", "nop_s", "fb_max_mib",
    "idle_head_us", "idle_tail_us", "idle_whole", "idle_inner_us", "nop_head_us", "nop_tail_us", "nop_whole", "nop_inner_us",
    *STATE_FIELD_COLUMNS, "clocked_s", "tensor_clock_s", "tensor_clocked_s")
# ... those a timeline's re-read of the parts, cut at its buckets, reads (timeline.bucketed_parts: TIMELINE_PARTS, JOB_GPU_PARTS, _HELD)
TIMELINE_COLUMNS = (*PART_KEY_COLUMNS, "covered_s", "data_s", "busy_s", "fb_max_mib")
# ... and those the Health page's temperature chart reads (sql.TEMPERATURE_FROM_FACTS, at its buckets' grain)
TEMPERATURE_COLUMNS = (*PART_KEY_COLUMNS, "samples_n", "temp_n", "temp_sum", "sample_temp_max_c", "mem_temp_max_c")
# ... and those health's events read (sql.EVENTS_FROM_FACTS, MIXED_PARTS): at a small fleet a read costs files x columns, not rows
EVENT_COLUMNS = (*PART_KEY_COLUMNS, "samples_n", *sql.EVENT_FACT_COLUMNS)
# ... and those the Health page's window reads (its GPUs' figures, sql.HEALTH_FROM_FACTS, and its events): 85 of the 115
# (the 4,096-GPU bench week's window_health: 1.35-1.49 -> 1.22-1.37 s first in a process, 1.05-1.34 -> 0.86-0.90 s again)
HEALTH_COLUMNS = tuple(dict.fromkeys((*EVENT_COLUMNS, *sql.HEALTH_FACT_COLUMNS)))
# the facts files of a file grain (300: an hour's 5-minute facts; 86400: a day's hour and day facts) with buckets in [$lo, $hi), in order
FACT_FILES = ("SELECT file, epoch_us(bucket) FROM fact_files WHERE tag = $tag AND grain_s = $file_grain AND bucket >= make_timestamp($lo) "
              "AND bucket < make_timestamp($hi) ORDER BY bucket")
# whether the 5-minute facts of [$b0, $hi) have data inside [$lo, $hi): a part whose samples all lie outside the cut (before
# the store's first sample, after its last) tells of nothing retired
FACT_DATA = ("SELECT coalesce(bool_or(covered_s > 0 AND first_ts < $hi AND last_ts + $gap_us > $lo), false) "
             "FROM read_parquet($files, hive_partitioning = false) "
             "WHERE tag = $tag AND grain_s = 300 AND epoch_us(bucket) >= $b0 AND epoch_us(bucket) < $hi")
# whether any raw sample (within the filters) holds into [$lo, $hi): a cut's, for edge_warnings
CUT_SAMPLE = f"""SELECT 1 FROM {raw_reads.SAMPLES} WHERE ts >= make_timestamp($lo - $gap_us) AND ts < make_timestamp($hi)
  AND ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model) LIMIT 1"""
# whether the reader has the facts' views (an older store has not)
HAS_FACTS = ("SELECT count(*) = 2 FROM (SELECT view_name AS n FROM duckdb_views() UNION ALL SELECT table_name FROM duckdb_tables()) "
             "WHERE n IN ('fact_files', 'fact_parts')")
# the store's first sample and just after its last (epoch us; NULL: none), from sample_files: its first (last) day's files'
# times where the manifest gives them all (sample_spans), else that day's start (end). A raw cut outside them reads nothing
SAMPLE_EXTENT = """
WITH d AS (SELECT min(day) AS d0, max(day) AS d1 FROM sample_files)
SELECT CASE WHEN bool_and(t0 IS NOT NULL) FILTER (WHERE day = d0) THEN min(t0) FILTER (WHERE day = d0)
            ELSE epoch_us(any_value(d0)::TIMESTAMP) END,
       CASE WHEN bool_and(t1 IS NOT NULL) FILTER (WHERE day = d1) THEN max(t1) FILTER (WHERE day = d1) + 1
            ELSE epoch_us(any_value(d1)::TIMESTAMP + INTERVAL 1 DAY) END
FROM sample_files, d"""
# which buckets the store has facts of, for these parameters
STORED_BUCKETS = ("SELECT grain_s, epoch_us(bucket) AS b, hour_parts, epoch_us(open_from) AS open_from, epoch_us(open_upto) AS open_upto "
                  "FROM fact_files WHERE tag = $tag")
OPEN_5M = 0  # stored_buckets' key of the 5-minute buckets an open hour's files hold (the hour's own file not written yet)

# The holders' jobs with their names, the job filters applied (a mapped job the accounting lacks keeps its allocation's key, as
# sql.ALLOCATIONS); {holders}: rows naming a GPU and job (wpe's distinct holders, a timeline's sums per holder and bucket) ...
_HOLDER_JOB = f"""
SELECT o.*, coalesce(j.job_id, o.job_key) AS job_id, j.user_name, j.account, j.partition
FROM {{holders}} o LEFT JOIN jobs j ON j.cluster = o.cluster AND j.scheduler = o.scheduler AND j.job_key = o.job_key
WHERE o.job_key IS NOT NULL AND {sql.ALLOCATION_FILTERS.replace("a.", "o.")}
"""
# ... joined to the parts they hold (names to holders first, then holders to parts: DuckDB would hash the wide parts)
_HOLDERS_ON = ("o.cluster = p.cluster AND o.host = p.host AND o.gpu_uuid = p.gpu_uuid AND o.gi = p.gi AND o.scheduler = p.scheduler "
               "AND o.job_key = p.job_key")
_WPE_HOLDERS = "(SELECT DISTINCT cluster, host, gpu_uuid, gi, scheduler, job_key FROM wpe WHERE job_key IS NOT NULL)"
# The window's held parts (a holder, the job filters applied), each with its job's names
_HELD = f"""
SELECT p.*, o.job_id, o.user_name, o.account, o.partition
FROM wpe p JOIN ({_HOLDER_JOB.format(holders=_WPE_HOLDERS)}) o ON {_HOLDERS_ON}"""

PER_GPU_USE = """
SELECT cluster, host, gpu_uuid, gi,
       sum(data_s * equiv) AS data_s, sum(busy_s * equiv) AS busy_s,
       sum(CASE WHEN job_key IS NOT NULL THEN data_s * equiv ELSE 0 END) AS alloc_data_s
FROM wpe WHERE inside AND lead GROUP BY ALL
"""

# Each GPU (or MIG instance) in the read window: gid (core.Analysis' GPU number), its earliest part's gpu index, model and MIG share
GPU_IDS = """
CREATE OR REPLACE TEMP TABLE wgpu AS
SELECT row_number() OVER (ORDER BY cluster, host, gpu_uuid, gi) - 1 AS gid, *
FROM (SELECT cluster, host, gpu_uuid, gi, arg_min(gpu, p0) AS gpu, arg_min(model, p0) FILTER (WHERE model IS NOT NULL) AS model,
             arg_min(equiv, p0) AS equiv
      FROM wpe GROUP BY ALL)
"""

# Each allocation (al, row order) with the sums of its held parts (wheld, met with it there) inside the window: data and busy
# seconds x MIG share, has_piece (a sample interval covers any), has_util, and allocation_detail's memory high-water, MFU time,
# tensor sums (NULL: none known)
ALLOCATION_PARTS = """
WITH s AS (
    SELECT i, sum(data_s * equiv) AS data_s, sum(busy_s * equiv) AS busy_s, sum(covered_s) > 0 AS has_piece, sum(data_s) > 0 AS has_util,
           max(fb_max_mib) FILTER (WHERE covered_s > 0) AS fb_max, sum(covered_s * equiv) AS any_s,
           CASE WHEN sum(tensor_active_known_s) > 0 THEN sum(tensor_active_known_s * equiv) END AS tensor_s,
           CASE WHEN sum(tensor_active_known_s) > 0 THEN sum(clocked_s * equiv) END AS clocked_s,
           CASE WHEN sum(tensor_active_known_s) > 0 THEN coalesce(sum(tensor_clock_s * equiv), 0) END AS tclock,
           CASE WHEN sum(tensor_active_known_s) > 0 THEN coalesce(sum(tensor_clocked_s * equiv), 0) END AS tw_clocked,
           CASE WHEN sum(tensor_active_known_s) > 0
                THEN coalesce(sum((coalesce(tensor_active_s, 0) - coalesce(tensor_clocked_s, 0)) * equiv), 0) END AS tnoclock
    FROM wheld WHERE inside GROUP BY i
)
SELECT al.rowid AS i, g.gid, al.a0, al.a1, coalesce(s.data_s, 0) AS data_s, coalesce(s.busy_s, 0) AS busy_s,
       coalesce(s.has_piece, false) AS has_piece, coalesce(s.has_util, false) AS has_util, s.fb_max, coalesce(s.any_s, 0) AS any_s,
       s.tensor_s, s.clocked_s, s.tclock, s.tw_clocked, s.tnoclock
FROM al
LEFT JOIN wgpu g ON g.cluster = al.cluster AND g.host = al.host AND g.gpu_uuid = al.gpu_uuid AND g.gi = al.gi
LEFT JOIN s ON s.i = al.rowid
ORDER BY al.rowid
"""

# wheld (HELD_TABLE): the held parts, each met with the allocation (al's row i) that holds it, pid their rowid, hk their GPU and
# holder's number (wholder: one for every run of a requeued job on a GPU). wlinked: their idle and no-process edge pieces
# chained where one ends as the next starts, in one window-function pass (`chain`: a piece's start less the lengths of its kind
# and holder's pieces before it, the same along a chain and larger after each gap; the pieces of a kind and holder never
# overlap). Built once a window (FactWindow.linked) for STRETCH_ROWS, ALLOCATION_PARTS and sql.WINDOW_STATE_JOBS. A piece
# carries no names (they slow the pass): a chain's come from its first piece's part (pid) in wheld. The parts are met with al's
# rows (its filters, its names, its edges clipped to the reach), not with the jobs: the allocations' sums and a hold's first and
# last parts need no second join on the names (a part wholly outside the reach is in no row of al: no stretch or state of the
# window depends on it, as the reach is idle_min_duration + max_gap).
# An allocation is one row of al but where its job's runs (job_attempts) split it: its holder's number is its own row's, and
# the rows of a job with runs reaching the read window are grouped by holder first (the least row number of each: numbers no
# two holders share)
HOLDER_TABLE = """CREATE OR REPLACE TEMP TABLE wholder AS
WITH runs AS (SELECT DISTINCT cluster, scheduler, job_key FROM job_attempts WHERE "end" IS NULL OR "end" > $xstart)
SELECT rowid AS i, rowid AS hk FROM al ANTI JOIN runs USING (cluster, scheduler, job_key) WHERE job_key IS NOT NULL
UNION ALL
SELECT unnest(rows), list_min(rows) FROM (
    SELECT list(rowid) AS rows FROM al SEMI JOIN runs USING (cluster, scheduler, job_key) WHERE job_key IS NOT NULL
    GROUP BY cluster, host, gpu_uuid, gi, scheduler, job_key)"""
# ... the columns of wpe its readers read (STRETCH_ROWS, ALLOCATION_PARTS, sql.WINDOW_STATE_JOBS): a narrower table is a faster
# one to write
HELD_COLUMNS = ("cluster", "host", "gpu_uuid", "gi", "gpu", "model", "equiv", "inside", "p0", "p1", "scheduler", "job_key", "covered_s",
                "data_s", "busy_s", "nop_s", "fb_max_mib", "clocked_s", "tensor_clock_s", "tensor_clocked_s",
                *(f"{k}_{c}" for k in ("idle", "nop") for c in ("head_us", "tail_us", "whole", "inner_us")), *STATE_FIELD_COLUMNS)
HELD_TABLE = f"""CREATE OR REPLACE TEMP TABLE wheld AS
SELECT o.hk, o.i, {", ".join(f"p.{c}" for c in HELD_COLUMNS)}, al.job_id, al.user_name, al.account, al.partition
FROM wpe p
JOIN al ON al.cluster = p.cluster AND al.host = p.host AND al.gpu_uuid = p.gpu_uuid AND al.gi = p.gi AND al.scheduler = p.scheduler
     AND al.job_key = p.job_key AND p.p1 > epoch_us(al.a0) AND p.p0 < epoch_us(al.a1)
JOIN wholder o ON o.i = al.rowid"""
LINKED_PIECES = ("CREATE OR REPLACE TEMP TABLE wlinked AS\n"
                 "SELECT *, r1 - sum(r1 - r0) OVER (PARTITION BY kind, hk ORDER BY r0 ROWS UNBOUNDED PRECEDING) AS chain FROM ({pieces})")
# ... each kind's edge pieces (head; tail, unless the whole part is one run)
_STRETCH_PIECES = """
    SELECT '{kind}' AS kind, rowid AS pid, hk, equiv, inside, p0 AS r0, p0 + {kind}_head_us AS r1 FROM wheld WHERE {kind}_head_us > 0
    UNION ALL
    SELECT '{kind}', rowid, hk, equiv, inside, p1 - {kind}_tail_us, p1 FROM wheld WHERE {kind}_tail_us > 0 AND NOT {kind}_whole"""

# The idle and no-process stretches' rows (core.STRETCH_SCHEMA; `kind`): wlinked's chains reaching $idle_min_us as a whole, with
# their seconds inside the window, and the runs wholly inside parts that did. A chain's times are exact, clipped to the read window;
# a run inside a part carries the part's bounds (the facts keep no times of its own). In stretches.py's order (ties: end, length).
STRETCH_ROWS = """
WITH chains AS (
    SELECT kind, hk, min(r0) AS s0, max(r1) AS s1, arg_min(pid, r0) AS first_pid,
           sum(CASE WHEN inside THEN r1 - r0 ELSE 0 END) / 1e6 AS in_window_s,
           sum(CASE WHEN inside THEN (r1 - r0) * equiv ELSE 0 END) / 1e6 / 3600 AS gpu_h
    FROM wlinked GROUP BY kind, hk, chain
    HAVING sum(r1 - r0) >= $idle_min_us
), rows AS (
    SELECT c.kind, c.hk, h.cluster, h.host, h.gpu_uuid, h.gi, h.scheduler, h.job_key, h.job_id, h.user_name, h.account, h.partition,
           h.gpu, h.model, h.equiv, c.s0, c.s1, c.in_window_s, c.gpu_h
    FROM chains c JOIN wheld h ON h.rowid = c.first_pid{inner}
)
SELECT r.kind, r.cluster, r.scheduler, r.job_key, r.host, r.gpu_uuid, r.gi, r.job_id, r.user_name, r.account, r.partition, r.model, r.gpu, r.equiv, make_timestamp(greatest(r.s0, epoch_us($xstart))) AS s0,
       make_timestamp(least(r.s1, epoch_us($xend))) AS s1,
       r.in_window_s, r.gpu_h, pr.usd_per_gpu_hour, r.gpu_h * pr.usd_per_gpu_hour AS cost
FROM rows r LEFT JOIN prices pr ON pr.model = r.model
WHERE r.in_window_s > 0
ORDER BY r.kind, r.cluster, r.job_key, r.host, r.gpu_uuid, r.gi, r.scheduler, r.s0, r.s1, r.in_window_s
"""
# ... and its runs wholly inside parts that reached it
_STRETCH_INNER = """
    UNION ALL
    SELECT '{kind}', hk, cluster, host, gpu_uuid, gi, scheduler, job_key, job_id, user_name, account, partition, gpu, model, equiv, p0, p1,
           {kind}_inner_us / 1e6, {kind}_inner_us * equiv / 1e6 / 3600
    FROM wheld WHERE inside AND {kind}_inner_us > 0"""

# A timeline's data and busy seconds (x MIG share) per bucket k of $bucket_us from $origin_us (the window's start or earlier: the
# report's first local midnight), from the parts inside the window (cut at the buckets: FactWindow's grid_us), by the inventory's
# cluster and model: a GPU's time (lead parts, "iv") or its holders' (job filters applied; "pc": by partition, account, user too)
TIMELINE_PARTS = """
WITH p AS (
    SELECT cluster, host, gpu_uuid, gi{holder}, (p0 - $origin_us) // $bucket_us AS k,
           bool_and((p1 - 1 - $origin_us) // $bucket_us = (p0 - $origin_us) // $bucket_us) AS fits,
           sum(data_s * equiv) AS data_s, sum(busy_s * equiv) AS busy_s
    FROM wpe WHERE inside AND {which} GROUP BY ALL
)
SELECT c.cluster, c.model{keys}, p.k, bool_and(p.fits) AS fits, sum(p.data_s) / 3600 AS data_gpu_h, sum(p.busy_s) / 3600 AS busy_gpu_h
FROM {parts} p JOIN cap c ON c.cluster = p.cluster AND c.host = p.host AND c.gpu_uuid = p.gpu_uuid AND c.gi = p.gi
GROUP BY ALL
"""
# (summed per GPU, holder and bucket before the holders' jobs are joined: DuckDB would hash the wide parts)

# One job's GPUs per bucket k (timeline.job_gpu_timeline): its parts inside the window with sample time, summed per GPU (or MIG
# instance) and bucket - data and busy seconds x MIG share, memory high-water - named by the earliest part's index; fits: as TIMELINE_PARTS
JOB_GPU_PARTS = f"""
SELECT (p0 - $origin_us) // $bucket_us AS k, host, gpu_uuid, gi, arg_min(gpu, p0) AS gpu,
       bool_and((p1 - 1 - $origin_us) // $bucket_us = (p0 - $origin_us) // $bucket_us) AS fits,
       sum(data_s * equiv) AS data_s, sum(busy_s * equiv) AS busy_s, max(fb_max_mib) AS fb_max
FROM ({_HELD}) WHERE inside AND covered_s > 0 AND cluster = $of_cluster AND scheduler = $of_scheduler AND job_key = $of_job_key
GROUP BY k, host, gpu_uuid, gi
"""


def timeline_parts(held: bool) -> str:
    """TIMELINE_PARTS of the GPUs' lead parts ("iv") or of the holders' parts (`held`: "pc")."""
    if held:
        return TIMELINE_PARTS.format(holder=", scheduler, job_key", which="job_key IS NOT NULL", keys=", p.partition, p.account, p.user_name",
                                     parts=f"({_HOLDER_JOB.format(holders='p')})")
    return TIMELINE_PARTS.format(holder="", which="lead", keys="", parts="p")


STRETCH_KINDS = ("idle", "nop")  # the facts' run columns: idle (utilization below the threshold), no process
LINKED = (HOLDER_TABLE, HELD_TABLE, LINKED_PIECES.format(pieces="\n    UNION ALL".join(_STRETCH_PIECES.format(kind=k) for k in STRETCH_KINDS)))


def stretch_rows() -> str:
    """STRETCH_ROWS of both kinds in one statement (`kind`: idle or nop), over wlinked (FactWindow.linked)."""
    return STRETCH_ROWS.format(inner="".join(_STRETCH_INNER.format(kind=k) for k in STRETCH_KINDS))


def stored_buckets(con: duckdb.DuckDBPyConnection, fp: cf.FactParams) -> dict[int, set[int]]:
    """Per grain, the buckets (epoch us) the store has facts of for `fp`: hours of 5-minute facts (GRAIN_5M), hours whose own
    file holds their hour parts too (GRAIN_1H), days of hour and day facts (GRAIN_1D), open hours' settled 5-minute buckets
    (OPEN_5M); all empty on a store without facts."""
    out: dict[int, set[int]] = {cf.GRAIN_5M: set(), cf.GRAIN_1H: set(), cf.GRAIN_1D: set(), OPEN_5M: set()}
    if con.execute(HAS_FACTS).fetchall()[0][0]:
        for g, b, hour_parts, open_from, open_upto in con.execute(STORED_BUCKETS, {"tag": fp.tag()}).fetchall():
            if open_upto is not None:
                out[OPEN_5M].update(range(open_from, open_upto, FIVE_US))
                continue
            out[g].add(b)
            if g == cf.GRAIN_5M and hour_parts:
                out[cf.GRAIN_1H].add(b)
    return out


def fact_files_of(con: duckdb.DuckDBPyConnection, tag: str, grain: int, runs: list[tuple[int, int]]) -> list[str]:
    """The files holding the `grain` parts of the runs [lo, hi) (epoch us, in order, as tile gives them): 5-minute parts in their
    hours' files, day parts in their days', hour parts in their days' where the day is closed, else in their hours' (tile asks an
    open day's hour parts only of hours whose file holds them)."""
    if grain == cf.GRAIN_1H:
        days = _files_in(con, tag, cf.GRAIN_1D, [(lo - lo % cf.DAY_US, hi) for lo, hi in runs])
        closed = {b for _, b in days}
        hours = [(f, b) for f, b in _files_in(con, tag, cf.GRAIN_5M, runs) if b - b % cf.DAY_US not in closed]
        return [f for f, _ in sorted(days + hours, key=lambda r: r[1])]
    file_grain, span = (cf.GRAIN_5M, cf.HOUR_US) if grain == cf.GRAIN_5M else (cf.GRAIN_1D, cf.DAY_US)
    return [f for f, _ in _files_in(con, tag, file_grain, [(lo - lo % span, hi) for lo, hi in runs])]


def _files_in(con: duckdb.DuckDBPyConnection, tag: str, file_grain: int, spans: list[tuple[int, int]]) -> list[tuple[str, int]]:
    """(file, bucket) of the files of `file_grain` whose bucket lies in one of `spans` (in order), in one statement."""
    rows = con.execute(FACT_FILES, {"tag": tag, "file_grain": file_grain, "lo": spans[0][0], "hi": spans[-1][1]}).fetchall()
    starts = [lo for lo, _ in spans]
    return [(f, b) for f, b in rows if (i := bisect_right(starts, b) - 1) >= 0 and b < spans[i][1]]


# The window's tables a figure's query may read, by name, and the statement that builds each (al: also linked's)
WINDOW_TABLES = {"cap": sql.CAPACITY, "ja": sql.JOB_TABLE, "al": sql.ALLOCATIONS}
_WINDOW_TABLE_NAMES = re.compile(rf"\b({'|'.join(WINDOW_TABLES)})\b")

JOB_DIMS = {"partition": ("cluster", "partition"), "account": ("cluster", "account"), "user_name": ("cluster", "user_name"),
            "job": ("cluster", "scheduler", "job_key", "job_id", "user_name", "account", "partition")}


def fact_params(params: Params) -> cf.FactParams:
    """The facts' parameters an analysis of `params` reads (their tag names the facts built so)."""
    return cf.FactParams(max_gap_s=params.max_gap.total_seconds(), idle_threshold=params.idle_threshold,
                         idle_min_s=params.idle_min_duration.total_seconds())


def tile(lo: int, hi: int, stored: dict[int, set[int]], max_grain: int = cf.GRAIN_1D) -> list[tuple[int | None, int, int]]:
    """[lo, hi) (epoch us) as (grain, from, to) runs of stored buckets (stored_buckets), coarsest first where they fit (at most
    max_grain; an hour from its day's file or its own), and (None, from, to) for what is read raw."""
    out: list[tuple[int | None, int, int]] = []
    t = lo

    def add(g: int | None, a: int, b: int) -> None:
        if out and out[-1][0] == g and out[-1][2] == a:
            out[-1] = (g, out[-1][1], b)
        else:
            out.append((g, a, b))

    while t < hi:
        day, hour = t - t % cf.DAY_US, t - t % cf.HOUR_US
        if t == day and t + cf.DAY_US <= hi and day in stored[cf.GRAIN_1D] and max_grain >= cf.GRAIN_1D:
            add(cf.GRAIN_1D, t, t + cf.DAY_US)
            t += cf.DAY_US
        elif t == hour and t + cf.HOUR_US <= hi and (day in stored[cf.GRAIN_1D] or hour in stored[cf.GRAIN_1H]) and max_grain >= cf.GRAIN_1H:
            add(cf.GRAIN_1H, t, t + cf.HOUR_US)
            t += cf.HOUR_US
        elif t % FIVE_US == 0 and t + FIVE_US <= hi and (hour in stored[cf.GRAIN_5M] or t in stored[OPEN_5M]):
            add(cf.GRAIN_5M, t, t + FIVE_US)
            t += FIVE_US
        else:  # raw up to the next 5-minute edge (or hi)
            nxt = min(hi, t - t % FIVE_US + FIVE_US)
            add(None, t, nxt)
            t = nxt
    return out


def _reach_from_us(start_us: int, reach_us: int) -> int:
    """Where a window's parts start: its reach before its start, on the 5-minute grid."""
    return (start_us - reach_us) - (start_us - reach_us) % FIVE_US


def read_from(params: Params) -> datetime:
    """The earliest time any read of a window (its parts with their reach, its allocations at $xstart) looks at: one
    $seen_floor found there serves them all."""
    reach = params.idle_min_duration + params.max_gap
    return from_epoch_us(_reach_from_us(epoch_us(params.start), round(reach.total_seconds() * 1_000_000)))


class FactWindow:
    """One window's parts on a cursor of its own, and the figures over them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, params: Params, *, now: datetime | None = None,
                 max_grain: int = cf.GRAIN_1D, cursor: duckdb.DuckDBPyConnection | None = None, grid_us: int | None = None,
                 grid_origin_us: int | None = None, gpus: list[str] | None = None, hosts: list[str] | None = None,
                 inside_only: bool = False, columns: tuple[str, ...] = ALL_COLUMNS,
                 allocations: Callable[[], None] | None = None, in_place: bool = False, floor: Callable[[], Any] | None = None):
        """`max_grain`: the coarsest grain read (seconds): a chart's buckets must not cut parts. `cursor`: build the parts on it
        (core.Analysis': its cap and ja are there already). `grid_us`: every origin + k x grid_us inside the window is a part edge
        too (a timeline's buckets); `grid_origin_us`: that origin (default the window's start). `gpus`: only these GPUs' parts (by
        uuid, and those without one), stored and raw (health.events); `hosts` (sorted): only those on these hosts (a job filter's:
        reads skip other hosts' files and row groups). `inside_only`: the parts inside the window alone, no reach (health's
        figures and the timelines' sums read no idle stretch). `columns`: the parts' columns read (default all; core.Analysis: ANALYSIS_COLUMNS).
        `allocations`: makes al on `cursor` unless made (core.Analysis', the owner of al there); without a cursor al is built here.
        `in_place`: wpe a view over the stored parts' files (and a table of the raw cuts), so each query reads the columns it
        names where they lie: for a window asked a few figures (health's, a timeline's); a window asked many (core.Analysis) copies
        its parts once. Its files must outlive it: close it within the store's grace for retired files (collector.store).
        `floor`: finds the allocations' $seen_floor at read_from(params) or earlier (core.Analysis': one for its al and
        these parts); without one it is found here, once."""
        self.con = cursor if cursor is not None else con.cursor()
        self.p = params
        self.max_grain = max_grain
        self.grid_us = grid_us
        self.grid_origin_us = epoch_us(params.start) if grid_origin_us is None else grid_origin_us
        self.gpus = gpus
        self.hosts = hosts
        self.inside_only = inside_only
        self.columns = columns
        self.in_place = in_place
        self.fp = fact_params(params)
        self.bind = {**window_bind(params, now or utcnow()), "start_us": epoch_us(params.start), "end_us": epoch_us(params.end),
                     "idle_min_us": self.fp.idle_min_us}
        register_prices(self.con, params)
        self.raw_us = 0  # microseconds of GPU time cut from raw samples (the window edges' minutes, buckets without facts)
        self.tiles: dict[int, int] = {}  # grain (s) -> buckets read from facts
        self._extent: tuple[int | None, int | None] | None = None  # SAMPLE_EXTENT, once a cut asks
        self._runs: dict[str, pl.DataFrame] = {}  # kind -> runs(kind), resolved once
        self._linked = False  # wheld and wlinked built (linked)
        # a GPU-filtered window's holds, read once for all its raw spans ([lo, hi), table; _holds)
        self._hold_span: tuple[int, int] | None = None
        self._hold: pa.Table | None = None
        # the allocations' $seen_floor of every read of the window's (its holds' spans from the parts' start, al from $xstart),
        # found once (_seen_floor), at read_from: at or before each of those
        self._floor: Any = cf.FLOOR_AT_LO
        self._find_floor = floor or (lambda: seen_floor(self.con, read_from(params), self.fp.max_gap_s))
        # cap, ja and al, built when a query first reads them (a health or temperature window reads none); core.Analysis' cursor has
        # cap and ja, and makes al by `allocations`
        self._unbuilt = set() if cursor is not None else set(WINDOW_TABLES)
        self._make_allocations = allocations or (lambda: self._build(["al"]))
        self._parts()

    # --- tiling ---

    def _parts(self) -> None:
        s, e = self.bind["start_us"], self.bind["end_us"]
        reach = round((self.p.idle_min_duration + self.p.max_gap).total_seconds() * 1_000_000)
        r0 = s if self.inside_only else _reach_from_us(s, reach)
        r1 = e if self.inside_only else -((-(e + reach)) // FIVE_US) * FIVE_US
        stored = stored_buckets(self.con, self.fp)
        tables, spans = [], []
        for lo, hi in ((r0, s), *self._grid(s, e), (e, r1)):
            for grain, a, b in tile(lo, hi, stored, self.max_grain):
                if grain is not None and spans and spans[-1][0] == grain and spans[-1][2] == a:
                    spans[-1] = (grain, spans[-1][1], b)  # whole buckets on both sides of a grid edge: one read
                else:
                    spans.append((grain, a, b))
        raw = [(a, b) for grain, a, b in spans if grain is None]
        if self.gpus is not None and raw:  # (a few GPUs: their holds from the first raw span to the last are few)
            self._hold_span = (raw[0][0], raw[-1][1])
        cells: list[tuple[int, int]] = []  # contiguous raw spans (a timeline's cells): read together, cut apart
        for grain, a, b in spans:
            if grain is None:
                if cells and cells[-1][1] != a:
                    tables += self._raw(cells)
                    cells = []
                cells.append((a, b))
        if cells:
            tables += self._raw(cells)
        # wp: the raw cuts' Arrow table, read into wpe (in_place: wpr) by PARTS_TABLE (no second copy) and unregistered
        raw = pa.concat_tables([cf.conform(t) for t in tables]) if tables else empty_table(cf.SCHEMA)
        self.con.register("wp", raw.select(list(self.columns)))
        made = PARTS_TABLE.format(table="wpr" if self.in_place else "wpe")
        self.con.execute(made, sql.bound(made, self.bind))
        self.con.unregister("wp")
        stored = [self._stored(grain, [(a, b) for g, a, b in spans if g == grain])
                  for grain in sorted({g for g, _, _ in spans if g is not None})]
        if self.in_place:
            self.con.execute(IN_PLACE_PARTS.format(stored="".join(f"\nUNION ALL {v}" for v in stored)))

    def _stored(self, grain: int, runs: list[tuple[int, int]]) -> str | None:
        """The stored parts of one grain's runs of buckets [a, b) into wpe, in one statement over their files (in_place: that
        statement returned, its values written in, for the view)."""
        tag, step = self.fp.tag(), grain * 1_000_000
        files = fact_files_of(self.con, tag, grain, runs)
        buckets = None if len(runs) == 1 else [t for a, b in runs for t in range(a, b, step)]
        self.tiles[grain] = self.tiles.get(grain, 0) + sum((b - a) // step for a, b in runs)
        values = {**self.bind, "files": files, "tag": tag, "grain": grain, "lo": runs[0][0], "hi": runs[-1][1], "buckets": buckets,
                  **cf.gpu_binds(self.gpus, self.hosts)}
        if self.in_place:
            return sql.inlined(SELECT_STORED_PARTS.format(columns=", ".join(self.columns)), values)
        query = INSERT_STORED_PARTS.format(columns=", ".join(self.columns))
        self.con.execute(query, sql.bound(query, values))
        return None

    def _holds(self, t: int, u: int) -> pa.Table:
        """The holds of the window's GPUs overlapping [t, u) (collector.facts.holds); a GPU-filtered window reads those of all its
        raw spans once (build_parts ignores holds it does not meet, and each HOLDS read scans every allocation's GPU)."""
        if self._hold_span is None:
            return cf.holds(self.con, t, u, self.fp, self.gpus, self.hosts, self._seen_floor())
        if self._hold is None:
            self._hold = cf.holds(self.con, *self._hold_span, self.fp, self.gpus, self.hosts, self._seen_floor())
        return self._hold

    def _seen_floor(self) -> Any:
        """The allocations' $seen_floor of the window's reads (`floor`, else reading.seen_floor at read_from), found once."""
        if self._floor is cf.FLOOR_AT_LO:
            self._floor = self._find_floor()
        return self._floor

    def _grid(self, s: int, e: int) -> list[tuple[int, int]]:
        """The window [s, e) cut at its grid's edges (grid_us from grid_origin_us; none: whole)."""
        if not self.grid_us:
            return [(s, e)]
        first = s + (self.grid_origin_us - s) % self.grid_us  # the first edge at or after s
        edges = [s, *range(first if first > s else first + self.grid_us, e, self.grid_us), e]
        return list(zip(edges[:-1], edges[1:]))

    def _raw(self, cells: list[tuple[int, int]]) -> list[pa.Table]:
        """Parts of contiguous spans [a, b) cut from raw samples, each span's own (a timeline's cells must not share a part): one
        build_parts call an hour, cut at the spans' edges; samples and holds read in as many whole hours as RAW_READ_ROWS allows."""
        out = []
        where = f"AND ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model) AND {ONLY_GPUS}"
        q = cf.samples_query(raw_reads.SAMPLES, where)
        t, hi = cells[0][0], cells[-1][1]
        starts = [a for a, _ in cells]  # (contiguous and in order: an hour's spans are found by bisection)
        hours = 1
        while t < hi:
            first, last = self.extent()
            if first is None or last < t - self.fp.gap_us:  # no sample from here on: no read
                break
            if t < first - first % cf.HOUR_US:  # no sample before the hour of the first: no read of those hours
                t = min(hi, first - first % cf.HOUR_US)
                continue
            u = min(hi, t - t % cf.HOUR_US + hours * cf.HOUR_US)
            samples = raw_reads.read(self.con, "edge", q, {"lo": t, "hi": u, "gap_us": self.fp.gap_us, "cluster": self.p.filters.cluster,
                                                           "model": self.p.filters.model, **cf.gpu_binds(self.gpus, self.hosts)},
                                     t, u, self.fp.gap_us)
            hours = max(1, min(RAW_READ_HOURS, RAW_READ_ROWS * (u - t) // (max(samples.num_rows, 1) * cf.HOUR_US)))
            if samples.num_rows:
                hold = self._holds(t, u)
                tsn = samples["ts"].to_numpy()
                at = np.sort(tsn)
                h = t
                while h < u:
                    h1 = min(u, h - h % cf.HOUR_US + cf.HOUR_US)
                    spans = [(max(a, h), min(b, h1)) for a, b in cells[bisect_right(starts, h) - 1:bisect_left(starts, h1)]]
                    lo, hi_ = spans[0][0], spans[-1][1]
                    # (SAMPLES' rows of [lo, hi_): those from max_gap before it on, as its own read gives them)
                    own = samples if (lo, hi_) == (t, u) else samples.filter(pa.array((tsn >= lo - self.fp.gap_us) & (tsn < hi_)))
                    if own.num_rows:
                        out.append(cf.build_parts(own, hold, lo, hi_, self.fp, cuts_us=[a for a, _ in spans[1:]]))
                        # (the spans with a sample from max_gap before them on: those cut from raw samples)
                        self.raw_us += sum(b - a for a, b in spans
                                           if np.searchsorted(at, b) > np.searchsorted(at, a - self.fp.gap_us))
                    h = h1
            t = u
        return out

    # --- figures ---

    def _build(self, names: list[str]) -> None:
        """The window's tables among `names` (WINDOW_TABLES) not built yet."""
        for name in [n for n in WINDOW_TABLES if n in names and n in self._unbuilt]:
            if name == "al":
                self.bind["seen_floor"] = self._seen_floor()
            self.con.execute(WINDOW_TABLES[name], sql.bound(WINDOW_TABLES[name], self.bind))
            self._unbuilt.discard(name)

    def q(self, query: str, **extra: Any) -> pl.DataFrame:
        self._build(_WINDOW_TABLE_NAMES.findall(query))
        return pl.from_arrow(query_rows(self.con, query, sql.bound(query, {**self.bind, **extra})))

    @property
    def job_filtered(self) -> bool:
        f = self.p.filters
        return any(v is not None for v in (f.account, f.user_name, f.partition, f.job_key))

    def per_gpu(self) -> pl.DataFrame:
        """As core.Analysis.per_gpu: capacity, data, no data, busy, allocated data and stranded GPU-hours per GPU."""
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE gpu_use AS {PER_GPU_USE}", sql.bound(PER_GPU_USE, self.bind))
        return self.q(sql.PER_GPU)

    def runs(self, kind: str) -> pl.DataFrame:
        """Idle ("idle") or no-process ("nop") stretches' rows (STRETCH_ROWS) with their in-window GPU-seconds, resolved once a window."""
        if not self._runs:
            self.linked()
            both = self.q(stretch_rows()).with_columns(gpu_s=pl.col("gpu_h") * 3600)
            self._runs = {k: both.filter(pl.col("kind") == k).drop("kind") for k in STRETCH_KINDS}
        return self._runs[kind].clone()

    def extent(self) -> tuple[int | None, int | None]:
        """The store's first sample and just after its last (SAMPLE_EXTENT, epoch us; None: none), read once."""
        if self._extent is None:
            self._extent = tuple(self.con.execute(SAMPLE_EXTENT).fetchall()[0])
        return self._extent

    def linked(self) -> None:
        """The window's wheld and wlinked (LINKED), built at the first figure that reads them (al first)."""
        if not self._linked:
            self._make_allocations()
            for statement in LINKED:
                self.con.execute(statement, sql.bound(statement, self.bind))
            self._linked = True

    def totals(self) -> dict[str, float | None]:
        """The window's headline GPU-hours (core.Totals' hours; capacity, no data and stranded only without a job filter)."""
        idle, nop = self.runs("idle"), self.runs("nop")
        idle_h = float(idle["gpu_s"].sum()) / 3600 if idle.height else 0.0
        nop_h = float(nop["gpu_s"].sum()) / 3600 if nop.height else 0.0
        if self.job_filtered:
            use = self.utilization("job")
            data, busy = float(use["data_gpu_h"].sum()), float(use["busy_gpu_h"].sum())
            # no data: allocated minus data (clipped at 0) per row of the filter's own dimension, as core.Analysis
            rows = self.utilization(next(d for k, d in JOB_FILTER_DIMS.items() if getattr(self.p.filters, k) is not None))
            no_data = float(rows["no_data_gpu_h"].sum())
            cap = stranded = None
        else:
            g = self.per_gpu()
            cap, data, busy = (float(g[c].sum()) for c in ("capacity_gpu_h", "data_gpu_h", "busy_gpu_h"))
            no_data, stranded = float(g["no_data_gpu_h"].sum()), float(g["stranded_gpu_h"].sum())
        return {"capacity_gpu_h": cap, "data_gpu_h": data, "no_data_gpu_h": no_data, "busy_gpu_h": busy,
                "utilization_pct": busy / data * 100 if data > 0 else None, **allocated_total(self.q(sql.ALLOCATED_GPU_H_TOTAL)),
                "idle_allocated_gpu_h": idle_h, "no_process_gpu_h": nop_h, "stranded_gpu_h": stranded}

    def utilization(self, by: str) -> pl.DataFrame:
        """Allocated, data, busy and no-data GPU-hours by a job dimension (core.JOB_DIMS), as core.by_job_dimension."""
        keys = list(JOB_DIMS[by])
        cols = ", ".join(keys)
        used = self.q(f"SELECT {cols}, sum(data_s * equiv) / 3600 AS data_gpu_h, sum(busy_s * equiv) / 3600 AS busy_gpu_h "
                      f"FROM ({_HELD}) WHERE inside GROUP BY ALL")
        return by_job_dimension(self.q(sql.job_allocated_by(keys)), used, keys).sort(keys)

    def waste_by(self, by: str, kind: str = "idle") -> pl.DataFrame:
        """Idle (or no-process: kind "nop") GPU-hours by a job dimension."""
        keys = list(JOB_DIMS[by])
        r = self.runs(kind)
        if r.is_empty():
            return pl.DataFrame(schema={**{k: pl.Utf8 for k in keys}, "gpu_h": pl.Float64})
        return r.group_by(keys).agg((pl.sum("gpu_s") / 3600).alias("gpu_h")).filter(pl.col("gpu_h") > 0).sort(keys)

    def health(self) -> pl.DataFrame:
        """Per GPU: sql.HEALTH_FROM_FACTS' figures (health is about GPUs: the job filters do not apply)."""
        return self.q(sql.HEALTH_FROM_FACTS)

    def close(self) -> None:
        self.con.close()


def edge_warnings(con: duckdb.DuckDBPyConnection, params: Params) -> list[str]:
    """A warning for each window edge inside a 5-minute bucket whose raw samples retention retired while its facts stay: the
    window's minutes of it are read raw, find no sample and count as no data - said, so it is not taken for an outage. Every
    surface says them (analyze's JSON, each window page)."""
    fp = fact_params(params)
    s, e = epoch_us(params.start), epoch_us(params.end)
    cur = con.cursor()
    try:
        if not cur.execute(HAS_FACTS).fetchall()[0][0]:
            return []
        out = []
        for lo, hi in ((s, s - s % FIVE_US + FIVE_US), (e - e % FIVE_US, e)):
            if lo % FIVE_US == hi % FIVE_US == 0:
                continue
            bind = {"lo": lo, "hi": hi, "gap_us": fp.gap_us, "cluster": params.filters.cluster, "model": params.filters.model}
            if raw_reads.read(cur, "edge", CUT_SAMPLE, bind, lo, hi, fp.gap_us).num_rows:
                continue
            b0 = lo - lo % FIVE_US
            files = fact_files_of(cur, fp.tag(), cf.GRAIN_5M, [(b0, hi)])  # (its hour's file alone, not every facts file)
            if files and cur.execute(FACT_DATA, {"files": files, "tag": fp.tag(), "b0": b0, "lo": lo, "hi": hi, "gap_us": fp.gap_us}).fetchall()[0][0]:
                out.append(f"{from_epoch_us(s if lo == s else e):%Y-%m-%dT%H:%M:%S}: this window edge falls inside a 5-minute "
                           "bucket whose raw samples retention has retired (its facts are kept): the bucket's part inside the "
                           "window has no data; an edge on the 5-minute grid gets every figure")
        return out
    finally:
        cur.close()
