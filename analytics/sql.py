"""Every analytics query, named once. Parameters are bound ($name), never formatted in.

The pipeline, over the store's reader views (gpufleet.collector.store.open_reader):

  iv   GPU intervals: each sample holds from its time until the next sample of the same GPU (or
       MIG instance), for at most max_gap; beyond that the time is "no data". Read over the
       window extended by `idle_min_duration + max_gap` on both sides ($xstart, $xend), so an
       idle stretch that crosses the window edge is judged by its whole length.
  al   allocation intervals: which job held which GPU, from the exporters' job mapping
       (allocations) and the scheduler's start/end (jobs).
  pc   pieces: iv intersected with al - the time a job held a GPU, with that time's samples.

iv and pc state the rules row by row; no figure reads them any more (the tests hold the arrays to
them): every figure comes from analytics/gputime.py, which applies the same interval rule to the
samples as arrays (SAMPLE_ARRAYS, below) and reads allocations, pieces and idle runs by look-up.

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


INTERVALS = f"""
CREATE OR REPLACE TEMP TABLE iv AS
WITH s AS (
    SELECT cluster, host, gpu_uuid, coalesce(gpu_instance, -1) AS gi, gpu, model, mig_profile, ts,
           coalesce(gpu_util, gr_engine_active * 100)::DOUBLE AS util,
           compute_processes::DOUBLE AS procs, tensor_active::DOUBLE AS tensor_active,
           sm_clock_mhz::DOUBLE AS sm_clock_mhz, fb_used_mib::DOUBLE AS fb_used_mib
    FROM gpu_samples
    WHERE ts >= $xstart - to_seconds($max_gap) AND ts < $xend
      AND ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model)
), o AS (
    SELECT *, lead(ts) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY ts) AS next_ts FROM s
)
SELECT cluster, host, gpu_uuid, gi, gpu, model, mig_profile, util, procs, tensor_active, sm_clock_mhz, fb_used_mib,
       greatest(ts, $xstart) AS t0,
       least(coalesce(next_ts, ts + to_seconds($max_gap)), ts + to_seconds($max_gap), $xend) AS t1,
       {gpu_equiv()} AS equiv
FROM o
WHERE least(coalesce(next_ts, ts + to_seconds($max_gap)), ts + to_seconds($max_gap), $xend) > greatest(ts, $xstart)
"""

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

# Joining iv with time ranges [r0, r1) of the same GPU on "iv.t1 > r0 AND iv.t0 < r1" alone is a
# hash join on the GPU that then compares every sample of a GPU with every range of it: for a
# week of 15 s samples and hundreds of jobs per GPU, billions of comparisons. An iv interval is at
# most max_gap long, so one overlapping [r0, r1) starts in an hour from hour(r0 - max_gap) to
# hour(r1): list each range once per such hour (range_hours) and add "hour of iv.t0 = that hour"
# (iv_hour) to the join keys, and every overlapping pair is found exactly once.
HOUR_US = 3_600_000_000


def iv_hour(t0: str = "iv.t0") -> str:
    return f"(epoch_us({t0}) // {HOUR_US})"


def range_hours(r0: str, r1: str) -> str:
    return f"unnest(range(epoch_us({r0} - to_seconds($max_gap)) // {HOUR_US}, epoch_us({r1}) // {HOUR_US} + 1))"


PIECES = f"""
CREATE OR REPLACE TEMP TABLE pc AS
WITH ah AS (SELECT *, {range_hours("a0", "a1")} AS hour FROM al)
SELECT al.cluster, al.scheduler, al.job_key, al.job_id, al.name, al.user_name, al.account, al.partition, al.state,
       al.host, al.gpu_uuid, al.gi, iv.gpu, iv.model, iv.mig_profile, iv.equiv,
       iv.util, iv.procs, iv.tensor_active, iv.sm_clock_mhz, iv.fb_used_mib,
       greatest(iv.t0, al.a0) AS p0, least(iv.t1, al.a1) AS p1
FROM iv JOIN ah al
  ON iv.cluster = al.cluster AND iv.host = al.host AND iv.gpu_uuid = al.gpu_uuid AND iv.gi = al.gi
 AND {iv_hour()} = al.hour AND iv.t1 > al.a0 AND iv.t0 < al.a1
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

# the rows sql.INTERVALS reads, in the store's file order (which keeps each GPU's samples in time
# order), as narrow as they go: NaN stands for a NULL utilization (so the columns reach numpy
# without a copy), nop is NO_PROCESS_PRED
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
# the maximal chains of such pieces of one job (ISLANDS, below), found without the pieces.
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

# Stretches ("islands") of consecutive pieces of one job on one GPU where `pred` holds, with no
# gap between them; a stretch counts only if its whole length reaches $min_idle seconds. The
# row-by-row definition of what STRETCHES computes from runs: tests/test_analytics_gputime.py
# holds the two to the same answers.
ISLANDS = """
WITH p AS (
    SELECT *, ({pred}) AS hit,
           lag(p1) OVER w AS prev_end, lag({pred}) OVER w AS prev_hit
    FROM pc
    WINDOW w AS (PARTITION BY cluster, scheduler, job_key, host, gpu_uuid, gi ORDER BY p0)
), q AS (
    SELECT *, sum(CASE WHEN hit AND prev_hit AND prev_end = p0 THEN 0 ELSE 1 END)
              OVER (PARTITION BY cluster, scheduler, job_key, host, gpu_uuid, gi ORDER BY p0 ROWS UNBOUNDED PRECEDING) AS island
    FROM p
)
SELECT cluster, scheduler, job_key, host, gpu_uuid, gi, island,
       any_value(job_id) AS job_id, any_value(user_name) AS user_name, any_value(account) AS account,
       any_value(partition) AS partition, any_value(model) AS model, any_value(gpu) AS gpu, any_value(equiv) AS equiv,
       min(p0) AS s0, max(p1) AS s1,
       sum({clip}) AS in_window_s
FROM q WHERE hit
GROUP BY ALL
HAVING sum(epoch(p1) - epoch(p0)) >= $min_idle
"""

IDLE_PRED = "util IS NOT NULL AND util < $thr"
NO_PROCESS_PRED = "procs IS NOT NULL AND procs = 0"


def islands(pred: str) -> str:
    return ISLANDS.format(pred=pred, clip=clip_seconds("p0", "p1"))


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

# The store's first GPU sighting within the cluster/model filters: where its history starts
# (gpufleet.analytics.trends: a previous window starting before it is only partly in the store).
HISTORY_START = """
SELECT min(first_seen) FROM gpus
WHERE ($cluster IS NULL OR cluster = $cluster) AND ($model IS NULL OR model = $model)
"""
