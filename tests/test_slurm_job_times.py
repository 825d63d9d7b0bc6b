"""Issue #13 item 3: a job's start/end follow its state, in every Slurm input, and its GPUs come
from what it asked for when the accounting TRES do not track gres/gpu.

Golden cases, arithmetic in the comments. The rows are our own, written in the shapes of the
held-out files the issue quotes (XDMoD `non-ended-job-state`, slurmdbd/slurmrestd records, a
Slurm 25.11 slurmctld job); those files are not in shared/data.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from gpufleet.collector.sources.slurm_json import parse_slurmrestd_jobs
from gpufleet.collector.sources.slurm_parse import parse_sacct

NOW = datetime(2026, 11, 20, 12, 0, 0)
# XDMoD's sacct format (shared/data/slurm/sacct/xdmod_FORMAT_header.txt)
XDMOD = ("jobid|jobidraw|cluster|partition|qos|account|group|gid|user|uid|submit|eligible|start|end|elapsed|"
         "exitcode|state|nnodes|ncpus|reqcpus|reqmem|reqtres|alloctres|timelimit|nodelist|jobname").split("|")


def xdmod_line(jobid: str, start: str, end: str, elapsed: str, state: str, tres: str = "cpu=8,gres/gpu=2,node=1") -> str:
    return "|".join([jobid, jobid, "ub-hpc", "general-compute", "normal", "acct", "grp", "1000", "u", "1000",
                     "2026-03-01T08:00:00", "2026-03-01T08:00:00", start, end, elapsed, "0:0", state, "1", "8",
                     "8", "32000Mn", tres, tres, "2-00:00:00", "cpn-u25-01", "train"])


def one(text: str, **kw):
    jobs, rejected, problems = parse_sacct(text, fields=XDMOD, now=NOW, **kw)
    assert rejected == 0
    return jobs, problems


def run_seconds(job: dict, lo: datetime, hi: datetime, as_of: datetime) -> float:
    """A job's run inside [lo, hi) as analytics counts it (analytics/sql.py _RUN): from start to
    coalesce(end, as_of), so a job with no end is still running at as_of."""
    if job["start"] is None:
        return 0.0
    a, b = max(job["start"], lo), min(job["end"] or as_of, hi)
    return max(0.0, (b - a).total_seconds())


# ---- sacct text ----------------------------------------------------------------------------


def test_running_row_with_end_equal_to_start_has_no_end():
    # XDMoD non-ended-job-state row 3451067: RUNNING, End printed = Start, Elapsed 22:32:22 so far
    line = xdmod_line("3451067", "2026-03-01T09:15:00", "2026-03-01T09:15:00", "22:32:22", "RUNNING")
    (job,), problems = one(line)
    assert problems == []
    assert (job["state"], job["start"], job["end"], job["gpus"]) == ("RUNNING", datetime(2026, 3, 1, 9, 15), None, 2)
    # before: end = start, 0 s. Now it runs until as_of: 2026-03-02T07:47:22 (= 09:15:00 + 22:32:22)
    # -> 81142 s (22*3600 + 32*60 + 22) x 2 GPUs = 162284 GPU-s
    as_of = datetime(2026, 3, 2, 7, 47, 22)
    assert run_seconds(job, datetime(2026, 3, 1), as_of, as_of) * job["gpus"] == 2 * 81142 == 162284

    # sacct of other versions prints End Unknown for the same job: same row
    (same,), _ = one(xdmod_line("3451067", "2026-03-01T09:15:00", "Unknown", "22:32:22", "RUNNING"))
    assert (same["start"], same["end"]) == (job["start"], None)


def test_pending_row_has_neither_start_nor_end():
    # Start is the scheduler's plan (2026-03-05), End = plan + time limit 2-00:00:00: neither is a fact
    (planned,), _ = one(xdmod_line("3451070", "2026-03-05T00:00:00", "2026-03-07T00:00:00", "00:00:00", "PENDING"))
    (unknown,), _ = one(xdmod_line("3451071", "Unknown", "Unknown", "00:00:00", "PENDING"))
    for job in (planned, unknown):
        assert (job["state"], job["start"], job["end"], job["submit"]) == ("PENDING", None, None, datetime(2026, 3, 1, 8))


@pytest.mark.parametrize("end", ["Unknown", "2026-03-01T09:15:00"])  # missing, or printed = Start
def test_ended_row_without_an_end_gets_start_plus_elapsed(end):
    # NODE_FAIL, Elapsed 05:43:35 = 5*3600 + 43*60 + 35 = 20615 s
    # end = 2026-03-01T09:15:00 + 05:43:35 = 2026-03-01T14:58:35
    (job,), problems = one(xdmod_line("3451080", "2026-03-01T09:15:00", end, "05:43:35", "NODE_FAIL"))
    assert problems == []
    assert (job["state"], job["start"], job["end"]) == ("NODE_FAIL", datetime(2026, 3, 1, 9, 15), datetime(2026, 3, 1, 14, 58, 35))
    assert (job["end"] - job["start"]).total_seconds() == 20615


def test_ended_rows_that_say_their_end_keep_it():
    text = "\n".join([
        # XDMoD 5692623 shape: COMPLETED, Start = End, Elapsed 00:00:00: it really ran 0 s
        xdmod_line("5692623", "2016-08-01T07:04:09", "2016-08-01T07:04:09", "00:00:00", "COMPLETED"),
        # a requeued record is a finished attempt: 10:00:00 -> 13:30:00 (Elapsed 03:30:00 agrees)
        xdmod_line("3451090", "2026-03-01T10:00:00", "2026-03-01T13:30:00", "03:30:00", "REQUEUED"),
        # End given and Elapsed shorter (suspended 1 h): End wins, it is the fact
        xdmod_line("3451091", "2026-03-01T10:00:00", "2026-03-01T13:00:00", "02:00:00", "TIMEOUT"),
    ])
    (zero, requeued, timeout), problems = one(text)
    assert problems == []
    assert (zero["start"], zero["end"]) == (datetime(2016, 8, 1, 7, 4, 9), datetime(2016, 8, 1, 7, 4, 9))
    assert (requeued["state"], requeued["end"]) == ("REQUEUED", datetime(2026, 3, 1, 13, 30))
    assert timeout["end"] == datetime(2026, 3, 1, 13)


def test_ended_row_with_no_evidence_of_its_end_is_reported_not_invented():
    text = "\n".join([
        xdmod_line("3451095", "2026-03-01T10:00:00", "Unknown", "", "FAILED"),  # no End, no Elapsed
        xdmod_line("3451096", "2026-03-01T10:00:00", "2026-03-01T11:00:00", "01:00:00", "COMPLETED"),
    ])
    (failed, good), problems = one(text)
    assert (failed["state"], failed["start"], failed["end"]) == ("FAILED", datetime(2026, 3, 1, 10), None)
    assert good["end"] == datetime(2026, 3, 1, 11)  # the good row around it is kept
    assert problems == ["line 1: job 3451095 is FAILED but has no end time and no Start + Elapsed to derive it: "
                        "end left unknown, so it reads as not ended"]
    # a format without an End column reports nothing missing (test_every_documented_state)
    assert parse_sacct("JobID|State\n1|FAILED\n", now=NOW)[2] == []


def test_times_follow_the_state_in_the_clusters_zone():
    # Elapsed is added in UTC: 09:15 EST = 14:15 UTC, + 05:43:35 = 19:58:35 UTC
    (job,), _ = one(xdmod_line("3451081", "2026-03-01T09:15:00", "Unknown", "05:43:35", "NODE_FAIL"), tz="America/New_York")
    assert (job["start"], job["end"]) == (datetime(2026, 3, 1, 14, 15), datetime(2026, 3, 1, 19, 58, 35))


# ---- sacct --json / slurmrestd /slurmdb/ (slurmdbd records) --------------------------------

T0 = 1_772_000_000  # 2026-02-25T06:13:20 UTC


def dbjob(job_id: int, state: list[str], start: int, end: int, elapsed: int, gpus: int = 1) -> dict:
    """A slurmdbd job record as sacct --json / slurmrestd v0.0.41-v0.0.44 give it."""
    return {
        "job_id": job_id, "name": "j", "user": "u", "account": "a", "partition": "gpu", "cluster": "c",
        "state": {"current": state, "reason": "None"},
        "time": {"submission": T0 - 60, "eligible": T0 - 60, "start": start, "end": end, "elapsed": elapsed,
                 "limit": {"set": True, "infinite": False, "number": 10080}},
        "tres": {"allocated": [{"type": "cpu", "name": "", "id": 1, "count": 8},
                               {"type": "gres", "name": "gpu", "id": 1001, "count": gpus}] if start else [],
                 "requested": [{"type": "gres", "name": "gpu", "id": 1001, "count": gpus}]},
        "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "infinite": False, "number": 0}},
        "allocation_nodes": 1, "nodes": "g1" if start else "None assigned", "restart_cnt": 0,
    }


def test_slurmdb_node_fail_with_end_zero_ends_at_start_plus_elapsed():
    # NODE_FAIL, time.end 0, time.elapsed 20615: end = T0 + 20615 = 1772020615 = 2026-02-25T11:56:55
    jobs, rejected, problems = parse_slurmrestd_jobs({"jobs": [dbjob(900, ["NODE_FAIL"], T0, 0, 20615)]}, now=NOW)
    assert (rejected, problems) == (0, [])
    (job,) = jobs
    assert (job["state"], job["start"], job["end"]) == (
        "NODE_FAIL", datetime(2026, 2, 25, 6, 13, 20), datetime(2026, 2, 25, 11, 56, 55))
    assert (job["end"] - job["start"]).total_seconds() == 20615


def test_ended_slurmdb_records_count_no_gpu_hours_in_a_later_week():
    # NODE_FAIL (end 0, elapsed 20615 s) and a REQUEUED attempt (T0 .. T0 + 3600), 1 GPU each.
    # Read as running, each counted 168 h x 1 GPU in the week after: 2 x 168 = 336 GPU-h.
    doc = {"jobs": [dbjob(900, ["NODE_FAIL"], T0, 0, 20615), dbjob(901, ["REQUEUED"], T0, T0 + 3600, 3600)]}
    jobs, _, problems = parse_slurmrestd_jobs(doc, now=NOW)
    assert problems == []
    node_fail, requeued = jobs
    assert requeued["end"] == datetime(2026, 2, 25, 7, 13, 20)  # T0 + 3600
    week = datetime(2026, 3, 2), datetime(2026, 3, 9)
    assert sum(run_seconds(j, *week, as_of=week[1]) * j["gpus"] for j in jobs) / 3600 == 0  # was 336
    # and their own hours: (20615 + 3600) s x 1 GPU = 24215 GPU-s
    assert sum(run_seconds(j, datetime(2026, 2, 25), week[0], as_of=week[1]) * j["gpus"] for j in jobs) == 24215


def test_slurmdb_open_records():
    doc = {"jobs": [
        dbjob(910, ["RUNNING"], T0, 0, 1200),  # running: end 0 -> None, start kept
        dbjob(911, ["PENDING"], 0, 0, 0),  # pending: no start, no end
        dbjob(912, ["PENDING", "REQUEUED"], T0 + 86400, T0 + 86400 * 2, 0),  # requeued, back in the queue: planned times only
        dbjob(913, ["SUSPENDED"], T0, T0 + 500, 500),  # suspended: has started, has not ended
    ]}
    jobs, rejected, problems = parse_slurmrestd_jobs(doc, now=NOW)
    assert (rejected, problems) == (0, [])
    t0 = datetime(2026, 2, 25, 6, 13, 20)
    assert [(j["job_id"], j["state"], j["start"], j["end"]) for j in jobs] == [
        ("910", "RUNNING", t0, None), ("911", "PENDING", None, None), ("912", "PENDING", None, None),
        ("913", "SUSPENDED", t0, None)]


def test_slurmdb_ended_record_with_no_evidence_is_reported():
    rec = dbjob(920, ["FAILED"], T0, 0, 0)
    del rec["time"]["elapsed"]
    jobs, rejected, problems = parse_slurmrestd_jobs({"jobs": [rec, dbjob(921, ["COMPLETED"], T0, T0 + 60, 60)]}, now=NOW)
    assert rejected == 0 and [j["end"] for j in jobs] == [None, datetime(2026, 2, 25, 6, 14, 20)]  # T0 + 60
    assert problems == ["jobs[0]: job 920 is FAILED but has no end time and no Start + Elapsed to derive it: "
                        "end left unknown, so it reads as not ended"]


# ---- slurmctld (/slurm/ jobs, scontrol --json): GPUs from tres_per_job / tres_per_node --------


def ctld(job_id: int, state: str = "COMPLETED", **kw) -> dict:
    """A slurmctld job as slurmrestd v0.0.44 (Slurm 25.11) gives it, AccountingStorageTRES without gres/gpu."""
    n = lambda v: {"set": True, "infinite": False, "number": v}  # noqa: E731
    job = {"job_id": job_id, "job_state": [state], "name": "j", "user_name": "u", "account": "a",
           "partition": "gpu", "node_count": n(1), "nodes": "g1", "gres_detail": [],
           "start_time": n(T0), "end_time": n(T0 + 3600), "submit_time": n(T0 - 60),
           "tres_alloc_str": "cpu=8,mem=64G,node=1,billing=8", "tres_req_str": "cpu=8,mem=64G,node=1,billing=8",
           "tres_per_job": "", "tres_per_node": "", "tres_per_task": "", "requeue": False, "restart_cnt": n(0)}
    job.update(kw)
    return job


def test_gpus_from_tres_per_job_and_per_node():
    n = lambda v: {"set": True, "infinite": False, "number": v}  # noqa: E731
    doc = {"jobs": [
        ctld(5141, tres_per_node="gres/gpu:4"),  # 25.11 job 5141: 4 per node x 1 node = 4 (was 0)
        ctld(5142, tres_per_job="gres/gpu:a100:2"),  # per job: 2 a100
        ctld(5143, tres_per_node="gres:gpu:4", node_count=n(2), nodes="g[1-2]"),  # 23.02 spelling: 4 x 2 nodes = 8
        ctld(5144, tres_per_node="gres/gpu:h100:2,gres/shard:1", node_count=n(0), nodes="g[1-3]"),  # 2 x 3 hosts = 6
        ctld(5145, tres_per_node="gres/gpu:4", node_count=n(0), nodes=""),  # GPUs, but how many nodes: unknown
        ctld(5146, tres_per_node="gres/shard:2"),  # no GPU asked for: TRES say none -> 0
        ctld(5147, tres_alloc_str="cpu=8,gres/gpu=1,node=1", tres_per_node="gres/gpu:4"),  # accounting wins: 1
    ]}
    jobs, rejected, problems = parse_slurmrestd_jobs(doc, now=NOW)
    assert (rejected, problems) == (0, [])
    assert [(j["job_id"], j["gpus"], j["gpu_type"]) for j in jobs] == [
        ("5141", 4, None), ("5142", 2, "a100"), ("5143", 8, None), ("5144", 6, "h100"), ("5145", None, None),
        ("5146", 0, None), ("5147", 1, None)]
    # job 5141: COMPLETED T0 .. T0 + 3600 with 4 GPUs = 4 GPU-h (it was stored with 0)
    j = jobs[0]
    assert (j["state"], (j["end"] - j["start"]).total_seconds() * j["gpus"] / 3600) == ("COMPLETED", 4.0)


def test_slurmctld_times_follow_the_state():
    n = lambda v: {"set": True, "infinite": False, "number": v}  # noqa: E731
    doc = {"jobs": [
        ctld(5150, "RUNNING", end_time=n(T0 + 86400)),  # the time limit's forecast, not an end
        ctld(5151, "PENDING", start_time=n(T0 + 600), end_time=n(T0 + 600 + 86400)),  # planned
        ctld(5152, "NODE_FAIL", end_time=n(0)),  # no elapsed in slurmctld's shape: nothing to derive from
        ctld(5153, "REQUEUED"),  # ended attempt: T0 .. T0 + 3600 kept
    ]}
    jobs, rejected, problems = parse_slurmrestd_jobs(doc, now=NOW)
    t0 = datetime(2026, 2, 25, 6, 13, 20)
    assert [(j["state"], j["start"], j["end"]) for j in jobs] == [
        ("RUNNING", t0, None), ("PENDING", None, None), ("NODE_FAIL", t0, None), ("REQUEUED", t0, t0 + timedelta(hours=1))]
    assert problems == ["jobs[2]: job 5152 is NODE_FAIL but has no end time and no Start + Elapsed to derive it: "
                        "end left unknown, so it reads as not ended"]
