"""Every SQL text the analytics run, each named once. Parameters are bound ($name), never formatted in.

Grouped by the module that runs them. A few functions assemble a query from this module's fragments or from
column names the callers hold as constants - never from a user's value.

One window (analytics/core.py: Analysis), over the store's reader views (gpufleet.collector.store.open_reader):

  cap   capacity: each inventory GPU's seconds in the window (CAPACITY).
  al    allocation intervals: the exporters' job mapping with the scheduler's start/end (ALLOCATIONS).
  ja    each job that ran in the window, with its run and allocated GPU-seconds (JOB_TABLE), joined once per window.
  the window's parts (analytics/facts.py FactWindow: wpe, wgpu) and each allocation's sums over them (alv).

The row-by-row statements of the same rules are the tests' reference: tests/support/oracle_sql.py and
tests/support/raw_analysis.py. Figures clip everything to [$start, $end) with clip_seconds().
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpufleet.analytics.raw_reads import SAMPLES
from gpufleet.collector.facts import PROFILING, THROTTLE_REASONS
from gpufleet.collector.schema import ALLOCATION_END, ALLOCATION_RUNS, ALLOCATION_START, LINE_COLUMNS, NOW_HOURS, allocations_ending_after

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def bound(query: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that `query` names ($name): DuckDB refuses an unused named parameter. Whole names: $bucket is not $bucket_us."""
    used = set(_PARAM.findall(query))
    return {k: v for k, v in values.items() if k in used}


def literal(value: Any) -> str:
    """`value` as a SQL literal, for a statement that cannot take parameters (a view)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, datetime) and value.tzinfo is None:  # (naive UTC, as every window's time)
        return f"TIMESTAMP '{value:%Y-%m-%d %H:%M:%S.%f}'"
    raise TypeError(f"no SQL literal for {type(value).__name__} {value!r}: expected None, bool, a number, str, a list or a naive datetime")


def inlined(query: str, values: Mapping[str, Any]) -> str:
    """`query` with each $name replaced by its value's literal (literal)."""
    return _PARAM.sub(lambda m: literal(values[m.group(1)]), query)


# --- fragments the queries below share ---

# the dashboards' GPU filters (a NULL filter keeps every GPU), and a GPU's (or MIG instance's) key
_FILTERS = "($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model)"
_KEY = "cluster, host, gpu_uuid, gi"

# seconds of [a, b) that fall inside [$start, $end)
CLIP = "greatest(0, epoch(least({b}, $end)) - epoch(greatest({a}, $start)))"


def clip_seconds(a: str, b: str) -> str:
    return CLIP.format(a=a, b=b)


# The one MIG share rule (capacity, data, busy, allocated, idle and cost take it from here): a MIG instance counts as its
# share of the GPU's compute slices, of 7 (A100, H100, H200) or 4 (A30). `profile`: an exporter's profile ("1g.10gb"), a
# Slurm gres type ("nvidia_a100_1g.10gb") or a Kubernetes resource ("mig-3g.40gb"); anything else is a whole GPU: 1.0.
_MIG_SLICES = "(?:^|[^0-9a-z])([1-7])g[.][0-9]+gb"  # "<slices>g.<memory>gb" after a separator
_A30_PROFILES = "(?:^|[^0-9a-z])(?:1g[.]6gb|2g[.]12gb|4g[.]24gb)"  # profiles only an A30 has


def mig_share(profile: str, model: str = "NULL") -> str:
    """SQL: the share of a whole GPU that MIG `profile` (SQL text) holds on a GPU of `model` (SQL text;
    NULL when unknown: the profile's name then decides A30 or not)."""
    p = f"lower({profile})"
    # no profile (a whole GPU, nearly every row) is decided before the costly patterns
    return f"""CASE WHEN {profile} IS NULL THEN 1.0 ELSE coalesce(try_cast(nullif(regexp_extract({p}, '{_MIG_SLICES}', 1), '') AS DOUBLE)
          / CASE WHEN coalesce({model}, '') LIKE '%A30%' OR regexp_matches({p}, '{_A30_PROFILES}') THEN 4.0 ELSE 7.0 END, 1.0) END"""


