"""Every analytics query, named once. Parameters are bound ($name), never formatted in.

The pipeline, over the store's reader views (gpufleet.collector.store.open_reader):

  cap  capacity: each inventory GPU's seconds in the window (CAPACITY).
  al   allocation intervals: which job held which GPU, from the exporters' job mapping
       (allocations) and the scheduler's start/end (jobs) (ALLOCATIONS).

Every figure comes from analytics/gputime.py, which reads the samples as arrays (SAMPLE_ARRAYS,
below), applies the interval rule to them and reads allocations, pieces and idle runs by
look-up. The same rules row by row (iv, pc, islands) are the tests' reference, in
tests/support/oracle_sql.py.

Figures clip everything to [$start, $end) with clip_seconds().
"""

from __future__ import annotations

# seconds of [a, b) that fall inside [$start, $end)
CLIP = "greatest(0, epoch(least({b}, $end)) - epoch(greatest({a}, $start)))"


def clip_seconds(a: str, b: str) -> str:
    return CLIP.format(a=a, b=b)


# MIG instances count as their share of the GPU's compute slices (A30: 4 slices, others 7).
def gpu_equiv(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return f"""CASE WHEN {a}mig_profile IS NULL THEN 1.0
     ELSE coalesce(try_cast(regexp_extract({a}mig_profile, '^(\\d+)g\\.', 1) AS DOUBLE), 1.0)
          / CASE WHEN {a}model LIKE '%A30%' THEN 4.0 ELSE 7.0 END END"""


# Capacity: a GPU counts from its first sighting in the inventory until it has not been seen for
# $retire_after (then it is taken as removed), but never past $as_of (now, or the window end): so a
# GPU that is lost, or whose exporter is down - also until the end of the window - still counts,
# as "no data", and a decommissioned one stops counting a while after it went.
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

ALLOCATIONS = """
CREATE OR REPLACE TEMP TABLE al AS
SELECT a.cluster, a.scheduler, a.job_key, a.host, a.gpu_uuid, a.gpu_instance AS gi,
       greatest(coalesce(j.start, a.first_seen), $xstart) AS a0,
       least(coalesce(j."end", a.last_seen + to_seconds($max_gap)), $xend) AS a1,
       coalesce(j.job_id, a.job_key) AS job_id, j.name, j.user_name, j.account, j.partition, j.state
FROM allocations a
LEFT JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
WHERE ($cluster IS NULL OR a.cluster = $cluster)
  AND ($account IS NULL OR j.account = $account) AND ($user_name IS NULL OR j.user_name = $user_name)
  AND ($partition IS NULL OR j.partition = $partition)
  AND least(coalesce(j."end", a.last_seen + to_seconds($max_gap)), $xend) > greatest(coalesce(j.start, a.first_seen), $xstart)
"""

# Does any sample near the window carry a compute-process count (the gpufleet exporter publishes
# one, dcgm-exporter does not)? A sample holds at most max_gap, so earlier ones cannot reach in.
HAS_PROCESS_COUNTS = """
SELECT count(*) AS n FROM (
    SELECT 1 FROM gpu_samples
    WHERE compute_processes IS NOT NULL AND ts > $start - to_seconds($max_gap) AND ts < $end
      AND ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model)
    LIMIT 1)
"""

# --- the array path (analytics/gputime.py) ---

# A GPU variant - the GPU (cluster, host, gpu_uuid, MIG instance) with its gpu index, model and
# MIG profile - named by one 64-bit hash, so 40M samples leave DuckDB without a string each.
GPU_HASH = "hash(cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::INTEGER, gpu::INTEGER, model, mig_profile)"
_VARIANT_COLS = "cluster, host, gpu_uuid, coalesce(gpu_instance, -1)::SMALLINT AS gi, gpu, model, mig_profile"

# the rows oracle_sql.INTERVALS (tests/support) reads, in the store's file order (which keeps each
# GPU's samples in time order), as narrow as they go: NaN stands for a NULL utilization (so the
# columns reach numpy without a copy), nop is "held with no compute process"
# (oracle_sql.NO_PROCESS_PRED)
_SAMPLE_ARRAYS = f"""
SELECT {GPU_HASH} AS h, epoch_us(ts) AS ts,
       coalesce(coalesce(gpu_util, gr_engine_active * 100)::FLOAT, 'NaN'::FLOAT) AS util,
       coalesce(compute_processes = 0, false) AS nop{{detail}}
FROM gpu_samples
WHERE ts >= $xstart - to_seconds($max_gap) AND ts < $xend
  AND ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model)
"""
SAMPLE_ARRAYS = _SAMPLE_ARRAYS.format(detail="")
# ... and with what the per-job detail needs (memory high-water, MFU's tensor activity and clock)
SAMPLE_ARRAYS_DETAIL = _SAMPLE_ARRAYS.format(detail=""",
       coalesce(fb_used_mib::FLOAT, 'NaN'::FLOAT) AS fb, coalesce(tensor_active::FLOAT, 'NaN'::FLOAT) AS tensor,
       coalesce(sm_clock_mhz::FLOAT, 'NaN'::FLOAT) AS clock""")

# the variants behind the hashes in _want_h: from the inventory, and (rarely) from the samples
INVENTORY_VARIANTS = f"""
SELECT DISTINCT {GPU_HASH} AS h, {_VARIANT_COLS}, {gpu_equiv()} AS equiv
FROM gpus WHERE {GPU_HASH} IN (SELECT h FROM _want_h)
"""
SAMPLE_VARIANTS = f"""
SELECT DISTINCT {GPU_HASH} AS h, {_VARIANT_COLS}, {gpu_equiv()} AS equiv
FROM gpu_samples
WHERE ts >= $xstart - to_seconds($max_gap) AND ts < $xend AND {GPU_HASH} IN (SELECT h FROM _want_h)
"""

# When any job held a GPU: overlapping holders (a shared GPU, a mapping that outlives its job by
# max_gap) merged, so a second holder is not counted twice.
HELD = """
SELECT cluster, host, gpu_uuid, gi, min(a0) AS a0, max(a1) AS a1 FROM (
    SELECT *, sum(starts) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY a0, a1 ROWS UNBOUNDED PRECEDING) AS grp
    FROM (SELECT cluster, host, gpu_uuid, gi, a0, a1,
                 CASE WHEN a0 <= max(a1) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY a0, a1
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS starts
          FROM al))
GROUP BY cluster, host, gpu_uuid, gi, grp
"""

# Per GPU: capacity from the inventory, data / busy / held-data seconds from gpu_use (gputime).
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

# Idle stretches: a run (back-to-back intervals of one GPU where the predicate holds, at least
# $min_idle long; gputime.GpuTime.runs) intersected with each allocation of that GPU - exactly
# the maximal chains of such pieces of one job (oracle_sql.ISLANDS, in tests/support), found
# without the pieces.
STRETCHES = f"""
SELECT cluster, scheduler, job_key, host, gpu_uuid, gi,
       row_number() OVER (PARTITION BY cluster, scheduler, job_key, host, gpu_uuid, gi ORDER BY s0) AS island,
       job_id, user_name, account, partition, model, gpu, equiv, s0, s1, {clip_seconds("s0", "s1")} AS in_window_s
FROM (
    SELECT a.cluster, a.scheduler, a.job_key, a.host, a.gpu_uuid, a.gi, a.job_id, a.user_name, a.account, a.partition,
           v.model, v.gpu, v.equiv, greatest(r.r0, a.a0) AS s0, least(r.r1, a.a1) AS s1
    FROM runs r JOIN alv a ON a.gid = r.gid AND r.r1 > a.a0 AND r.r0 < a.a1
    JOIN variants v ON v.vid = r.vid)
WHERE epoch_us(s1) - epoch_us(s0) >= $min_idle * 1000000
"""

# Time-weighted data and busy GPU-hours per job dimension, from each allocation's look-ups
# (alv: al with data_s, busy_s and whether any sample interval overlaps it, as a piece would).
JOB_USE = """
SELECT {keys}, sum(data_s) / 3600 AS data_gpu_h, sum(busy_s) / 3600 AS busy_gpu_h
FROM alv WHERE has_piece GROUP BY ALL
"""

# The job filters every job query applies (bound parameters; NULL means no filter).
JOB_FILTERS = """($cluster IS NULL OR cluster = $cluster) AND ($account IS NULL OR account = $account)
  AND ($user_name IS NULL OR user_name = $user_name) AND ($partition IS NULL OR partition = $partition)"""

# Allocated GPU-seconds from scheduler accounting: GPUs x the job's run time inside the window
# (a running job counts until $as_of: the window end, or now if the window reaches the future).
_RUN = clip_seconds("start", 'coalesce("end", $as_of)')
# a pod holding MIG instances (gpu_type "mig-3g.40gb") holds 3/7 of a GPU per instance
_JOB_EQUIV = """(CASE WHEN gpu_type LIKE 'mig-%' AND gpu_type NOT LIKE '%,%'
      THEN coalesce(try_cast(regexp_extract(gpu_type, '^mig-(\\d+)g\\.', 1) AS DOUBLE) / 7.0, 1.0) ELSE 1.0 END)"""
JOB_ALLOCATED = f"""
SELECT cluster, scheduler, job_key, job_id, name, user_name, account, partition, state, gpus, gpu_type,
       submit, start, "end",
       {_RUN} AS run_s,
       coalesce(gpus, 0) * {_JOB_EQUIV} * {_RUN} AS alloc_gpu_s
FROM jobs
WHERE start IS NOT NULL AND start < $end AND coalesce("end", $as_of) > $start
  AND {JOB_FILTERS}
"""
