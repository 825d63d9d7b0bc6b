"""collector.schema.allocations_ending_after: the allocations a reader of a window reads without
joining the store's whole history. Every allocation run whose held stretch (ALLOCATION_END) passes
the time must be among them - with jobs and attempts of any shape: unknown ends and starts, an end
before the start, attempts of jobs the accounting lacks, sightings long before or after the job's
accounted run - or a window's figures would lose an allocation."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufleet.collector.reading import seen_floor
from gpufleet.collector.schema import (ALLOCATION_END, ALLOCATION_RUNS, ALLOCATION_START, ALLOCATIONS_DDL, JOB_ATTEMPTS_DDL, JOBS_DDL,
                                       allocations_ending_after)

T0 = datetime(2026, 11, 2)
hours = st.integers(0, 40).map(lambda h: T0 + timedelta(hours=h))
maybe = st.one_of(st.none(), hours)


MAX_GAP_S = 1800.0


def _rows(con: duckdb.DuckDBPyConnection, source: str, since: datetime) -> list[tuple]:
    q = f"""SELECT a.job_key, a.host, {ALLOCATION_START} AS s, {ALLOCATION_END} AS e
    FROM {source} a LEFT JOIN jobs j ON j.cluster = a.cluster AND j.scheduler = a.scheduler AND j.job_key = a.job_key
    {ALLOCATION_RUNS}
    WHERE {ALLOCATION_END} > $since ORDER BY ALL"""
    binds = {"since": since, "max_gap": MAX_GAP_S}
    return con.execute(q, {**binds, "seen_floor": seen_floor(con, since, MAX_GAP_S)} if "$seen_floor" in q else binds).fetchall()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), maybe, maybe), min_size=1, max_size=6),  # jobs: in the accounting?, start, end
       st.lists(st.tuples(st.integers(0, 5), hours, maybe), max_size=6),  # attempts: job, start, end
       st.lists(st.tuples(st.integers(0, 5), hours, st.integers(0, 12)), max_size=10),  # allocations: job, first seen, hours seen
       hours,
       st.lists(st.one_of(st.none(), st.integers(-30, 40)), min_size=6, max_size=6),  # each job's first submission (hours)
       st.integers(0, 20))  # how much later a requeued record was submitted (hours)
# an earlier attempt of unknown end, of a job that starts after the time and has not ended: the
# allocation, last seen long before, holds its GPU until the job's start
@example([(True, T0 + timedelta(hours=10), None)], [(0, T0 + timedelta(hours=2), None)], [(0, T0 + timedelta(hours=1), 1)],
         T0 + timedelta(hours=5), [None] * 6, 0)
# ... the same with its submissions known, the record requeued 9 h after the first: the floor takes the attempt's
# submission, not only the record's (which alone would put it after the allocation's last sighting)
@example([(True, T0 + timedelta(hours=10), None)], [(0, T0 + timedelta(hours=2), None)], [(0, T0 + timedelta(hours=1), 1)],
         T0 + timedelta(hours=5), [0] * 6, 9)
# ... and an attempt of unknown end whose next attempt starts after the time, of a job the
# accounting lacks: the allocation holds its GPU until that next start
@example([(False, None, None)], [(0, T0 + timedelta(hours=2), None), (0, T0 + timedelta(hours=10), None)],
         [(0, T0 + timedelta(hours=1), 1)], T0 + timedelta(hours=5), [1] * 6, 0)
def test_every_allocation_run_ending_after_the_time_is_read(jobs, attempts, allocations, since, submitted, requeued_h):
    """... and with the floor of its second read (schema.SEEN_FLOOR): a job's first submission (unknown for some) is its
    attempts' submission, its record's where it has none, a requeued record submitted `requeued_h` later; the mapping
    never sees it on a GPU earlier than max_gap before its first submission (sightings long before its accounted run)."""
    con = duckdb.connect()
    for ddl in (JOBS_DDL, ALLOCATIONS_DDL, JOB_ATTEMPTS_DDL):
        con.execute(ddl)
    first = [None if h is None else T0 + timedelta(hours=h) for h in submitted]
    requeued = {k for k, _, _ in attempts}
    for k, (listed, start, end) in enumerate(jobs):
        if listed:
            submit = None if first[k] is None else first[k] + timedelta(hours=requeued_h if k in requeued else 0)
            con.execute("INSERT INTO jobs (cluster, scheduler, job_key, job_id, submit, start, \"end\", source, updated_at) "
                        "VALUES ('c', 'slurm', ?, ?, ?, ?, ?, 'sacct', ?)", [f"j{k}", f"j{k}", submit, start, end, T0])
    for k, start, end in {(k, s, e) for k, s, e in attempts}:
        con.execute("INSERT OR IGNORE INTO job_attempts (cluster, scheduler, job_key, submit, start, \"end\", source, updated_at) "
                    "VALUES ('c', 'slurm', ?, ?, ?, ?, 'sacct', ?)", [f"j{k}", first[k], start, end, T0])
    for n, (k, seen, seen_h) in enumerate(allocations):
        seen = seen if first[k] is None else max(seen, first[k] - timedelta(seconds=MAX_GAP_S))
        con.execute("INSERT INTO allocations VALUES ('c', 'slurm', ?, ?, 'GPU-0', -1, 0, ?, ?, 'exporter')",
                    [f"j{k}", f"n{n}", seen, seen + timedelta(hours=seen_h)])
    assert _rows(con, allocations_ending_after("$since"), since) == _rows(con, "allocations", since)
