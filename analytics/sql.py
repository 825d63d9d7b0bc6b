"""Every analytics query, named once. Parameters are bound ($name), never formatted in.

The pipeline, over the store's reader views (collector.store.open_reader):

  iv   GPU intervals: each sample holds from its time until the next sample of the same GPU (or
       MIG instance), for at most max_gap; beyond that the time is "no data". Read over the
       window extended by `idle_min_duration + max_gap` on both sides ($xstart, $xend), so an
       idle stretch that crosses the window edge is judged by its whole length.
  al   allocation intervals: which job held which GPU, from the exporters' job mapping
       (allocations) and the scheduler's start/end (jobs).
  pc   pieces: iv intersected with al - the time a job held a GPU, with that time's samples.

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

# Capacity: a GPU counts from its first to its last sighting (+max_gap) in the inventory, so a
# GPU that is lost or whose exporter is down still counts, as "no data".
CAPACITY = f"""
CREATE OR REPLACE TEMP TABLE cap AS
SELECT g.cluster, g.host, g.gpu_uuid, g.gpu_instance AS gi, g.gpu, g.model, g.mig_profile,
       {clip_seconds("g.first_seen", "g.last_seen + to_seconds($max_gap)")} AS capacity_s,
       {gpu_equiv("g")} AS equiv
FROM gpus g
WHERE ($cluster IS NULL OR g.cluster = $cluster) AND ($model IS NULL OR g.model = $model)
  AND g.first_seen < $end AND g.last_seen + to_seconds($max_gap) > $start
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

# Stretches ("islands") of consecutive pieces of one job on one GPU where `pred` holds, with no
# gap between them; a stretch counts only if its whole length reaches $min_idle seconds.
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
