"""The row-by-row definitions the interval arrays are held to: only tests read them.

The raw path (tests/support/raw_analysis.py) computes every figure from sample arrays
(tests/support/gputime.py); these queries state the same rules one sample interval at a time, in
SQL, so the property tests can compare the two on random fleets:

  iv   GPU intervals: each sample holds from its time until the next sample of the same GPU (or
       MIG instance), for at most max_gap; beyond that the time is "no data". Read over the
       window extended by `idle_min_duration + max_gap` on both sides ($xstart, $xend), so an
       idle stretch that crosses the window edge is judged by its whole length.
  pc   pieces: iv intersected with al (the analysis' allocation table, sql.ALLOCATIONS) - the
       time a job held a GPU, with that time's samples.
  islands(pred)  maximal stretches of one job's back-to-back pieces where `pred` holds: what
       tests/support/stretches.py finds from the arrays' runs.
  HELD  when any job held a GPU (al's overlapping or touching allocations merged): what
       RawAnalysis.held_data merges in arrays for per_gpu's allocated data.

build(analysis, "iv", "pc") creates the temp tables on the analysis' own cursor; the tests then
query them with Analysis.q.
"""

from __future__ import annotations

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.sql import bound, clip_seconds, gpu_equiv

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
# gap between them; a stretch counts only if its whole length reaches $min_idle seconds. The
# row-by-row definition of what tests/support/stretches.py computes from runs: tests/test_analytics_gputime.py
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

# what gputime.GpuTime.runs tests per interval, kind "idle" and kind "no_process"
# When any job held a GPU: overlapping holders (a shared GPU, a mapping that outlives its job by
# max_gap) merged, so a second holder is not counted twice (Analysis.held_data).
HELD = """
SELECT cluster, host, gpu_uuid, gi, min(a0) AS a0, max(a1) AS a1 FROM (
    SELECT *, sum(starts) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY a0, a1 ROWS UNBOUNDED PRECEDING) AS grp
    FROM (SELECT cluster, host, gpu_uuid, gi, a0, a1,
                 CASE WHEN a0 <= max(a1) OVER (PARTITION BY cluster, host, gpu_uuid, gi ORDER BY a0, a1
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS starts
          FROM al))
GROUP BY cluster, host, gpu_uuid, gi, grp
"""

IDLE_PRED = "util IS NOT NULL AND util < $thr"
NO_PROCESS_PRED = "procs IS NOT NULL AND procs = 0"


def islands(pred: str) -> str:
    return ISLANDS.format(pred=pred, clip=clip_seconds("p0", "p1"))


def temp_tables(a: Analysis) -> set[str]:
    """The temp tables on the analysis' cursor (iv and pc, once built)."""
    return {r[0] for r in a.con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}


def build(a: Analysis, *names: str) -> None:
    """Create the temp tables iv and/or pc (pc needs iv) on the analysis' cursor, unless there."""
    need = {"iv", "pc"} & set(names) | ({"iv"} if "pc" in names else set())
    # the definitions read the analysis' allocations (al), which an analysis from facts reads when a
    # figure first needs them: asked for through its own query method, which makes them
    a.q("SELECT count(*) FROM al")
    have = temp_tables(a)
    for name, stmt in (("iv", INTERVALS), ("pc", PIECES)):  # pc is built from iv
        if name in need and name not in have:
            a.con.execute(stmt, bound(stmt, a.bind))