# MIG instances count as their share of the GPU (mig_share).
def gpu_equiv(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return mig_share(f"{a}mig_profile", f"{a}model")


# --- the tables of one window (analytics/core.py: Analysis) ---

# Capacity: a GPU counts from its first sighting until unseen for $retire_after (removed), never past $as_of:
# a lost GPU or one whose exporter is down still counts, as "no data"; a decommissioned one stops.
CAPACITY_END = "greatest(g.last_seen + to_seconds($max_gap), least(g.last_seen + to_seconds($retire_after), $as_of))"

CAPACITY = f"""
CREATE OR REPLACE TEMP TABLE cap AS
SELECT g.cluster, g.host, g.gpu_uuid, g.gpu_instance AS gi, g.gpu, g.model, g.mig_profile,
       {clip_seconds("g.first_seen", CAPACITY_END)} AS capacity_s,
       {gpu_equiv("g")} AS equiv
FROM gpus g
WHERE ($cluster IS NULL OR g.cluster = $cluster) AND ($model IS NULL OR g.model = $model)
  AND g.first_seen < $end AND {CAPACITY_END} > $start
"""

# JOB_FILTERS on an allocation (a) and its job (j), cluster and job key from a (a mapped job accounting lacks keeps them)
ALLOCATION_FILTERS = """($cluster IS NULL OR a.cluster = $cluster)
  AND ($account IS NULL OR j.account = $account) AND ($user_name IS NULL OR j.user_name = $user_name)
  AND ($partition IS NULL OR j.partition = $partition) AND ($job_keys IS NULL OR list_contains($job_keys, a.job_key))"""
# ... those on a job's key alone, also pushed into the reads of allocations and jobs (allocations_ending_after's `keys`)
_JOB_KEY_FILTERS = "($cluster IS NULL OR cluster = $cluster) AND ($job_keys IS NULL OR list_contains($job_keys, job_key))"

ALLOCATIONS = f"""
CREATE OR REPLACE TEMP TABLE al AS
SELECT a.cluster, a.scheduler, a.job_key, a.host, a.gpu_uuid, a.gpu_instance AS gi,
       greatest({ALLOCATION_START}, $xstart) AS a0,
       least({ALLOCATION_END}, $xend) AS a1,
       coalesce(j.job_id, a.job_key) AS job_id, j.name, j.user_name, j.account, j.partition, j.state
FROM {allocations_ending_after("$xstart", keys=_JOB_KEY_FILTERS)} a
LEFT JOIN (SELECT * FROM jobs WHERE {_JOB_KEY_FILTERS}) j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
{ALLOCATION_RUNS}
WHERE {ALLOCATION_FILTERS}
  AND least({ALLOCATION_END}, $xend) > greatest({ALLOCATION_START}, $xstart)
"""

# The GPUs (uuids) al holds: under a job filter an analysis reads these GPUs' parts alone (core.Analysis)
HELD_GPU_UUIDS = "SELECT DISTINCT gpu_uuid FROM al WHERE gpu_uuid IS NOT NULL ORDER BY gpu_uuid"
# ... and their hosts (sorted: the reads skip other hosts' files and row groups by range)
HELD_HOSTS = "SELECT DISTINCT host FROM al WHERE host IS NOT NULL ORDER BY host"

# Does any sample near the window (a sample holds at most max_gap) carry a compute-process count (dcgm-exporter has none)?
# The weekly report (dashboards/report/model.py) asks, to say whether "no process" can be known.
HAS_PROCESS_COUNTS = f"""
SELECT count(*) AS n FROM (
    SELECT 1 FROM gpu_samples
    WHERE compute_processes IS NOT NULL AND ts > $start - to_seconds($max_gap) AND ts < $end
      AND {_FILTERS}
    LIMIT 1)
"""

# --- the figures of one window (analytics/core.py: Analysis, over cap, al and the parts) ---

# Per GPU: capacity from the inventory, data / busy / held-data seconds from gpu_use (the parts' sums)
PER_GPU = """
SELECT cap.cluster, cap.host, cap.gpu, cap.gpu_uuid, cap.gi, cap.model, cap.mig_profile,
       cap.capacity_s * cap.equiv / 3600 AS capacity_gpu_h,
       coalesce(u.data_s, 0) / 3600 AS data_gpu_h,
       greatest(0, cap.capacity_s * cap.equiv - coalesce(u.data_s, 0)) / 3600 AS no_data_gpu_h,
       coalesce(u.busy_s, 0) / 3600 AS busy_gpu_h,
       least(coalesce(u.data_s, 0), coalesce(u.alloc_data_s, 0)) / 3600 AS allocated_data_gpu_h,
       greatest(0, coalesce(u.data_s, 0) - coalesce(u.alloc_data_s, 0)) / 3600 AS stranded_gpu_h,
       p.usd_per_gpu_hour
FROM cap
LEFT JOIN gpu_use u ON u.cluster = cap.cluster AND u.host = cap.host AND u.gpu_uuid = cap.gpu_uuid AND u.gi = cap.gi
LEFT JOIN prices p ON p.model = cap.model
ORDER BY cap.cluster, cap.host, cap.gpu, cap.gi
"""

# Data and busy GPU-hours per job dimension, from alv (has_piece: a sample interval overlaps the allocation)
_JOB_USE = """
SELECT {keys}, sum(data_s) / 3600 AS data_gpu_h, sum(busy_s) / 3600 AS busy_gpu_h
FROM alv WHERE has_piece GROUP BY ALL
"""

# The job filters every job query applies (NULL: no filter)
JOB_FILTERS = f"""{_JOB_KEY_FILTERS} AND ($account IS NULL OR account = $account)
  AND ($user_name IS NULL OR user_name = $user_name) AND ($partition IS NULL OR partition = $partition)"""


# The inventory's GPUs (MIG instances) with their model and share of a whole GPU (gpu_equiv): what an allocation's GPU
# counts as (JOB_MAPPED_SHARES, _MODEL_SHARES, RELIABILITY_HOST_GPU_HOURS; met on allocation_gpu)
INVENTORY_SHARES = f"(SELECT cluster, host, gpu_uuid, gpu_instance, model, {gpu_equiv('gpus')} AS equiv FROM gpus)"


def allocation_gpu(t: str) -> str:
    """Join condition: the inventory row `t` is the GPU (MIG instance) of the allocation a."""
    return " AND ".join(f"{t}.{c} = a.{c}" for c in ("cluster", "host", "gpu_uuid", "gpu_instance"))


# The mapped MIG share of each job the job mapping ever saw on a MIG instance: the mean share of the GPUs it saw the job hold
# (a job mapped to MIG instances holds those). Only those jobs' allocations are grouped, whatever the window: none where
# the fleet has no MIG instance, and no join with the jobs read (a LEFT JOIN of this on them keeps them the probe side:
# DuckDB then neither holds them in a hash table nor materializes them for a second reader).
JOB_MAPPED_SHARES = f"""(
    WITH g AS {INVENTORY_SHARES}
    SELECT a.cluster, a.scheduler, a.job_key, avg(g.equiv) AS mapped_share
    FROM allocations a
    SEMI JOIN (SELECT DISTINCT a.cluster, a.scheduler, a.job_key FROM allocations a
               JOIN (SELECT * FROM g WHERE equiv IS DISTINCT FROM 1.0) f ON {allocation_gpu("f")}) part
      ON part.cluster = a.cluster AND part.scheduler = a.scheduler AND part.job_key = a.job_key
    JOIN g ON {allocation_gpu("g")}
    GROUP BY ALL)"""


def jobs_shared(where: str, *, ran: str, attempted: str) -> str:
    """The jobs `where` keeps whose record `ran` (a condition on jobs' columns, never NULL) or that `attempted`
    (_ATTEMPTED), each with gpu_share, the MIG share of each of its `gpus` (mig_share): from the scheduler's GPU type when it
    names one MIG profile; else the job's JOB_MAPPED_SHARES; else 1. Two reads, so `ran` filters inside the Parquet scan (an
    OR with a subquery would decode every job in the store). `j` is read once (a CTE read twice is materialized, every
    column of every job: 1.6 GiB more at 4.8M jobs)."""
    return f"""(
WITH j AS (SELECT * FROM jobs WHERE ({ran}) AND {where}
           UNION ALL SELECT * FROM jobs WHERE {attempted} AND NOT ({ran}) AND {where})
SELECT j.*, CASE WHEN {mig_share("j.gpu_type")} < 1.0 AND j.gpu_type NOT LIKE '%,%' THEN {mig_share("j.gpu_type")}
                 ELSE coalesce(m.mapped_share, 1.0) END AS gpu_share
FROM j LEFT JOIN {JOB_MAPPED_SHARES} m ON m.cluster = j.cluster AND m.scheduler = j.scheduler AND m.job_key = j.job_key
)"""


# The earlier attempts of a requeued job (job_attempts), each a run that held its GPUs: from its start to its end, cut at
# the next run's start (the record in jobs is the last run); an end never read runs to the next start, else $as_of. Only
# attempts that started before $end and before the job's record (a pod's restarted containers are inside its record's
# run). Each run: the job's key, r0, r1, gpus (the attempt's count, else the job's; x gpu_share for GPU equivalents).
EARLIER_RUNS = """(
    SELECT cluster, scheduler, job_key, r0, coalesce(least(r1, nxt), $as_of) AS r1, gpus FROM (
        SELECT p.cluster, p.scheduler, p.job_key, p.start AS r0, p."end" AS r1, coalesce(p.gpus, j.gpus) AS gpus,
               coalesce(lead(p.start) OVER (PARTITION BY p.cluster, p.scheduler, p.job_key ORDER BY p.start), j.start) AS nxt
        FROM job_attempts p JOIN jobs j
          ON p.cluster = j.cluster AND p.scheduler = j.scheduler AND p.job_key = j.job_key AND (j.start IS NULL OR p.start < j.start)
        WHERE p.start < $end))"""


# a job with an attempt that started before $end ({also}: and ...): a semi join on the few jobs with attempts (EXISTS is slower)
_ATTEMPTED = ("(cluster, scheduler, job_key) IN (SELECT cluster, scheduler, job_key FROM job_attempts "
              "WHERE start < $end{also})")
# Allocated GPU-seconds from scheduler accounting: GPUs x MIG share x run time inside the window (a running job
# until $as_of) over every run: its record's and its EARLIER_RUNS; under a GPU model filter, x the job's share on that
# model (_MODEL_SHARES). An unknown GPU count (jobs.gpus NULL) gives
# unknown allocated GPU-seconds, never 0: sums leave it out, UNKNOWN_GPU_JOBS says so. `runs` (r0, r1, gpus; the
# record's run last, for the timeline): only of a job with earlier runs, else NULL.
_RECORD_RUN_END = 'coalesce(j."end", $as_of)'
_RUN = f"CASE WHEN j.start IS NOT NULL THEN {clip_seconds('j.start', _RECORD_RUN_END)} ELSE 0 END"
# the job {t}'s record ran in the window
_RAN_IN_WINDOW = '{t}.start IS NOT NULL AND {t}.start < $end AND coalesce({t}."end", $as_of) > $start'


def window_jobs(only: str = "") -> str:
    """The jobs (JOB_FILTERS{only}) whose record ran in the window or that had an attempt in it, each with gpu_share
    (jobs_shared): the allocated figures' jobs (JOB_ALLOCATED) and the reliability report's (_attempt_rows), one set."""
    return jobs_shared(JOB_FILTERS + only, ran=_RAN_IN_WINDOW.format(t="jobs"),
                       attempted=_ATTEMPTED.format(also=' AND coalesce("end", $as_of) > $start'))


# Under a GPU model filter ($model), each job's share of its mapped GPU-equivalents on that model: every allocation of the
# jobs `j` (a job's GPUs are the job's, whenever the mapping saw them: a running job's last sighting may lie before the
# window), each GPU at its MIG share, on the inventory's models (a GPU the inventory lacks has none). A job the mapping never
# saw on a GPU of known model has no row: its model is unknown. Read nothing without a model filter (DuckDB folds the
# $model IS NOT NULL away).
_MODEL_SHARES = f"""(
    SELECT a.cluster, a.scheduler, a.job_key, sum(CASE WHEN g.model = $model THEN g.equiv ELSE 0 END) / sum(g.equiv) AS model_share
    FROM allocations a SEMI JOIN j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
    JOIN {INVENTORY_SHARES} g ON {allocation_gpu("g")} AND g.model IS NOT NULL
    WHERE $model IS NOT NULL
    GROUP BY ALL)"""
# ... and a job's factor in the allocated figures: that share under a model filter (a job the filter's model holds no part
# of, or of unknown model, is not the filter's: JOB_ALLOCATED leaves it out, MODEL_UNKNOWN_JOBS counts those of unknown
# model), else 1
_MODEL_FACTOR = "CASE WHEN $model IS NULL THEN 1.0 ELSE ms.model_share END"

# A job's allocated GPU-seconds on every model: its runs' GPUs x MIG share x time in the window
_JOB_GPU_S = f"j.gpu_share * (j.gpus * {_RUN} + coalesce(e.gpu_s, 0))"


def _window_job_rows(select: str, where: str) -> str:
    """SQL: `select` over the window's jobs (window_jobs: j, with their earlier runs e and, under a model filter, their
    model share ms) whose record or an earlier run ran in the window, and `where`."""
    return f"""
WITH j AS {window_jobs()},
e AS (
    SELECT cluster, scheduler, job_key, sum({clip_seconds("r0", "r1")}) AS run_s, sum(gpus * {clip_seconds("r0", "r1")}) AS gpu_s,
           list(struct_pack(r0 := r0, r1 := r1, gpus := gpus) ORDER BY r0) AS runs
    FROM {EARLIER_RUNS} WHERE r1 > $start GROUP BY ALL
)
SELECT {select}
FROM j LEFT JOIN e ON e.cluster = j.cluster AND e.scheduler = j.scheduler AND e.job_key = j.job_key
LEFT JOIN {_MODEL_SHARES} ms ON ms.cluster = j.cluster AND ms.scheduler = j.scheduler AND ms.job_key = j.job_key
WHERE (({_RAN_IN_WINDOW.format(t="j")}) OR e.run_s > 0) AND {where}
"""


JOB_ALLOCATED = _window_job_rows(f"""j.cluster, j.scheduler, j.job_key, j.job_id, j.name, j.user_name, j.account, j.partition, j.state, j.gpus,
       j.gpu_type, j.gpu_share, j.gpus_source, j.submit, j.start, j."end",
       {_RUN} + coalesce(e.run_s, 0) AS run_s, {_MODEL_FACTOR} AS model_share, {_MODEL_FACTOR} * {_JOB_GPU_S} AS alloc_gpu_s,
       CASE WHEN e.runs IS NOT NULL AND j.start IS NOT NULL
            THEN list_append(e.runs, struct_pack(r0 := j.start, r1 := {_RECORD_RUN_END}, gpus := j.gpus))
            ELSE e.runs END AS runs""", "($model IS NULL OR ms.model_share > 0)")
# The window's jobs a GPU model filter leaves out for want of a model (no GPU of known model mapped to them): how many, and
# their allocated GPU-hours on whatever model (the known jobs' alone where a GPU count is unknown)
MODEL_UNKNOWN_JOBS = _window_job_rows(f"count(*) AS n, sum({_JOB_GPU_S}) / 3600 AS gpu_h", "$model IS NOT NULL AND ms.model_share IS NULL")
# The keys of the jobs whose id as people write it is $job (of cluster $cluster, if set): an equality the scans filter on
# (a job's id or key in one OR is filtered in neither scan)
_JOBS_BY_ID = "SELECT cluster, scheduler, job_key FROM jobs WHERE job_id = $job AND ($cluster IS NULL OR cluster = $cluster)"
# ... and of those whose key is $job, first by cluster, scheduler and key; and one key's row of the window's job table
# (JOB_ALLOCATED under its key as the job filter: what ja holds of it), for a job's report drawn before the window's
# figures (jobs.job_row)
JOB_NAMED_KEYS = f"""{_JOBS_BY_ID}
UNION SELECT cluster, scheduler, job_key FROM jobs WHERE job_key = $job AND ($cluster IS NULL OR cluster = $cluster)
ORDER BY cluster, scheduler, job_key"""
JOB_NAMED_ROW = f"SELECT * EXCLUDE (runs) FROM ({JOB_ALLOCATED}) WHERE scheduler = $of_scheduler"
# ... computed once per analysis as the temp table ja, which every job query below reads
JOB_TABLE = f"CREATE OR REPLACE TEMP TABLE ja AS {JOB_ALLOCATED}"

ALLOCATION_ALL = "SELECT rowid AS i, * FROM al"


def allocation_text(columns: Sequence[str]) -> str:
    """al's rows whose row numbers are in _rows, with that number (i): `columns` (never user input; "*": all)."""
    return f"SELECT rowid AS i, {', '.join(columns)} FROM al WHERE rowid IN (SELECT i FROM _rows)"


# alv: al's rows, in order, beside their sums over the parts (_alv_use: GPU id in the parts, data_s, busy_s, has_piece)
ALLOCATION_USE = "CREATE OR REPLACE TEMP VIEW alv AS SELECT al.*, u.* FROM al POSITIONAL JOIN _alv_use u"



def job_use(keys: Sequence[str]) -> str:
    """JOB_USE grouped by `keys`: column names from core.JOB_DIMS, never user input."""
    return _JOB_USE.format(keys=", ".join(keys))


def job_allocated_by(keys: Sequence[str]) -> str:
    """Allocated GPU-hours (JOB_ALLOCATED) grouped by `keys` (core.JOB_DIMS, never user input): the known jobs'
    sum (NULL when none is known), with how many jobs of the group have an unknown GPU count."""
    return (f"SELECT {', '.join(keys)}, sum(alloc_gpu_s) / 3600 AS allocated_gpu_h, "
            f"count(*) FILTER (WHERE gpus IS NULL) AS gpus_unknown_jobs FROM ja GROUP BY ALL")


# the GPUs, run time and allocated GPU-hours of each job in _jobs (its key), for the ranking of wasteful jobs
JOB_RUNTIMES = """SELECT cluster, scheduler, job_key, gpus, run_s / 3600 AS runtime_h, alloc_gpu_s / 3600 AS allocated_gpu_h
FROM ja SEMI JOIN _jobs USING (cluster, scheduler, job_key)"""

# the window's allocated GPU-hours: 0 with no job, else the known jobs' sum (a lower bound: unknown_jobs counts
# the rest), NULL (never 0) when no job's count is known
ALLOCATED_GPU_H_TOTAL = """SELECT CASE WHEN count(*) = 0 THEN 0.0 ELSE sum(alloc_gpu_s) / 3600 END AS h,
       count(*) FILTER (WHERE gpus IS NULL) AS unknown_jobs FROM ja"""
# Slurm jobs by where their GPU count came from (analytics.health.job_gpu_sources, the Health page)
JOB_GPU_SOURCES = """SELECT cluster, CASE WHEN gpus IS NULL THEN 'unknown' ELSE coalesce(gpus_source, 'unnamed') END AS gpus_source,
       count(*) AS jobs, count("end") AS ended
FROM jobs WHERE scheduler = 'slurm' GROUP BY ALL ORDER BY cluster, gpus_source"""
# the window's jobs whose GPU count is unknown: how many, and the first few as people write them
UNKNOWN_GPU_JOBS = "SELECT count(*) AS n, list(job_id ORDER BY job_id)[:5] AS first FROM ja WHERE gpus IS NULL"

# --- the job list (analytics/jobs.py) ---

JOB_ROWS = "SELECT * EXCLUDE (runs) FROM ja"

# --- utilization over time (analytics/timeline.py) ---

BUCKET_ORIGIN = "epoch($origin)"  # bucket k is [$origin + k x $bucket, $origin + (k + 1) x $bucket); $origin <= $start


def split_at_buckets(src: str, a: str, b: str, cols: str) -> str:
    """Rows of `src` with [a, b) clipped to the window and split at bucket edges: cols, k (bucket index), s
    (seconds in the bucket). Arguments are this module's SQL text, never user input."""
    return f"""
    WITH x AS (
        SELECT {cols}, epoch(greatest({a}, $start)) AS ea, epoch(least({b}, $end)) AS eb
        FROM {src} WHERE {b} > $start AND {a} < $end
    ), y AS (
        SELECT *, unnest(range(floor((ea - {BUCKET_ORIGIN}) / $bucket)::BIGINT, ceil((eb - {BUCKET_ORIGIN}) / $bucket)::BIGINT)) AS k FROM x WHERE eb > ea
    )
    SELECT {cols}, k, least(eb, {BUCKET_ORIGIN} + (k + 1) * $bucket) - greatest(ea, {BUCKET_ORIGIN} + k * $bucket) AS s FROM y"""


_TIMELINE_GPU_COLS = "cluster, model, "
_TIMELINE_JOB_COLS = "cluster, partition, account, user_name, "

# inventory capacity per cluster, model and bucket (as CAPACITY counts it)
_CAPACITY_SPANS = f"""(SELECT g.cluster, g.model, g.first_seen AS c0, {CAPACITY_END} AS c1, {gpu_equiv('g')} AS equiv
                       FROM gpus g WHERE ($cluster IS NULL OR g.cluster = $cluster) AND ($model IS NULL OR g.model = $model))"""
TIMELINE_CAPACITY = (f"SELECT {_TIMELINE_GPU_COLS} k, sum(s * equiv) / 3600 AS capacity_gpu_h "
                     f"FROM ({split_at_buckets(_CAPACITY_SPANS, 'c0', 'c1', _TIMELINE_GPU_COLS + 'equiv')}) GROUP BY ALL")

# a job holds alloc_gpu_s / run_s GPUs (count x MIG share x model share) each second it runs; one with earlier attempts, each
# run's (ja.runs). An unknown count is left out of a bucket's sum: NULL, never 0, where every job's is unknown
_JOB_RUNS = f"""(
    SELECT {_TIMELINE_JOB_COLS} start, coalesce("end", $as_of) AS run_end, alloc_gpu_s / nullif(run_s, 0) AS rate FROM ja WHERE runs IS NULL
    UNION ALL
    SELECT {_TIMELINE_JOB_COLS} r.r0, r.r1, r.gpus * gpu_share * model_share FROM (SELECT *, unnest(runs) AS r FROM ja WHERE runs IS NOT NULL))"""
TIMELINE_ALLOCATED = f"""
SELECT {_TIMELINE_JOB_COLS} k, sum(s * rate) / 3600 AS allocated_gpu_h
FROM ({split_at_buckets(_JOB_RUNS, 'start', 'run_end', _TIMELINE_JOB_COLS + 'rate')}) GROUP BY ALL"""

# --- MFU (analytics/mfu.py) ---

# Per job: the GPUs it held, each with its model, MIG share and the model's peak ({h}: a row per allocation - job key {key},
# model, equiv, held_s: seconds held in the window; {named}: the job's own columns), in one pass; a job's models as rows
# only where odd (several models, or one without a peak, unlisted included). hp and held are not materialized (cheaper).
_MFU_HELD = """h AS ({h}
), hp AS NOT MATERIALIZED (  -- each held GPU with its model's peak
    SELECT h.*, pk.peak_tflops, pk.model IS NOT NULL AS listed, h.held_s * h.equiv AS w
    FROM h LEFT JOIN mfu_peaks pk ON pk.model = h.model
    WHERE h.held_s > 0
), held1 AS (
    SELECT {key}{named}, count(*) AS mapped_gpus, sum(equiv) AS gpu_equiv, sum(w) AS held_gpu_s,
           min(model) AS model, min(model) IS DISTINCT FROM max(model) AS several_models,
           bool_or(model IS NULL) AS model_missing,
           bool_or(model IS NOT NULL AND peak_tflops IS NULL) AS odd,
           sum(peak_tflops * w) / nullif(sum(w), 0) AS peak_tflops,{tensor}
    FROM hp
    GROUP BY {key}
), odd AS (
    SELECT {key}, string_agg(model, ', ' ORDER BY model) AS model,
           list(model ORDER BY model) FILTER (WHERE model IS NOT NULL AND peak_tflops IS NULL) AS no_peak,
           list(model ORDER BY model) FILTER (WHERE model IS NOT NULL AND NOT listed) AS not_listed
    FROM (SELECT DISTINCT {key}, model, peak_tflops, listed
          FROM hp SEMI JOIN (SELECT {key} FROM held1 WHERE several_models OR odd) o USING ({key}))
    GROUP BY {key}
), held AS NOT MATERIALIZED (
    SELECT h.* EXCLUDE (model, several_models, odd), coalesce(o.model, h.model) AS model, o.no_peak, o.not_listed
    FROM held1 h LEFT JOIN odd o USING ({key})
)"""
# ... of al's allocations with the inventory, beside their tensor use (mfu_detail: mfu.tensor_detail's, a row per
# al row), summed per job over allocations with a piece inside the window: tensor_s, est_s and scaled_s where any
# piece knew tensor activity (scaled_s: and a boost clock), data_s where the job has a piece; NULL otherwise
_MFU_TENSOR = """
           CASE WHEN bool_or(t) THEN sum(tensor_s) FILTER (WHERE piece) END AS tensor_s,
           CASE WHEN bool_or(t) THEN coalesce(sum(est_s) FILTER (WHERE t), 0) END AS est_s,
           CASE WHEN bool_or(tk) THEN coalesce(sum(scaled_s) FILTER (WHERE t), 0) END AS scaled_s,
           CASE WHEN bool_or(piece) THEN coalesce(sum(any_s) FILTER (WHERE piece), 0) END AS data_s"""
_MFU_HELD_ALLOCATIONS = _MFU_HELD.format(h=f"""
    SELECT al.cluster, al.scheduler, al.job_key, al.job_id, al.account, al.user_name, g.model,
           {gpu_equiv("g")} AS equiv, {clip_seconds("al.a0", "al.a1")} AS held_s, al.piece, al.t, al.tk, al.tensor_s, al.est_s, al.scaled_s, al.any_s
    FROM (SELECT * FROM al POSITIONAL JOIN mfu_detail) al LEFT JOIN gpus g
      ON g.cluster = al.cluster AND g.host = al.host AND g.gpu_uuid = al.gpu_uuid AND g.gpu_instance = al.gi""",
    key="cluster, scheduler, job_key", named=", any_value(job_id) AS job_id, any_value(account) AS account, any_value(user_name) AS user_name",
    tensor=_MFU_TENSOR)
# Per job: its throughput reports in the window (r; {r_cols}: their job's key), summed (rep; {key}:
# what held and acct, the job's held GPUs and accounting, are joined on)
_MFU_REPORTS = """r AS (
    SELECT {r_cols}, reports, flops, gpus, basis
    FROM job_throughput
    WHERE ts < $end AND ts + INTERVAL 1 HOUR > $start AND ($cluster IS NULL OR cluster = $cluster)
), rep AS (
    SELECT {rep_cols}, sum(r.reports) AS reports,
           sum(r.flops * r.reports) / nullif(sum(coalesce(r.gpus, held.gpu_equiv, acct.gpus) * r.reports), 0) AS flops_per_gpu,
           bool_and(coalesce(r.gpus, held.gpu_equiv, acct.gpus) IS NOT NULL) AS gpus_known,
           string_agg(DISTINCT r.basis, ',' ORDER BY r.basis) AS basis
    FROM r LEFT JOIN held USING ({key}) LEFT JOIN acct USING ({key})
    GROUP BY ALL
)"""
# ... and a job's figures from its held GPUs (held, with their tensor activity), accounting (acct, of jobs with GPUs),
# the models of its GPUs without a boost clock (nb: mfu._no_boost's) and reports (rep)
_MFU_FIGURES = """held.model, coalesce(acct.gpus, held.mapped_gpus) AS gpus,
       coalesce(acct.alloc_gpu_s, held.held_gpu_s) / 3600 AS gpu_h,  -- NULL: unknown (a job that reports, of unknown GPU count), never 0
       held.mapped_gpus IS NOT NULL AS mapped, held.model_missing, held.no_peak, held.not_listed, held.peak_tflops,
       held.tensor_s, held.est_s, held.scaled_s, nb.no_boost, held.data_s,
       rep.reports, rep.flops_per_gpu, rep.gpus_known, rep.basis"""

# Per job (held GPUs in the window, accounted with GPUs, or reporting): what mfu.decide_all reads, in the jobs'
# order; held GPUs and tensor use from the analysis' allocations (al, mfu_detail), by the job's key
_JOB_COLUMNS = "cluster, scheduler, job_key"
MFU_JOBS = f"""
WITH acct AS (
    SELECT cluster, scheduler, job_key, job_id, user_name, account, gpus, alloc_gpu_s
    FROM ja WHERE gpus > 0
), {_MFU_HELD_ALLOCATIONS}, {_MFU_REPORTS.format(r_cols=_JOB_COLUMNS, rep_cols="r.cluster, r.scheduler, r.job_key", key=_JOB_COLUMNS)}, alone AS (
    -- a job that only reports: under a job filter, one of the filter's jobs only (the job table's)
    SELECT DISTINCT cluster, scheduler, job_key, true AS listed FROM r
    WHERE $account IS NULL AND $user_name IS NULL AND $partition IS NULL AND $job_keys IS NULL
    UNION SELECT cluster, scheduler, job_key, true FROM r SEMI JOIN ja USING (cluster, scheduler, job_key)
)
SELECT cluster, scheduler, job_key,
       coalesce(acct.job_id, held.job_id, job_key) AS job_id,
       coalesce(acct.account, held.account) AS account, coalesce(acct.user_name, held.user_name) AS user_name,
       {_MFU_FIGURES}
FROM acct
FULL JOIN held USING (cluster, scheduler, job_key)
FULL JOIN (SELECT * FROM rep LEFT JOIN alone USING (cluster, scheduler, job_key)) rep USING (cluster, scheduler, job_key)
LEFT JOIN mfu_no_boost nb USING (cluster, scheduler, job_key)
WHERE acct.gpus IS NOT NULL OR held.mapped_gpus IS NOT NULL OR rep.listed
ORDER BY cluster, scheduler, job_key
"""
# --- fairness (analytics/fairness.py) ---

# demand and usage: the jobs known to hold GPUs (unknown counts apart: fairness.per_account's gpus_unknown_jobs, unknown_demand)
_GPU_JOBS = f"gpus > 0 AND {JOB_FILTERS}"
# queue waits: those and the jobs of unknown GPU count (their wait is known; their size is not)
_WAITING_JOBS = f"(gpus > 0 OR gpus IS NULL) AND {JOB_FILTERS}"

# the labels of fairness.BUCKETS, and "unknown" (fairness.UNKNOWN_SIZE) for a job of unknown GPU count
_GPUS_BUCKET = "CASE WHEN gpus IS NULL THEN 'unknown' WHEN gpus = 1 THEN '1' WHEN gpus <= 4 THEN '2-4' WHEN gpus <= 8 THEN '5-8' ELSE '9+' END"

FAIRNESS_USERS = f"""
WITH d AS (
    SELECT coalesce(account, '') AS account, coalesce(user_name, '') AS user_name, count(*) AS jobs
    FROM jobs WHERE {_GPU_JOBS} AND coalesce(submit, start) < $end AND coalesce("end", $as_of) > $start
    GROUP BY ALL
), u AS (
    SELECT coalesce(account, '') AS account, coalesce(user_name, '') AS user_name, sum(alloc_gpu_s) / 3600 AS used_gpu_h
    FROM ja WHERE gpus > 0 GROUP BY ALL
)
SELECT account, user_name, coalesce(d.jobs, 0) AS jobs, coalesce(u.used_gpu_h, 0.0) AS used_gpu_h
FROM d FULL JOIN u USING (account, user_name) ORDER BY account, user_name"""

# GPU-seconds of every run (EARLIER_RUNS too) weighted 2^(-age/h), age from the window end, integrated exactly:
# the integral of 2^(-(W-t)/h) dt from t0 to t1 is h/ln2 * (2^(-(W-t1)/h) - 2^(-(W-t0)/h)).
_DECAY_RUN_END = "greatest(r0, least(r1, $end))"
FAIRNESS_DECAYED = f"""
WITH j AS {jobs_shared(_GPU_JOBS, ran="start IS NOT NULL AND start < $end", attempted=_ATTEMPTED.format(also=''))},
runs AS (
    SELECT account, start AS r0, coalesce("end", $as_of) AS r1, gpus * gpu_share AS rate FROM j WHERE start IS NOT NULL AND start < $end
    UNION ALL
    SELECT j.account, e.r0, e.r1, e.gpus * j.gpu_share FROM {EARLIER_RUNS} e JOIN j USING (cluster, scheduler, job_key)
)
SELECT coalesce(account, '') AS account,
       sum(rate * $half_life / ln(2) * (pow(2, -(epoch($end) - epoch({_DECAY_RUN_END})) / $half_life)
                                        - pow(2, -(epoch($end) - epoch(r0)) / $half_life))) / 3600 AS decayed_gpu_h
FROM runs
GROUP BY ALL"""

FAIRNESS_STARTED = f"""
SELECT coalesce(account, '') AS account, gpus, {_GPUS_BUCKET} AS gpus_bucket,
       (epoch(start) - epoch(coalesce(submit, start)))::DOUBLE AS wait_s
FROM jobs WHERE {_WAITING_JOBS} AND start >= $start AND start < $end"""

FAIRNESS_PENDING = f"""
SELECT cluster, scheduler, job_key, job_id, coalesce(account, '') AS account, coalesce(user_name, '') AS user_name,
       gpus, {_GPUS_BUCKET} AS gpus_bucket, submit, (epoch($as_of) - epoch(submit))::DOUBLE AS wait_s
FROM jobs WHERE {_WAITING_JOBS} AND submit < $as_of AND coalesce(start, "end", $as_of) >= $as_of
ORDER BY wait_s DESC, cluster, job_key"""

# --- queue gaps (analytics/queue_gaps.py) ---

# A pool is a partition's whole GPUs (no MIG instances) of one model that its jobs held in the window or the $retire_after
# before it, each from its first sighting to CAPACITY_END (epoch us, clipped to [$start, $as_of))
_POOL_FILTERS = "($cluster IS NULL OR a.cluster = $cluster) AND ($partition IS NULL OR j.partition = $partition)"
# a GPU named by one number (its key's hash), as the pools' GPUs and the holds are matched
_QUEUE_GPU = "hash({t}.cluster, {t}.host, {t}.gpu_uuid) AS gh"
QUEUE_POOL_GPUS = f"""
WITH used AS (
    SELECT DISTINCT a.cluster, j.partition, a.host, a.gpu_uuid
    FROM {allocations_ending_after("$start - to_seconds($retire_after)")} a
    JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
    {ALLOCATION_RUNS}
    WHERE a.gpu_instance = -1 AND j.partition IS NOT NULL AND {_POOL_FILTERS}
      AND {ALLOCATION_END} > $start - to_seconds($retire_after) AND {ALLOCATION_START} < $as_of
)
SELECT u.cluster, u.partition, g.model, g.host, g.gpu_uuid, {_QUEUE_GPU.format(t="g")},
       epoch_us(greatest(g.first_seen, $start)) AS c0, epoch_us(least({CAPACITY_END}, $as_of)) AS c1
FROM used u JOIN gpus g ON g.cluster = u.cluster AND g.host = u.host AND g.gpu_uuid = u.gpu_uuid AND g.gpu_instance = -1
WHERE g.model IS NOT NULL AND g.first_seen < $as_of AND {CAPACITY_END} > $start
ORDER BY u.cluster, u.partition, g.model, g.host, g.gpu_uuid"""

# Who held each GPU when (any job, any partition; a MIG instance held holds its GPU), clipped to [$start, $as_of)
QUEUE_HOLDS = f"""
SELECT {_QUEUE_GPU.format(t="a")}, epoch_us(greatest({ALLOCATION_START}, $start)) AS h0, epoch_us(least({ALLOCATION_END}, $as_of)) AS h1
FROM {allocations_ending_after("$start")} a LEFT JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
{ALLOCATION_RUNS}
WHERE ($cluster IS NULL OR a.cluster = $cluster) AND {ALLOCATION_END} > $start AND {ALLOCATION_START} < $as_of
  AND {ALLOCATION_END} > {ALLOCATION_START}"""

# The jobs that waited in [$start, $as_of): from eligible (else submit; a requeued job from its last attempt's end)
# to their start (else end: cancelled pending; else $as_of), with their GPUs' main model and whether on MIG
_QUEUED_FROM = "greatest(coalesce(j.eligible, j.submit), r.requeued)"
QUEUE_WAITS = f"""
WITH r AS (SELECT cluster, scheduler, job_key, max("end") AS requeued FROM job_attempts GROUP BY ALL),
w AS (
    SELECT j.cluster, j.scheduler, j.job_key, j.job_id, j.account, j.user_name, j.partition, j.gpus,
           epoch_us(greatest({_QUEUED_FROM}, $start)) AS w0, epoch_us(least(coalesce(j.start, j."end", $as_of), $as_of)) AS w1
    FROM jobs j LEFT JOIN r ON r.cluster = j.cluster AND r.scheduler = j.scheduler AND r.job_key = j.job_key
    WHERE (j.gpus > 0 OR j.gpus IS NULL) AND j.partition IS NOT NULL AND {_QUEUED_FROM} < $as_of
      AND coalesce(j.start, j."end", $as_of) > $start AND coalesce(j.start, j."end", $as_of) > {_QUEUED_FROM}
      AND ($cluster IS NULL OR j.cluster = $cluster) AND ($partition IS NULL OR j.partition = $partition)
), got AS (  -- (the allocations of the jobs that waited alone: never the store's whole history)
    SELECT a.cluster, a.scheduler, a.job_key, g.model, count(*) AS n, bool_or(a.gpu_instance <> -1) AS on_mig
    FROM allocations a SEMI JOIN w ON w.cluster = a.cluster AND w.scheduler = a.scheduler AND w.job_key = a.job_key
    JOIN gpus g ON {allocation_gpu("g")}
    GROUP BY ALL
), jm AS (
    SELECT cluster, scheduler, job_key, arg_max(model, n) AS model, bool_or(on_mig) AS on_mig FROM got GROUP BY ALL
)
SELECT w.cluster, w.scheduler, w.job_key, w.job_id, w.account, w.user_name, w.partition, w.gpus, jm.model, coalesce(jm.on_mig, false) AS on_mig,
       w.w0, w.w1
FROM w LEFT JOIN jm ON jm.cluster = w.cluster AND jm.scheduler = w.scheduler AND jm.job_key = w.job_key
ORDER BY w.cluster, w.partition, w.w0, w.job_key"""

# --- the fleet at one moment (analytics/fleet_now.py) ---

# XID code, volatile double-bit ECC errors or a row-remap failure in a fresh sample
GPU_ERROR_PRED = "coalesce(xid_last, 0) > 0 OR coalesce(ecc_dbe_vol, 0) > 0 OR coalesce(remap_failure, 0) > 0"

# The look-back's runs, a row per GPU (or MIG instance) and stretch of samples (NOW_HOURS' now_* columns, composed by
# GPU_STATES), written by fleet_now.now_rows from the facts' lead parts (FACT_NOW_ROWS: facts.RUN_MARKS) and later raw
# samples (NOW_RAW_ROWS, per hour); the newest go to now_latest (NOW_NEWEST_AT: of GPUs whose newest lies in the facts).
_NOW_MARKS = ("first_sample_ts", "last_sample_ts", "last_busy_ts", "idle_after_busy_ts", "first_idle_ts", "last_gap_ts", "idle_in_stretch_ts",
              "last_proc_ts", "noproc_after_proc_ts", "first_noproc_ts", "noproc_in_stretch_ts")
NOW_MARK_COLUMNS = ("now_first", "now_last", "now_last_busy", "now_idle_after_busy", "now_first_idle", "now_last_gap", "now_idle_in_stretch",
                    "now_last_proc", "now_noproc_after_proc", "now_first_noproc", "now_noproc_in_stretch")
FACT_NOW_ROWS = f"""
SELECT cluster, host, gpu_uuid, gi, {", ".join(f"make_timestamp({f}) AS {n}" for f, n in zip(_NOW_MARKS, NOW_MARK_COLUMNS))}
FROM read_parquet($files, hive_partitioning = false)
WHERE tag = $tag AND grain_s = $grain AND bucket >= make_timestamp($lo) AND bucket < make_timestamp($hi) AND lead
  AND first_sample_ts IS NOT NULL AND {_FILTERS}
"""
NOW_RAW_ROWS = NOW_HOURS.format(source=SAMPLES, where=f"ts >= make_timestamp($lo) AND ts < make_timestamp($hi) AND {_FILTERS}")
# The last XID code and its time per GPU and span of (as_of - forget_after, as_of], for fleet_now.xid_rows' temp
# table xid_rows (GPU_STATES takes each GPU's latest): from the facts' lead parts (xid_codes), else raw samples
FACT_XID_ROWS = f"""
SELECT cluster, host, gpu_uuid, gi, arg_max(c.code, c.last_ts) AS xid, make_timestamp(max(c.last_ts)) AS xid_at
FROM (SELECT cluster, host, gpu_uuid, gi, unnest(xid_codes) AS c FROM read_parquet($files, hive_partitioning = false)
      WHERE tag = $tag AND grain_s = $grain AND bucket >= make_timestamp($lo) AND bucket < make_timestamp($hi) AND lead
        AND xid_codes IS NOT NULL AND {_FILTERS})
GROUP BY ALL
"""
RAW_XID_ROWS = f"""
SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::SMALLINT AS gi, arg_max(xid_last, ts) AS xid, max(ts) AS xid_at
FROM {SAMPLES}
WHERE ts >= make_timestamp($lo) AND ts < make_timestamp($hi) AND xid_last > 0 AND {_FILTERS}
GROUP BY ALL
"""
XID_ROWS_TABLE = "CREATE OR REPLACE TEMP TABLE xid_rows (cluster VARCHAR, host VARCHAR, gpu_uuid VARCHAR, gi SMALLINT, xid BIGINT, xid_at TIMESTAMP)"
# the GPUs whose newest sample in now_rows is not among now_latest's, with its time
NOW_WANT = f"""
SELECT {_KEY}, max(now_last) AS ts FROM now_rows GROUP BY {_KEY}
HAVING max(now_last) > coalesce(max(now_last) FILTER (WHERE from_raw), '-infinity'::TIMESTAMP)
"""
# their newest samples, as NOW_RAW_ROWS' rows; $lo and $hi the least and largest time wanted
NOW_NEWEST_AT = NOW_HOURS.format(
    source=f"{SAMPLES} g",
    where=f"ts >= $lo AND ts <= $hi AND {_FILTERS} AND EXISTS (SELECT 1 FROM now_want w WHERE w.ts = g.ts AND "
          "w.cluster IS NOT DISTINCT FROM g.cluster AND w.host IS NOT DISTINCT FROM g.host AND "
          "w.gpu_uuid IS NOT DISTINCT FROM g.gpu_uuid AND w.gi = coalesce(g.gpu_instance, -1))")


def _run_start(what: str, last: str, after: str) -> str:
    """The first `what` sample (idle, noproc) after the GPU's `last` busy (or process) sample, from its hours'
    runs (NOW_HOURS): in that sample's hour, else a later hour's first; no `last`: the first looked at."""
    first = f"now_first_{what}"
    return (f"CASE WHEN any_value({last}) IS NULL THEN min({first}) "
            f"ELSE coalesce(max({after}) FILTER (WHERE now_{last} = {last}), min({first}) FILTER (WHERE now_first > {last})) END")


def _stretch_run_start(what: str) -> str:
    """The first `what` sample from the start of the current stretch of data (data_from) on: in
    data_from's hour, else the first of a later hour."""
    return (f"coalesce(max(now_{what}_in_stretch) FILTER (WHERE now_first <= data_from AND data_from <= now_last), "
            f"min(now_first_{what}) FILTER (WHERE now_first > data_from))")


GPU_STATES = f"""
WITH inv AS (
    SELECT cluster, host, gpu_uuid, gpu_instance AS gi, gpu AS inv_gpu, model AS inv_model, mig_profile AS inv_mig, fb_total_mib
    FROM gpus
    WHERE first_seen <= $as_of AND last_seen >= $as_of - to_seconds($forget_after)
      AND {_FILTERS}
), c AS (
    -- each GPU's runs over the look-back's samples, a row (a part, an hour) at a time (composed below)
    SELECT * FROM now_rows
), c1 AS (
    -- a row whose first sample follows a gap longer than max_gap (or is the first looked at)
    -- starts a stretch of continuous data there, unless a gap within it starts a later one
    SELECT *, coalesce(now_last_gap, CASE WHEN coalesce(epoch_us(now_first) - epoch_us(lag(now_last) OVER (PARTITION BY {_KEY} ORDER BY now_first))
                                                        > $max_gap_us, true) THEN now_first END) AS stretch_from
    FROM c
), c2 AS (
    SELECT *, max(now_last_busy) OVER g AS last_busy, max(now_last_proc) OVER g AS last_proc, max(stretch_from) OVER g AS data_from
    FROM c1 WINDOW g AS (PARTITION BY {_KEY})
), r AS (
    -- the idle run: the samples after the last busy one (a gap without data does not end it:
    -- nothing busy was seen); no busy sample in the look-back: idle since before its first sample.
    -- The same run rule for "no compute process at all" (the idle policy's faster rule).
    SELECT {_KEY}, any_value(last_busy) AS last_busy, any_value(last_proc) AS last_proc, any_value(data_from) AS data_from,
           {_run_start("idle", "last_busy", "now_idle_after_busy")} AS run_start,
           {_run_start("noproc", "last_proc", "now_noproc_after_proc")} AS noproc_start,
           {_stretch_run_start("idle")} AS idle_from_data, {_stretch_run_start("noproc")} AS noproc_from_data
    FROM c2 GROUP BY {_KEY}
), runs AS (
    -- the same runs within the current stretch of continuous data (what the idle policy acts on:
    -- time without data is never counted as idle): the run's start where the stretch began
    -- before it, else the stretch's first such sample
    SELECT {_KEY}, last_busy, run_start, noproc_start,
           CASE WHEN last_busy IS NULL OR data_from > last_busy THEN idle_from_data ELSE run_start END AS data_run_start,
           CASE WHEN last_proc IS NULL OR data_from > last_proc THEN noproc_from_data ELSE noproc_start END AS data_noproc_start
    FROM r
), x AS (
    -- the last XID code each GPU reported while it was known (the samples of a GPU that fell
    -- off the bus carry none: its XID is in the samples before), composed from xid_rows
    SELECT cluster, host, gpu_uuid, gi, arg_max(xid, xid_at) AS last_xid, max(xid_at) AS last_xid_at
    FROM xid_rows GROUP BY ALL
), latest AS (
    -- each GPU's newest sample (one of them where two share its time)
    SELECT {_KEY}, unnest(newest) FROM (SELECT {_KEY}, arg_max(now_newest, now_last) AS newest FROM now_latest GROUP BY {_KEY})
), h AS (
    SELECT a.cluster, a.host, a.gpu_uuid, a.gpu_instance AS gi, a.scheduler, coalesce(j.job_id, a.job_key) AS job_id,
           j.name, j.user_name, j.account, j.partition
    FROM allocations a
    LEFT JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
    WHERE coalesce(j.start, a.first_seen) <= $as_of
      AND $as_of < CASE WHEN j.start IS NOT NULL THEN coalesce(j."end", 'infinity'::TIMESTAMP)
                        ELSE a.last_seen + to_seconds($stale_after) END
      AND {ALLOCATION_FILTERS}
), hg AS (
    SELECT cluster, host, gpu_uuid, gi, count(*) AS jobs,
           string_agg(job_id, ', ' ORDER BY job_id) AS job_ids,
           string_agg(DISTINCT name, ', ' ORDER BY name) AS job_names,
           string_agg(DISTINCT user_name, ', ' ORDER BY user_name) AS user_names,
           string_agg(DISTINCT account, ', ' ORDER BY account) AS accounts,
           string_agg(DISTINCT scheduler, ', ' ORDER BY scheduler) AS schedulers
    FROM h GROUP BY ALL
), g AS (
    SELECT cluster, host, gpu_uuid, gi, coalesce(inv_gpu, s_gpu) AS gpu, coalesce(inv_model, s_model) AS model,
           coalesce(inv_mig, s_mig) AS mig_profile, fb_total_mib,
           latest.* EXCLUDE (cluster, host, gpu_uuid, gi, s_gpu, s_model, s_mig),
           runs.last_busy, runs.run_start, runs.noproc_start, runs.data_run_start, runs.data_noproc_start, x.last_xid, x.last_xid_at,
           coalesce(hg.jobs, 0) AS jobs, hg.job_ids, hg.job_names, hg.user_names, hg.accounts, hg.schedulers
    FROM inv
    FULL JOIN latest USING (cluster, host, gpu_uuid, gi)
    LEFT JOIN runs USING (cluster, host, gpu_uuid, gi)
    LEFT JOIN x USING (cluster, host, gpu_uuid, gi)
    LEFT JOIN hg USING (cluster, host, gpu_uuid, gi)
), f AS (
    SELECT *, {gpu_equiv()} AS equiv,
           epoch($as_of) - epoch(ts) AS age_s,
           coalesce(epoch($as_of) - epoch(ts) <= $stale_after, false) AS fresh,
           jobs > 0 AS held
    FROM g
)
SELECT cluster, host, gpu, gpu_uuid, gi, model, mig_profile, equiv, ts, age_s, fresh,
       util, fb_used_mib, fb_total_mib, gpu_temp_c, mem_temp_c, power_w, xid_last, last_xid, last_xid_at, gpu_up,
       compute_processes, clocks_event_reasons, ecc_dbe_vol, remap_failure, sm_clock_mhz,
       CASE WHEN NOT fresh THEN 'no data' WHEN gpu_up = 0 THEN 'lost' WHEN {GPU_ERROR_PRED} THEN 'error' ELSE 'ok' END AS status,
       CASE WHEN fresh AND util < $thr THEN run_start END AS idle_since,
       coalesce(fresh AND util < $thr AND last_busy IS NULL, false) AS idle_since_capped,
       held, jobs, job_ids, job_names, user_names, accounts, schedulers,
       coalesce(held AND fresh AND util < $thr, false) AS idle_allocated,
       coalesce(held AND fresh AND compute_processes = 0, false) AS no_process,
       CASE WHEN fresh AND compute_processes = 0 THEN noproc_start END AS no_process_since,
       CASE WHEN fresh AND util < $thr THEN data_run_start END AS idle_with_data_since,
       CASE WHEN fresh AND compute_processes = 0 THEN data_noproc_start END AS no_process_with_data_since
FROM f
"""

# --- the idle-GPU policy (analytics/policy.py) ---

# Jobs started and not ended at $as_of, a row per job and GPU its allocations name (none: gpu_uuid NULL); the
# idle figures come from GPU_STATES (one idle definition), joined on (cluster, host, gpu_uuid, gi)
POLICY_RUNNING_GPUS = """
SELECT j.cluster, j.scheduler, j.job_key, j.job_id, j.name, j.user_name, j.account, j.partition, j.state, j.start,
       a.host, a.gpu_uuid, a.gpu_instance AS gi
FROM jobs j
LEFT JOIN allocations a ON a.cluster = j.cluster AND a.scheduler = j.scheduler AND a.job_key = j.job_key
WHERE j.state = 'RUNNING' AND j.start IS NOT NULL AND j.start <= $as_of AND coalesce(j."end", 'infinity'::TIMESTAMP) > $as_of
ORDER BY j.cluster, j.scheduler, j.job_key, a.host, a.gpu_uuid, a.gpu_instance
"""

# The policy's audit trail (every notification and action), newest first
POLICY_AUDIT = """
SELECT ts, cluster, scheduler, job_key, job_id, user_name, account, action, rule, reason, idle_s, idle_gpus,
       enforce, result, detail, attempt
FROM policy_audit
WHERE ts > $since AND ts <= $as_of
ORDER BY ts DESC, cluster, job_key, action
"""

# Jobs with GPUs that ended in ($since, $as_of] in $accounts (those that asked for an efficiency note), not yet sent one
POLICY_ENDED_JOBS = """
SELECT j.cluster, j.scheduler, j.job_key, j.job_id, j.name, j.user_name, j.account, j.partition, j.state, j.start, j."end",
       EXISTS (SELECT 1 FROM job_attempts t WHERE t.cluster = j.cluster AND t.scheduler = j.scheduler AND t.job_key = j.job_key
               AND t.start < j.start) AS requeued
FROM jobs j
WHERE j."end" > $since AND j."end" <= $as_of AND j.start IS NOT NULL AND j.start < j."end"
  AND list_contains($accounts, j.account) AND coalesce(j.gpus, 0) > 0
  AND NOT EXISTS (SELECT 1 FROM policy_audit p WHERE p.cluster = j.cluster AND p.scheduler = j.scheduler
                  AND p.job_key = j.job_key AND p.action = 'efficiency_note' AND p.result = 'ok')
ORDER BY j."end", j.cluster, j.job_key
"""

# Actions whose latest attempt failed (planned again while their job runs), with the job's state (the "failing" metric, Health page)
POLICY_FAILING = """
WITH latest AS (
    SELECT *, row_number() OVER (PARTITION BY cluster, scheduler, job_key, action ORDER BY ts DESC, attempt DESC) AS rn
    FROM policy_audit WHERE enforce
)
SELECT l.ts, l.cluster, l.scheduler, l.job_key, l.job_id, l.user_name, l.account, l.action, l.rule, l.reason, l.idle_s,
       l.idle_gpus, l.detail, l.attempt, j.state AS job_state
FROM latest l
LEFT JOIN jobs j ON j.cluster = l.cluster AND j.scheduler = l.scheduler AND j.job_key = l.job_key
WHERE l.rn = 1 AND l.result = 'failed'
ORDER BY l.ts DESC, l.cluster, l.job_key
"""

# Is a job filter's key known (jobs are too many to list as FILTER_VALUES)?
JOB_KEY_KNOWN = """SELECT EXISTS (SELECT 1 FROM jobs WHERE job_key = $job_key)
    OR EXISTS (SELECT 1 FROM allocations WHERE job_key = $job_key)"""

# the values each dashboard filter can take
FILTER_VALUES = {
    "cluster": "SELECT DISTINCT cluster FROM gpus WHERE cluster IS NOT NULL UNION SELECT DISTINCT cluster FROM jobs WHERE cluster IS NOT NULL ORDER BY 1",
    "model": "SELECT DISTINCT model FROM gpus WHERE model IS NOT NULL ORDER BY 1",
    "account": "SELECT DISTINCT account FROM jobs WHERE account IS NOT NULL ORDER BY 1",
    "user": "SELECT DISTINCT user_name FROM jobs WHERE user_name IS NOT NULL ORDER BY 1",
    "partition": "SELECT DISTINCT partition FROM jobs WHERE partition IS NOT NULL ORDER BY 1",
}

# --- GPU health (analytics/health.py, from a window's facts below) ---

# Counters whose rise in the window is an event: (kind, column, its first value in base, label).
_COUNTERS = (
    ("ecc_dbe", "ecc_dbe_vol", "dbe0", "double-bit ECC errors"),
    ("ecc_sbe", "ecc_sbe_vol", "sbe0", "single-bit ECC errors"),
    ("row_remap", "remap_uncorrectable", "unc0", "uncorrectable remapped rows"),
)
# Temperature buckets are on the clock ($bucket seconds since the epoch), so whole hours read hour facts
_TEMP_BUCKET = "to_timestamp(floor(epoch({t}) / $bucket) * $bucket)::TIMESTAMP"
# (GPU_HEALTH, GPU_EVENTS and TEMPERATURE_BY_HOST: the same answers from raw samples, tests/support/raw_health.py)
# The parts that stand for the window's samples: inside it, one per stretch (lead), with a sample of their own
_HEALTH_WHERE = "inside AND lead AND samples_n > 0"
_HEALTH_PARTS = f"SELECT * FROM wpe WHERE {_HEALTH_WHERE}"


def _first_to_last(col: str) -> str:
    """A counter's rise over the window: its latest part's last value minus its earliest part's first."""
    return (f"(arg_max({col}_last, p0) FILTER (WHERE {col}_last IS NOT NULL) "
            f"- arg_min({col}_first, p0) FILTER (WHERE {col}_first IS NOT NULL))")


def _throttled_share(reason: str) -> str:
    return f"CASE WHEN sum(reasons_known_n) > 0 THEN 100.0 * sum({reason}_n) / sum(reasons_known_n) END"


# GPU_EVENTS' counters in the facts' names: (kind, fact counter, label)
_EVENT_COUNTERS = (("ecc_dbe", "ecc_dbe", "double-bit ECC errors"), ("ecc_sbe", "ecc_sbe", "single-bit ECC errors"),
                   ("row_remap", "remap_unc", "uncorrectable remapped rows"))
# ... and whether a GPU's health moved over its parts (HEALTH_FROM_FACTS' `moved`): an XID, a lost sample, a row-remap
# failure, a counter whose max passes its min - the only GPUs with events (_EVENT_PARTS' $moved), as HEALTH_MOVED_GPUS
_HEALTH_MOVED = ("bool_or(xid_codes IS NOT NULL) OR coalesce(sum(lost_n), 0) > 0 OR coalesce(sum(remap_failure_n), 0) > 0 OR "
                 + " OR ".join(f"coalesce(max({c}_max) > min({c}_min), false)" for _, c, _ in _EVENT_COUNTERS))

# Per GPU (or MIG instance), over its lead parts inside the window (no job filters): GPU_HEALTH's answer and the
# time-weighted figures (HEALTH_TIME_WEIGHTED; a profiling field's mean is over its known seconds, NULL: never known). A GPU
# with no sample of its own inside has samples 0: health.gpu_health leaves it out, as the raw query does.
HEALTH_FROM_FACTS = f"""
SELECT {_KEY}, any_value(gpu) AS gpu, arg_max(model, last_sample_ts) AS model,
       sum(samples_n)::BIGINT AS samples, make_timestamp(min(first_sample_ts)) AS first_sample,
       make_timestamp(max(last_sample_ts)) AS last_sample,
       max(sample_temp_max_c) AS gpu_temp_max_c, sum(temp_sum) / nullif(sum(temp_n), 0) AS gpu_temp_avg_c,
       max(mem_temp_max_c) AS mem_temp_max_c, max(power_max_w) AS power_max_w,
       sum(lost_n)::BIGINT AS lost_samples, make_timestamp(min(lost_ts)) AS first_lost,
       list_sort(list_distinct(flatten(list(list_transform(xid_codes, lambda c: c.code)) FILTER (WHERE xid_codes IS NOT NULL)))) AS xids,
       make_timestamp(min(list_min(list_transform(xid_codes, lambda c: c.first_ts)))) AS first_xid,
       {_first_to_last("ecc_dbe")} AS ecc_dbe_new, {_first_to_last("ecc_sbe")} AS ecc_sbe_new,
       max(ecc_dbe_agg_max) AS ecc_dbe_total, max(remap_correctable_max) AS remap_correctable,
       max(remap_uncorrectable_max) AS remap_uncorrectable, max(remap_failure_max) AS remap_failure,
       {_first_to_last("pcie_replay")} AS pcie_replays,
       {_throttled_share("thermal_throttle")} AS thermal_throttle_pct, {_throttled_share("power_throttle")} AS power_throttle_pct,
       {_throttled_share("hw_slowdown")} AS hw_slowdown_pct,
       {_first_to_last("thermal_viol")} / 1e9 AS thermal_violation_s, {_first_to_last("power_viol")} / 1e9 AS power_violation_s,
       sum(xid_n)::BIGINT AS xid_samples, sum(reasons_known_s) AS reasons_known_s,
       {", ".join(f"sum({r}_s) AS {r}_s" for r in THROTTLE_REASONS)},
       {", ".join(f"sum({f}_known_s) AS {f}_known_s, sum({f}_s) / nullif(sum({f}_known_s), 0) AS {f}_mean" for f in PROFILING)},
       {_HEALTH_MOVED} AS moved
FROM wpe WHERE inside AND lead GROUP BY {_KEY}
"""
# the facts' columns HEALTH_FROM_FACTS reads beyond a part's key and times (facts.HEALTH_COLUMNS: a narrower read)
HEALTH_FACT_COLUMNS = ("samples_n", "first_sample_ts", "last_sample_ts", "sample_temp_max_c", "temp_sum", "temp_n", "mem_temp_max_c",
                       "power_max_w", "lost_n", "lost_ts", "xid_codes", "xid_n", "ecc_dbe_agg_max", "remap_correctable_max",
                       "remap_uncorrectable_max", "remap_failure_max", "reasons_known_n", "reasons_known_s",
                       *(f"{c}_{x}" for c in ("ecc_dbe", "ecc_sbe", "pcie_replay", "thermal_viol", "power_viol") for x in ("first", "last")),
                       *(f"{r}_{x}" for r in THROTTLE_REASONS for x in ("n", "s")), *(f"{f}_{x}" for f in PROFILING for x in ("known_s", "s")))
HEALTH_TIME_WEIGHTED = ("xid_samples", "reasons_known_s", *(f"{r}_s" for r in THROTTLE_REASONS),
                        *(f"{f}_{x}" for f in PROFILING for x in ("known_s", "mean")))

# TEMPERATURE_BY_HOST's answer from the window's parts (read at grains that divide $bucket: none crosses an edge)
TEMPERATURE_FROM_FACTS = f"""
SELECT {_TEMP_BUCKET.format(t="make_timestamp(p0)")} AS bucket, cluster, host,
       max(sample_temp_max_c) AS gpu_temp_max_c, sum(temp_sum) / nullif(sum(temp_n), 0) AS gpu_temp_avg_c,
       max(mem_temp_max_c) AS mem_temp_max_c
FROM ({_HEALTH_PARTS}) WHERE temp_n > 0 OR mem_temp_max_c IS NOT NULL
GROUP BY ALL ORDER BY cluster, host, bucket
"""

_BASES = ", ".join(f"coalesce(arg_min({c}_first, p0) FILTER (WHERE {c}_first IS NOT NULL), 0) AS {c}_0" for _, c, _ in _EVENT_COUNTERS)
# the facts' columns the events read beyond a part's key and times (facts.EVENT_COLUMNS); p holds those alone
EVENT_FACT_COLUMNS = ("xid_codes", "lost_n", "lost_ts", "remap_failure_n", "remap_failure_ts",
                      *(f"{c}_{x}" for _, c, _ in _EVENT_COUNTERS for x in ("first", "first_ts", "n", "min", "max")))
_EVENT_COLUMNS = f"{_KEY}, gpu, model, p0, p1, " + ", ".join(EVENT_FACT_COLUMNS)
# ... of the GPUs $moved names (uuids; NULL: every GPU; an empty list: none, read in no file)
_EVENT_PARTS = (f"WITH p AS (SELECT {_EVENT_COLUMNS} FROM wpe WHERE {_HEALTH_WHERE} "
                "AND ($moved IS NULL OR (len($moved) > 0 AND gpu_uuid IN (SELECT unnest($moved))))), "
                f"base AS (SELECT {_KEY}, {_BASES} FROM p GROUP BY ALL)")

# Parts in which a counter passes the window's first value (GPU_EVENTS' base): only their samples say when and
# how often, so they are read raw (EVENTS_OF_MIXED_PARTS), narrowed to their GPUs and times
MIXED_PARTS = _EVENT_PARTS + "\n" + "UNION ALL\n".join(
    f"""SELECT '{kind}' AS kind, {", ".join("p." + k for k in _KEY.split(", "))}, p.p0, p.p1, b.{c}_0 AS base
FROM p JOIN base b USING ({_KEY}) WHERE p.{c}_n > 0 AND p.{c}_min <= b.{c}_0 AND p.{c}_max > b.{c}_0
""" for kind, c, _ in _EVENT_COUNTERS)
_KIND_VALUE = "CASE m.kind " + " ".join(f"WHEN '{kind}' THEN s.{col}" for kind, col, _, _ in _COUNTERS) + " END"
# the mixed parts of one stretch [$lo, $hi) (_health_mixed), from the raw samples of their GPUs
EVENTS_OF_MIXED_PARTS = f"""
SELECT m.kind, m.cluster, m.host, m.gpu_uuid, m.gi, any_value(s.gpu) AS gpu, arg_min(s.model, s.ts) AS model,
       min(s.ts) AS ts, count(*) AS n, max({_KIND_VALUE}) AS top
FROM {SAMPLES} s JOIN _health_mixed m
  ON s.cluster IS NOT DISTINCT FROM m.cluster AND s.host IS NOT DISTINCT FROM m.host AND s.gpu_uuid IS NOT DISTINCT FROM m.gpu_uuid
 AND coalesce(s.gpu_instance, -1) = m.gi
WHERE s.ts >= make_timestamp($lo) AND s.ts < make_timestamp($hi) AND {_KIND_VALUE} > m.base
GROUP BY m.kind, m.cluster, m.host, m.gpu_uuid, m.gi
"""
# The GPUs whose health moved in [$start_us, $end_us) (an XID, a lost sample, a row-remap failure, a counter whose max
# passes its min), so health.events reads only their parts: from the facts up to $raw_us rounded out to buckets ($files)
# and the raw samples after - more samples than the window's, never fewer (tests/test_health_from_facts.py).
HEALTH_MOVED_GPUS = f"""
SELECT DISTINCT gpu_uuid FROM (
    SELECT {_KEY}, xid_codes IS NOT NULL AS xid, lost_n > 0 OR remap_failure_n > 0 AS lost,
           {", ".join(f"{c}_min AS {c}_lo, {c}_max AS {c}_hi" for _, c, _ in _EVENT_COUNTERS)}
    FROM read_parquet($files, hive_partitioning = false)
    WHERE tag = $tag AND grain_s IN (300, 86400) AND {_FILTERS}
    UNION ALL BY NAME
    SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, bool_or(xid_last > 0) AS xid,
           bool_or(gpu_up = 0 OR remap_failure > 0) AS lost,
           {", ".join(f"min({col}) AS {c}_lo, max({col}) AS {c}_hi" for (_, col, _, _), (_, c, _) in zip(_COUNTERS, _EVENT_COUNTERS))}
    FROM {SAMPLES} WHERE ts >= make_timestamp($raw_us) AND ts < make_timestamp($end_us) AND {_FILTERS}
    GROUP BY ALL
)
GROUP BY {_KEY}
HAVING bool_or(xid) OR bool_or(lost) OR {" OR ".join(f"max({c}_hi) > min({c}_lo)" for _, c, _ in _EVENT_COUNTERS)}
"""

# GPU_EVENTS' answer from the window's parts and the mixed parts' events (_health_mixed_events)
EVENTS_FROM_FACTS = _EVENT_PARTS + f""", x AS (
    SELECT {_KEY}, gpu, model, unnest(xid_codes) AS c FROM p WHERE xid_codes IS NOT NULL
)
SELECT make_timestamp(min(c.first_ts)) AS ts, cluster, host, any_value(gpu) AS gpu, gpu_uuid, gi, arg_min(model, c.first_ts) AS model,
       'xid' AS kind, c.code AS code, sum(c.n)::BIGINT AS samples, 'XID ' || c.code AS detail
FROM x GROUP BY cluster, host, gpu_uuid, gi, c.code
""" + "".join(
    f"""UNION ALL
SELECT min(e.ts), e.cluster, e.host, any_value(e.gpu), e.gpu_uuid, e.gi, arg_min(e.model, e.ts),
       '{kind}', NULL, sum(e.n)::BIGINT, '{label}: +' || (max(e.top) - any_value(b.{c}_0))::BIGINT
FROM (SELECT make_timestamp(p.{c}_first_ts) AS ts, {", ".join("p." + k for k in _KEY.split(", "))}, p.gpu, p.model, p.{c}_n AS n,
             p.{c}_max AS top
      FROM p JOIN base b USING ({_KEY}) WHERE p.{c}_n > 0 AND p.{c}_min > b.{c}_0
      UNION ALL BY NAME
      SELECT ts, {_KEY}, gpu, model, n, top FROM _health_mixed_events WHERE kind = '{kind}') e
JOIN base b USING ({_KEY})
GROUP BY e.cluster, e.host, e.gpu_uuid, e.gi
""" for kind, c, label in _EVENT_COUNTERS) + f"""UNION ALL
SELECT make_timestamp(min(remap_failure_ts)), cluster, host, any_value(gpu), gpu_uuid, gi, arg_min(model, remap_failure_ts),
       'row_remap_failure', NULL, sum(remap_failure_n)::BIGINT, 'row remapping failed'
FROM p WHERE remap_failure_n > 0 GROUP BY {_KEY}
UNION ALL
SELECT make_timestamp(min(lost_ts)), cluster, host, any_value(gpu), gpu_uuid, gi, arg_min(model, lost_ts),
       'gpu_lost', NULL, sum(lost_n)::BIGINT, 'GPU not usable (gpufleet_gpu_up = 0)'
FROM p WHERE lost_n > 0 GROUP BY {_KEY}
ORDER BY ts DESC, cluster, host, gpu, kind
"""

# Each GPU's (MIG instance's) model as the inventory has it: an event's model where its samples name none (a lost GPU's)
GPU_MODELS = "SELECT cluster, host, gpu_uuid, gpu_instance AS gi, model AS inventory_model FROM gpus WHERE model IS NOT NULL"

# The store's first GPU sighting within the filters (trends: a previous window before it is partly missing)
HISTORY_START = f"""
SELECT min(first_seen) FROM gpus
WHERE {_FILTERS}
"""

# --- Reliability (gpufleet.analytics.reliability) ---

def _attempt_rows(only: str = "", held: bool = True) -> str:
    """The WITH clause whose last table, a, is every job attempt RELIABILITY_ATTEMPTS describes. `only`: more
    conditions on the jobs ("AND ..."), whose few jobs are then kept (else the jobs are read where used);
    `held`: with the GPUs of the attempts whose evidence can decide their cause (False: GPU counts accounting lacks)."""
    return f"""
WITH f AS {"MATERIALIZED" if only else "NOT MATERIALIZED"} {window_jobs(only)},
p AS (  -- the earlier attempts (job_attempts) of the filtered jobs, in the window
    SELECT p.*, f.user_name, f.account, f.name, f.gpus AS job_gpus, f.start AS job_start, f.gpu_share
    FROM job_attempts p JOIN f ON f.cluster = p.cluster AND f.scheduler = p.scheduler AND f.job_key = p.job_key
    WHERE p.start < $end AND coalesce(p."end", $as_of) > $start AND p.start IS DISTINCT FROM f.start
), restarted AS (  -- a pod's current run starts after its containers' earlier runs ended (same pod, same start)
    SELECT cluster, scheduler, job_key, max("end") AS after FROM job_attempts p
    WHERE p."end" IS NOT NULL AND EXISTS (SELECT 1 FROM f WHERE f.cluster = p.cluster AND f.scheduler = p.scheduler
                                          AND f.job_key = p.job_key AND p.start >= f.start)
    GROUP BY ALL
), j AS NOT MATERIALIZED (  -- (j, and RELIABILITY_ATTEMPTS' l, computed for each reader, not held:
    -- 1 GiB less at 4.8M attempts, no slower)
    SELECT f.cluster, f.scheduler, f.job_key, f.job_id, f.state, f.state_raw, f.exit_code, greatest(f.start, r.after) AS start, f."end",
           f.gpus, f.user_name, f.account, f.name, f.nodes, f.submit, f.gpu_share
    FROM f LEFT JOIN restarted r ON r.cluster = f.cluster AND r.scheduler = f.scheduler AND r.job_key = f.job_key
    WHERE f.start IS NOT NULL AND f.start < $end AND coalesce(f."end", $as_of) > $start
    UNION ALL
    SELECT cluster, scheduler, job_key, coalesce(job_id, job_key), state, state_raw, exit_code, start,
           -- a record a later one superseded before its end was read ran until the next started at the latest
           coalesce("end", CASE WHEN start < job_start THEN job_start END), coalesce(gpus, job_gpus),
           user_name, account, name, nodes, submit, gpu_share
    FROM p
), held AS (  -- each attempt's GPUs: its job's allocations seen while it ran (read only for the attempts
    -- that need them: evidence can decide their cause, or accounting lacks their GPU count)
    SELECT j.cluster, j.scheduler, j.job_key, j.start, count(DISTINCT a.gpu_uuid)::INTEGER AS mapped_gpus,
           list_sort(list(DISTINCT struct_pack(host := a.host, gpu_uuid := a.gpu_uuid)) FILTER (WHERE j.evidence)) AS held
    FROM allocations a JOIN (SELECT *, coalesce("end", $as_of) AS ran_to, start - to_seconds($max_gap) AS seen_from,
                                    NOT list_contains($no_evidence_states, coalesce(state, 'UNKNOWN')) AS evidence
                             FROM j) j
      ON a.cluster = j.cluster AND a.scheduler = j.scheduler AND a.job_key = j.job_key AND a.first_seen <= j.ran_to AND a.last_seen >= j.seen_from
    WHERE {'j.evidence OR ' if held else ''}j.gpus IS NULL
    GROUP BY j.cluster, j.scheduler, j.job_key, j.start
), a AS (
    SELECT j.cluster, j.scheduler, j.job_key, j.job_id, j.state, j.state_raw, j.exit_code, j.start, j."end",
           coalesce(j.gpus, h.mapped_gpus) AS gpus, j.user_name, j.account, j.name, j.nodes, j.submit, j.gpu_share AS share, h.held,
           upper(coalesce(nullif(j.state, ''), 'UNKNOWN')) AS ustate,
           list_contains($ended_states, ustate) AND ustate <> 'COMPLETED' AS broken
    FROM j LEFT JOIN held h ON h.cluster = j.cluster AND h.scheduler = j.scheduler AND h.job_key = j.job_key AND h.start = j.start
    WHERE coalesce(j.gpus, h.mapped_gpus) > 0
)"""


# Every job attempt that ran in [$start, $end) (a running one up to $as_of) within the job filters: a job's record in jobs,
# its earlier ones in job_attempts; GPU jobs only (accounting's GPUs, else those seen). held ({host, gpu_uuid}: its health
# evidence) only where evidence can decide the cause (a state not in $no_evidence_states: reliability.NO_EVIDENCE_STATES).
# Kept on the cursor as _rel_attempts, narrow, with `listed`: the report reads it as a row (RELIABILITY_LISTED) - of a
# chain candidate's job (reliability.chain_candidates), a job that reported checkpoints, or the $top largest of the rest;
# the rest, most attempts, is summed in SQL (RELIABILITY_SUMMED). Without $chains (the figures alone: no chain is linked)
# only the jobs with an attempt that did not complete are listed (`linked` then says that alone).
# the resubmit window in whole microseconds (at least 1): a submission within it of an end falls in its step or the next
_RESUBMIT_STEP = "greatest(1, ceil($resubmit_s * 1e6))::BIGINT"
RELIABILITY_ATTEMPTS = "CREATE OR REPLACE TEMP TABLE _rel_attempts AS" + _attempt_rows(held=False) + """, reach AS (
    -- each broken attempt with a name that some attempt of its name can continue (one after it in link_chains' order,
    -- started at or after its end, submitted within $resubmit_s of it), met on their names and the resubmit window's
    -- step their submission falls in (_RESUBMIT_STEP: the end's or the next)
    SELECT DISTINCT b.cluster, b.user_name, b.account, b.name, b.start, b.job_key
    FROM (SELECT *, unnest([0, 1]) + epoch_us("end") // """ + _RESUBMIT_STEP + """ AS step FROM a
          WHERE $chains AND broken AND nullif(name, '') IS NOT NULL AND start IS NOT NULL) b
    JOIN (SELECT *, epoch_us(coalesce(submit, start)) // """ + _RESUBMIT_STEP + """ AS step FROM a) x
      ON x.step = b.step AND x.cluster = b.cluster AND x.user_name IS NOT DISTINCT FROM b.user_name
      AND x.account IS NOT DISTINCT FROM b.account AND x.name = b.name AND x.start >= b."end"
      AND coalesce(x.submit, x.start) BETWEEN b."end" AND b."end" + to_seconds($resubmit_s)
      AND (x.start > b.start OR (x.start = b.start AND x.job_key > b.job_key))
), places AS (
    -- the attempts of those names in link_chains' order (start, then job key; attempts tied on both are one place), each
    -- place with the next (reliability.chain_candidates: an attempt continues by name only its name's previous one)
    SELECT cluster, user_name, account, name, start, job_key, lead(start) OVER w AS next_start, lead(job_key) OVER w AS next_job_key
    FROM a SEMI JOIN (SELECT DISTINCT cluster, user_name, account, name FROM reach) r
      ON r.cluster = a.cluster AND r.user_name IS NOT DISTINCT FROM a.user_name AND r.account IS NOT DISTINCT FROM a.account
      AND r.name = a.name
    WHERE start IS NOT NULL
    GROUP BY cluster, user_name, account, name, start, job_key
    WINDOW w AS (PARTITION BY cluster, user_name, account, name ORDER BY start, job_key)
), k AS (  -- the jobs of the chains' candidates: a broken attempt's, and those at the place after a broken named one that
    -- an attempt of its name can continue
    SELECT cluster, scheduler, job_key FROM a WHERE broken
    UNION
    SELECT x.cluster, x.scheduler, x.job_key
    FROM reach r
    JOIN places p ON p.cluster = r.cluster AND p.user_name IS NOT DISTINCT FROM r.user_name
      AND p.account IS NOT DISTINCT FROM r.account AND p.name = r.name AND p.start = r.start AND p.job_key = r.job_key
    JOIN a x ON x.cluster = p.cluster AND x.user_name IS NOT DISTINCT FROM p.user_name AND x.account IS NOT DISTINCT FROM p.account
      AND x.name = p.name AND x.start = p.next_start AND x.job_key = p.next_job_key
), l AS NOT MATERIALIZED (
    SELECT a.*, EXISTS (SELECT 1 FROM k WHERE k.cluster = a.cluster AND k.scheduler = a.scheduler AND k.job_key = a.job_key) AS linked,
           EXISTS (SELECT 1 FROM job_checkpoints c WHERE c.cluster = a.cluster AND c.scheduler = a.scheduler
                   AND c.job_key = a.job_key AND c.saved_at <= $as_of) AS reported
    FROM a
), top AS (  -- the $top largest of the rest, in the report's order (reliability_store.largest_chains: GPUs, then wall
    -- time - to its end, else $as_of - then job)
    SELECT cluster, scheduler, job_key FROM l WHERE $chains AND NOT linked AND start IS NOT NULL
    ORDER BY coalesce(gpus, 0) DESC, epoch_us(coalesce("end", $as_of)) - epoch_us(start) DESC, job_key, cluster, scheduler, start
    LIMIT $top
)
SELECT cluster, scheduler, job_key, start, "end", gpus, share, ustate, linked,
       linked OR ($chains AND (reported OR EXISTS (SELECT 1 FROM top t WHERE t.cluster = l.cluster AND t.scheduler = l.scheduler
                                                    AND t.job_key = l.job_key))) AS listed
FROM l
"""
# ... the listed attempts in full (a listed job's every one), in job and start order, numbered 1, 2, ... per job,
# each one's GPUs as two lists (hosts, uuids) sorted by host then uuid: plain strings to hand over; `linked`: a chain
# candidate's job (the report links those alone, as reliability.chain_candidates would pick them)
RELIABILITY_LISTED = _attempt_rows(" AND EXISTS (SELECT 1 FROM _rel_attempts r WHERE r.listed AND r.cluster = jobs.cluster "
                                   "AND r.scheduler = jobs.scheduler AND r.job_key = jobs.job_key)") + """
SELECT cluster, scheduler, job_key, job_id, state, start, "end", gpus, state_raw, exit_code, user_name, account, name, nodes,
       submit, row_number() OVER (PARTITION BY cluster, scheduler, job_key ORDER BY start) AS attempt, share,
       list_transform(held, lambda g: g.host) AS held_hosts, list_transform(held, lambda g: g.gpu_uuid) AS held_uuids,
       EXISTS (SELECT 1 FROM _rel_attempts r WHERE r.linked AND r.cluster = a.cluster AND r.scheduler = a.scheduler
               AND r.job_key = a.job_key) AS linked
FROM a ORDER BY cluster, scheduler, job_key, start
"""
# ... and the rest summed (reliability.Summed) as figures() and goodput count them: per GPU count, completed or
# not, and the cause mix's bucket ($bucket_us from $start) of its end (NULL: none in the window); microseconds run
# in [$start, $end) (unended: to $as_of), GPU-equivalents (GPUs x MIG share) x those, and x start to end (or $as_of),
# the goodput's wall
RELIABILITY_SUMMED = """
SELECT gpus, ustate = 'COMPLETED' AS completed,
       CASE WHEN ustate = 'COMPLETED' AND "end" >= $start AND "end" < $end THEN (epoch_us("end") - epoch_us($start)) // $bucket_us END AS k,
       count(*) AS attempts, count(*) FILTER (WHERE run_us > 0) AS ran, sum(run_us) AS run_us, sum(gpus * share * run_us) AS gpu_run_us,
       sum(gpus * share * greatest(0, epoch_us(coalesce("end", $as_of)) - epoch_us(start))) FILTER (WHERE start IS NOT NULL) AS wall_gpu_us
FROM (SELECT *, CASE WHEN start IS NULL THEN 0
                     ELSE greatest(0, epoch_us(least(coalesce("end", $as_of), $end)) - epoch_us(greatest(start, $start))) END AS run_us
      FROM _rel_attempts WHERE NOT listed)
GROUP BY ALL
"""

# The checkpoints the filtered jobs that ran in the window saved, up to $as_of: where an interrupted attempt's
# lost work starts, and the job's checkpoint cost and interval
RELIABILITY_CHECKPOINTS = f"""
SELECT c.cluster, c.scheduler, c.job_key, c.saved_at, c.duration_s
FROM job_checkpoints c
JOIN (SELECT cluster, scheduler, job_key FROM jobs
      WHERE {JOB_FILTERS} AND coalesce("end", $as_of) > $start) j
  ON j.cluster = c.cluster AND j.scheduler = c.scheduler AND j.job_key = c.job_key
WHERE c.saved_at <= $as_of
ORDER BY c.cluster, c.scheduler, c.job_key, c.saved_at
"""

# The jobs gpufleet's policy cancelled (enforced, done): their CANCELLED is "cancelled by policy"
RELIABILITY_POLICY_CANCELS = """
SELECT DISTINCT cluster, scheduler, job_key FROM policy_audit
WHERE action = 'cancel' AND enforce AND result = 'ok' AND ts < $end + INTERVAL 1 DAY
"""

# GPU-hours each host's GPUs were held in [$start, $end) (the mapping's allocations, clipped; a MIG instance at its share,
# from the inventory's profile, 1 where the inventory lacks the instance, as mig_share takes a profile it cannot read): a
# node's exposure in the lemon test; and the scheduler most of those holds in the window are of (a drain goes through it).
# Only the allocations that may hold past $start are read (allocations_ending_after), not the store's whole history.
RELIABILITY_HOST_GPU_HOURS = f"""
SELECT a.cluster, a.host, mode(a.scheduler) FILTER (WHERE {clip_seconds(ALLOCATION_START, ALLOCATION_END)} > 0) AS scheduler,
       sum({clip_seconds(ALLOCATION_START, ALLOCATION_END)} * coalesce(g.equiv, 1.0)) / 3600 AS gpu_hours
FROM {allocations_ending_after("$start")} a
LEFT JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
{ALLOCATION_RUNS}
LEFT JOIN {INVENTORY_SHARES} g ON {allocation_gpu("g")}
WHERE {ALLOCATION_FILTERS}
GROUP BY a.cluster, a.host HAVING gpu_hours > 0
ORDER BY a.cluster, a.host
"""

# --- where a job's GPU time goes (analytics/states.py) ---

# One job's allocations (by job id as people write it, or its key) clipped to [$start, $end):
# its GPUs and the stretch each was held, by ALLOCATION_START/END as every figure reads them. The job's keys are found
# first (its accounting's by id, _JOBS_BY_ID; its allocations' by key), each by an equality the scans filter on (`want`),
# and only their allocations and job rows are joined: a match on "the allocation's key or its job's id" read every
# allocation and job of the store (16,384 GPUs: 0.25-0.35 s warm, ~1 s in a page's first read, against 0.09 s)
JOB_STATE_ALLOCATIONS = f"""
WITH want AS MATERIALIZED (
    {_JOBS_BY_ID}
    UNION SELECT cluster, scheduler, job_key FROM allocations WHERE job_key = $job AND ($cluster IS NULL OR cluster = $cluster)
)
SELECT a.cluster, a.scheduler, a.job_key, coalesce(j.job_id, a.job_key) AS job_id, a.host, a.gpu_uuid,
       a.gpu_instance AS gi, a.gpu, epoch(greatest({ALLOCATION_START}, $start)) AS a0, epoch(least({ALLOCATION_END}, $end)) AS a1
FROM (SELECT * FROM allocations SEMI JOIN want USING (cluster, scheduler, job_key)) a
LEFT JOIN (SELECT * FROM jobs SEMI JOIN want USING (cluster, scheduler, job_key)) j
  ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
{ALLOCATION_RUNS}
WHERE least({ALLOCATION_END}, $end) > greatest({ALLOCATION_START}, $start)
ORDER BY a.cluster, a.job_key, a.host, a.gpu, a.gpu_instance
"""
# ... and the samples of those GPUs (_job_al: JOB_STATE_ALLOCATIONS' rows of one job, numbered k, of cluster $job_cluster)
# from max_gap before each allocation to its end: utilization as LINE_COLUMNS (NaN: not reported), profiling fields as
# stored (FLOAT: fewer bytes, widened exactly in numpy), NVLink RX + TX (NULL: neither published), MIG share, other jobs'
# processes. $lo/$hi (the allocations' span) and $host_lo/$host_hi (the job's hosts) are constants so DuckDB skips files and
# row groups outside them; the cluster is a filter, not a join key (one string fewer to hash). Unordered: states.job_breakdown
# groups by k and orders by time in numpy, cheaper than SQL.
JOB_STATE_SAMPLES = f"""
SELECT al.k, s.gpu, epoch(s.ts) AS ts, {LINE_COLUMNS.format(s="s.")},
       s.compute_processes AS procs, s.sm_active, s.tensor_active, s.pcie_rx_bytes_per_s AS pcie_rx,
       CASE WHEN s.nvlink_tx_bytes_per_s IS NOT NULL OR s.nvlink_rx_bytes_per_s IS NOT NULL
            THEN coalesce(s.nvlink_tx_bytes_per_s, 0)::DOUBLE + coalesce(s.nvlink_rx_bytes_per_s, 0) END AS nvlink,
       CASE WHEN s.mig_profile IS NULL THEN 1.0 ELSE {gpu_equiv('s')} END AS equiv, s.foreign_processes
FROM {SAMPLES} s
JOIN _job_al al ON al.host = s.host AND al.gpu_uuid = s.gpu_uuid AND al.gi = coalesce(s.gpu_instance, -1)
 AND epoch(s.ts) >= al.a0 - $max_gap AND epoch(s.ts) < al.a1
WHERE s.cluster = $job_cluster AND s.host >= $host_lo AND s.host <= $host_hi AND s.ts >= $lo AND s.ts < $hi
"""

# GPUs on which processes of a job not allocated them ran in [$start, $end) (gpufleet_gpu_foreign_processes): the
# Health page's list. Nearly every sample has NULL, so column statistics skip most row groups.
FOREIGN_PROCESS_GPUS = f"""
SELECT cluster, host, gpu, gpu_uuid, coalesce(gpu_instance, -1)::SMALLINT AS gi, arg_max(model, ts) AS model,
       max(foreign_processes)::DOUBLE AS foreign_processes_max, count(*) AS samples, min(ts) AS first_seen, max(ts) AS last_seen
FROM {SAMPLES}
WHERE foreign_processes > 0 AND ts >= $start AND ts < $end AND {_FILTERS}
GROUP BY cluster, host, gpu, gpu_uuid, gi
ORDER BY last_seen DESC, cluster, host, gpu
"""

# Per account, its GPUs shared with other jobs in [$start, $end) (gpu_job_shares, hourly): shared_hours (clock
# hours, each whole: the table keeps scrape counts per hour), the GPUs and jobs, sm_share (its jobs' SM ratios over
# the shared scrapes, a scrape without them 0; NULL: a report lacked it), the other accounts. A filter picks its row.
TEAM_GPU_SHARES = """
WITH r AS (
    SELECT g.cluster, g.host, g.gpu_uuid, g.gpu_instance, g.ts, g.scheduler, g.job_key, coalesce(j.account, '') AS account,
           g.shared_scrapes, g.reports, g.sm_reports, g.sm_sum
    FROM gpu_job_shares g LEFT JOIN jobs j ON j.cluster = g.cluster AND j.scheduler = g.scheduler AND j.job_key = g.job_key
    WHERE g.ts >= date_trunc('hour', $start::TIMESTAMP) AND g.ts < $end AND ($cluster IS NULL OR g.cluster = $cluster)
), t AS (
    SELECT cluster, account, host, gpu_uuid, gpu_instance, ts, sum(sm_sum) AS sm_sum, sum(sm_reports) = sum(reports) AS sm_known,
           count(*) AS jobs_n
    FROM r GROUP BY ALL
), h AS (
    SELECT cluster, host, gpu_uuid, gpu_instance, ts, max(shared_scrapes) AS scrapes, list(DISTINCT account) AS accounts
    FROM r GROUP BY ALL
), per AS (
    SELECT t.cluster, t.account, count(*) AS shared_hours, count(DISTINCT (t.host, t.gpu_uuid, t.gpu_instance)) AS gpus,
           CASE WHEN bool_and(t.sm_known) THEN sum(t.sm_sum) / sum(h.scrapes) END AS sm_share,
           list_sort(list_distinct(flatten(list(list_filter(h.accounts, lambda x: x <> t.account))))) AS shared_with
    FROM t JOIN h USING (cluster, host, gpu_uuid, gpu_instance, ts) GROUP BY ALL
), jobs AS (SELECT cluster, account, count(DISTINCT (scheduler, job_key)) AS jobs FROM r GROUP BY ALL)
SELECT per.cluster, per.account, per.gpus, jobs.jobs, per.shared_hours, per.sm_share,
       array_to_string(per.shared_with, ', ') AS shared_with
FROM per JOIN jobs USING (cluster, account)
WHERE $account IS NULL OR per.account = $account
ORDER BY shared_hours DESC, per.cluster, per.account
"""

# The store's accounting span (its jobs' first start and last end or start; NULL: no job started), for a report of a window
# with no job attempt to say where the jobs are
JOB_SPAN = """SELECT min(start), max(coalesce("end", start)) FROM jobs WHERE start IS NOT NULL"""

# The runs of a job asked for by id or key (a report's --job, the Jobs page's box) that is not in a window: when it ran, so
# "not in this window" says where it is (the latest first; a job id reused across clusters gives a row each)
JOB_RUNS = """SELECT cluster, job_id, start, "end", account, user_name, partition FROM jobs WHERE job_id = $job OR job_key = $job
ORDER BY start DESC NULLS LAST LIMIT 3"""

# One job's part of each GPU it shared in [$start, $end) (gpu_job_shares' hours overlapping it), beside the other
# jobs on that GPU in those hours. A share: the job's SM ratio summed over the GPU's shared scrapes over their count
# (a scrape without the job is 0), so a GPU's shares add up to at most 1; NULL: a report lacked it. Memory: the high-water.
JOB_GPU_SHARES = """
WITH mine AS (
    SELECT cluster, host, gpu_uuid, gpu_instance, ts FROM gpu_job_shares
    WHERE cluster = $cluster AND scheduler = $scheduler AND job_key = $job_key
      AND ts >= date_trunc('hour', $start::TIMESTAMP) AND ts < $end
), gpu_hours AS (
    SELECT g.cluster, g.host, g.gpu_uuid, g.gpu_instance, g.ts, max(g.shared_scrapes) AS scrapes
    FROM gpu_job_shares g JOIN mine USING (cluster, host, gpu_uuid, gpu_instance, ts) GROUP BY ALL
), per_gpu AS (
    SELECT cluster, host, gpu_uuid, gpu_instance, sum(scrapes) AS shared_scrapes, min(ts) AS first_hour,
           max(ts) + INTERVAL 1 HOUR AS last_hour
    FROM gpu_hours GROUP BY ALL
)
SELECT g.cluster, g.host, g.gpu_uuid, g.gpu_instance AS gi, g.scheduler, g.job_key, any_value(j.job_id) AS job_id,
       any_value(j.user_name) AS user_name, g.scheduler = $scheduler AND g.job_key = $job_key AS is_job,
       any_value(d.shared_scrapes)::BIGINT AS shared_scrapes, sum(g.reports)::BIGINT AS reports,
       CASE WHEN sum(g.sm_reports) = sum(g.reports) THEN sum(g.sm_sum) / any_value(d.shared_scrapes) END AS sm_share,
       max(g.memory_max_bytes) AS memory_max_bytes, any_value(d.first_hour) AS first_hour, any_value(d.last_hour) AS last_hour
FROM gpu_job_shares g
JOIN gpu_hours h USING (cluster, host, gpu_uuid, gpu_instance, ts)
JOIN per_gpu d USING (cluster, host, gpu_uuid, gpu_instance)
LEFT JOIN jobs j ON j.cluster = g.cluster AND j.scheduler = g.scheduler AND j.job_key = g.job_key
GROUP BY g.cluster, g.host, g.gpu_uuid, g.gpu_instance, g.scheduler, g.job_key
ORDER BY g.cluster, g.host, g.gpu_uuid, gi, is_job DESC, sm_share DESC NULLS LAST, g.job_key
"""

# --- where a window's GPU time goes, from its facts (analytics/window_states.py) ---

# Per job and GPU model, GPU-seconds (x MIG share) of its held parts inside the window split into the window-grain
# states by the rules in window_states' docstring, over wheld (the held parts, job filters applied) and wlinked (their
# idle pieces chained per GPU and holder hk across every part of the read: facts.LINKED_PIECES; FactWindow.linked);
# holder: each hold's (al's row i in wheld) first and last part. *_told_s: busy time whose part knew the fields of
# input- / communication-bound; *_missing: a busy part lacked that field. A part outside the window counts 0; any_inside:
# whether a row has a part inside (window_states drops those without, after their holders counted: not WHERE inside, as
# DuckDB would hash the wide parts in the join). Whether a job holds several GPUs (communication-bound's rule) is a
# job's, not a row's: its rows' hk_min and hk_max tell (window_states), each row giving its sums both ways
# (communication_bound_s, compute_multi_s and busy_unresolved_multi_s where it does; compute_s and busy_unresolved_s where not).
WINDOW_STATE_JOBS = """
WITH holder AS (
    SELECT hk, min(p0) AS f0, max(p1) AS l1 FROM wheld GROUP BY i, hk
), linked AS (
    SELECT pid, hk, r0, r1, chain FROM wlinked WHERE kind = 'idle'
), chained AS (
    SELECT hk, chain, min(r0) AS c0, max(r1) AS c1, sum(r1 - r0) >= $idle_min_us AS idle FROM linked GROUP BY ALL
), chains AS (
    SELECT c.hk, c.chain, c.idle, coalesce(h.f0 > epoch_us($xstart) AND c.c1 < h.l1, false) AS startup
    FROM chained c LEFT JOIN holder h ON h.hk = c.hk AND h.f0 = c.c0
), low AS (
    SELECT l.pid, sum(CASE WHEN c.startup THEN l.r1 - l.r0 ELSE 0 END) / 1e6 AS startup_s,
           sum(CASE WHEN c.idle AND NOT c.startup THEN l.r1 - l.r0 ELSE 0 END) / 1e6 AS idle_s
    FROM linked l JOIN chains c USING (hk, chain) GROUP BY l.pid
), part AS (
    SELECT h.cluster, h.scheduler, h.job_key, h.job_id, h.user_name, h.account, h.partition, h.model, h.equiv, h.hk, h.inside,
           h.data_s, least(coalesce(w.startup_s, 0), h.data_s) AS startup_s,
           least(coalesce(w.idle_s, 0) + h.idle_inner_us / 1e6, h.data_s - least(coalesce(w.startup_s, 0), h.data_s)) AS idle_s, h.nop_s,
           h.sm_active_s / nullif(h.sm_active_known_s, 0) AS sm, h.tensor_active_s / nullif(h.tensor_active_known_s, 0) AS tensor,
           h.pcie_rx_bytes_per_s_s / nullif(h.pcie_rx_bytes_per_s_known_s, 0) AS rx,
           CASE WHEN h.nvlink_rx_bytes_per_s_known_s > 0 OR h.nvlink_tx_bytes_per_s_known_s > 0
                THEN coalesce(h.nvlink_rx_bytes_per_s_s / nullif(h.nvlink_rx_bytes_per_s_known_s, 0), 0)
                   + coalesce(h.nvlink_tx_bytes_per_s_s / nullif(h.nvlink_tx_bytes_per_s_known_s, 0), 0) END AS nvl
    FROM (SELECT * REPLACE (CASE WHEN inside THEN data_s ELSE 0 END AS data_s), rowid AS pid FROM wheld) h
    LEFT JOIN low w ON w.pid = h.pid
), nop AS (
    SELECT * RENAME (idle_s AS low_s), greatest(least(coalesce(nop_s, 0), data_s) - startup_s, 0) AS no_process_s FROM part
), split AS (
    SELECT *, greatest(low_s - no_process_s, 0) AS idle_s,
           sm IS NOT NULL AND rx IS NOT NULL AS input_known, nvl IS NOT NULL AND tensor IS NOT NULL AND sm IS NOT NULL AS comm_known
    FROM nop
), judged AS (
    SELECT *, data_s - startup_s - idle_s - no_process_s AS rest_s,
           coalesce(input_known AND sm < $input_sm_active_max AND rx >= $input_pcie_rx_min, false) AS is_input,
           coalesce(comm_known AND nvl >= $comm_nvlink_min AND tensor < $comm_tensor_max AND sm < $comm_sm_active_max, false) AS is_comm
    FROM split
)
SELECT cluster, scheduler, job_key, any_value(job_id) AS job_id, any_value(user_name) AS user_name, any_value(account) AS account,
       any_value(partition) AS partition, model, min(hk) AS hk_min, max(hk) AS hk_max, bool_or(inside) AS any_inside,
       sum(data_s * equiv) AS data_s,
       sum(startup_s * equiv) AS startup_s, sum(no_process_s * equiv) AS no_process_s, sum(idle_s * equiv) AS idle_s,
       sum(CASE WHEN is_input THEN rest_s * equiv ELSE 0 END) AS input_bound_s,
       sum(CASE WHEN is_comm AND NOT is_input THEN rest_s * equiv ELSE 0 END) AS communication_bound_s,
       sum(CASE WHEN input_known AND NOT is_input THEN rest_s * equiv ELSE 0 END) AS compute_s,
       sum(CASE WHEN NOT input_known THEN rest_s * equiv ELSE 0 END) AS busy_unresolved_s,
       sum(CASE WHEN input_known AND comm_known AND NOT is_input AND NOT is_comm THEN rest_s * equiv ELSE 0 END) AS compute_multi_s,
       sum(CASE WHEN NOT (input_known AND comm_known) AND NOT is_input AND NOT is_comm THEN rest_s * equiv ELSE 0 END)
           AS busy_unresolved_multi_s,
       sum(CASE WHEN input_known THEN rest_s * equiv ELSE 0 END) AS input_told_s,
       sum(CASE WHEN comm_known THEN rest_s * equiv ELSE 0 END) AS comm_told_s,
       sum(rest_s * equiv) AS busy_s,
       coalesce(bool_or(rest_s > 0 AND sm IS NULL), false) AS sm_missing, coalesce(bool_or(rest_s > 0 AND rx IS NULL), false) AS rx_missing,
       coalesce(bool_or(rest_s > 0 AND nvl IS NULL), false) AS nvl_missing,
       coalesce(bool_or(rest_s > 0 AND tensor IS NULL), false) AS tensor_missing
FROM judged GROUP BY cluster, scheduler, job_key, model
ORDER BY cluster, scheduler, job_key, model
"""
