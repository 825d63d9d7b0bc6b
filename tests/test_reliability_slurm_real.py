"""Reliability against a real Slurm (tests/realstack/slurm.py): a job requeued with `scontrol
requeue` ends as two attempts of one job (requeued, then completed), a job on a node set DOWN ends
as a node failure, and a job our own policy cancels with the real scancel is "cancelled by
policy" (the same job would read "cancelled by an admin" without the audit row: root cancelled it).
Accounting is read by the real SacctSource's command (sacct --duplicates: every attempt), and
through the store: every attempt stored (the earlier ones in job_attempts) and classified."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.analytics import reliability as r, reliability_store
from gpufleet.analytics.params import Params
from gpufleet.analytics.policy import Action, JobFacts, Plan, Rules
from gpufleet.collector.schema import Batch
from gpufleet.collector.sources.slurm import SacctSource
from gpufleet.collector.sources.slurm_parse import latest_per_key, parse_sacct
from gpufleet.collector.store import StoreWriter, open_reader
from gpufleet.policy.enforce import Channels, Runner
from tests.realstack.process import wait_for

pytestmark = pytest.mark.realstack
CLUSTER = "gpufleet"


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def accounting(c, job_ids: list[int], since: datetime, timeout: float = 60) -> list[dict]:
    """Every accounting record (sacct --duplicates, through the collector's own command and parser)
    of the jobs. A windowed listing shows a record some seconds after `sacct -j` does (slurmdbd
    writes its end later): wait until every job is listed."""
    src = SacctSource(cluster=CLUSTER, env=c.env)
    keys = {str(k) for k in job_ids}
    mine: list[dict] = []

    def listed() -> bool:
        nonlocal mine
        text = src.sacct(since - timedelta(minutes=1), utcnow() + timedelta(minutes=1))
        rows, rejected, problems = parse_sacct(text, fields=src.fields, delimiter=src.delimiter, cluster=CLUSTER)
        assert rejected == 0, problems
        mine = [j for j in rows if j["job_key"] in keys]
        return {j["job_key"] for j in mine} == keys

    wait_for(f"jobs {sorted(keys)} in a windowed sacct", listed, timeout=timeout, daemons=c.daemons, interval=1)
    return mine


def attempts_of(c, job_ids: list[int], since: datetime) -> list[r.Attempt]:
    """The jobs' accounting records as numbered attempts."""
    return r.number_requeues([r.Attempt.from_job(j) for j in accounting(c, job_ids, since)])


def settled(c, job_id: int, states: list[str], timeout: float = 60) -> None:
    """Wait until accounting holds exactly these states for the job (its attempts, in order)."""
    def now() -> list[str]:
        out = c.sacct("-X", "-n", "-P", "--duplicates", "-j", str(job_id), "-o", "State")
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    wait_for(f"job {job_id} accounting {states}", lambda: now() == states, timeout=timeout, daemons=c.daemons, interval=0.5)


def test_requeued_job_is_two_attempts_and_a_node_failure_is_one(slurm_cluster, tmp_path):
    c = slurm_cluster
    since = utcnow()
    # requeue: the first attempt ends REQUEUED, the second runs to completion
    requeued = c.sbatch("sleep 4\n", extra_args=["--requeue", "--job-name=rq"])
    c.wait_running(requeued)
    c.run("scontrol", "requeue", str(requeued))
    c.run("scontrol", "release", str(requeued), check=False)  # some versions hold a requeued job
    # and make it eligible again only after a delay (BeginTime ~2 min on): start it sooner, but
    # not in the second of the requeue - slurmd refuses a credential made in the second its job's
    # was revoked ("Job credential revoked": the second attempt failed, stop 62's run 2)
    c.run("scontrol", "update", f"JobId={requeued}", "StartTime=now+3", check=False)
    settled(c, requeued, ["REQUEUED", "COMPLETED"], timeout=240)
    # node DOWN: the job (not requeueable) ends NODE_FAIL; the node is resumed for the other tests
    failed = c.sbatch("sleep 300\n", extra_args=["--no-requeue", "--job-name=nf"])
    c.wait_running(failed)
    try:
        c.run("scontrol", "update", f"NodeName={c.host}", "State=DOWN", "Reason=gpufleet reliability test")
        settled(c, failed, ["NODE_FAIL"])
    finally:
        c.run("scontrol", "update", f"NodeName={c.host}", "State=RESUME", check=False)
        wait_for(f"node {c.host} back", lambda: c.run("sinfo", "-h", "-N", "-n", c.host, "-o", "%T", check=False).strip()
                 in ("idle", "mixed", "allocated"), timeout=60, daemons=c.daemons, interval=0.5)
    got = r.classify_all(attempts_of(c, [requeued, failed], since))
    by_job = {}
    for x in got:
        by_job.setdefault(x.attempt.job_key, []).append((x.attempt.attempt, x.cause))
    assert by_job == {str(requeued): [(1, "requeued"), (2, "completed")], str(failed): [(1, "node_failure")]}
    # the collector's own read (sacct --duplicates) into a store: the requeued job's first attempt
    # in job_attempts, its latest in jobs, and the store's reliability classifies every attempt
    batch = SacctSource(cluster=CLUSTER, env=c.env).read_window(since - timedelta(minutes=1), utcnow() + timedelta(minutes=1))
    mine = {str(requeued), str(failed)}  # (the cluster's other tests' jobs may share the window)
    batch.jobs = [j for j in batch.jobs if j["job_key"] in mine]
    batch.attempts = [a for a in batch.attempts if a["job_key"] in mine]
    w = StoreWriter(tmp_path / "store")
    try:
        w.commit(batch)
        w.publish()
        assert w.db.sql("SELECT job_key, state FROM job_attempts").fetchall() == [(str(requeued), "REQUEUED")]
        assert dict(w.db.execute("SELECT job_key, state FROM jobs WHERE job_key IN (?, ?)", [str(requeued), str(failed)]).fetchall()) == {
            str(requeued): "COMPLETED", str(failed): "NODE_FAIL"}
    finally:
        w.close()
    window = Params(since - timedelta(minutes=5), utcnow() + timedelta(minutes=5))
    rel = reliability_store.report(open_reader(tmp_path / "store"), window, as_of=utcnow())
    assert {k: v for k, v in rel["figures"]["causes"].items() if v} == {"requeued": 1, "completed": 1, "node_failure": 1}
    assert sorted((a["job_id"], a["attempt"], a["cause"]) for a in rel["interrupted_attempts"]) == sorted([
        (str(failed), 1, "node_failure"), (str(requeued), 1, "requeued")])
    [chain] = [ch for ch in rel["chains"] if ch["job_ids"] == [str(requeued)]]
    assert chain["causes"] == ["requeued", "completed"] and 0 <= chain["ettr"] < 1


def test_policy_scancel_is_cancelled_by_policy(slurm_cluster, tmp_path, monkeypatch):
    c = slurm_cluster
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)  # the runner's scancel talks to this cluster
    since = utcnow()
    job = c.sbatch("sleep 300\n", extra_args=["--job-name=idle"])
    c.wait_running(job)
    facts = JobFacts(CLUSTER, "slurm", str(job), str(job), "idle", "root", "physics", "main", "RUNNING", 7200.0, 1, 1, 1, 18000.0, None)
    runner = Runner(Rules(enforce=True, options={"retries": 0}), Channels(smtp=None, from_address="gpufleet@example.org", cluster=CLUSTER),
                    params_for=lambda as_of: Params(as_of - timedelta(hours=1), as_of), sleep=lambda s: None)
    store = tmp_path / "store"
    w = StoreWriter(store)
    try:
        rows = runner.execute(Plan(utcnow(), True, [Action("cancel", "cancel_after", "all 1 GPU idle for 5h00m", facts)]),
                              lambda rows: (w.record_policy(rows), w.publish()))
        assert [(x["action"], x["result"]) for x in rows] == [("cancel", "ok")]
        settled(c, job, ["CANCELLED"])
        jobs = latest_per_key(accounting(c, [job], since))
        assert [j["state_raw"].split()[:2] for j in jobs] == [["CANCELLED", "by"]]
        w.commit(Batch(key=f"reliability-{job}", jobs=latest_per_key(jobs)))
        w.publish()
    finally:
        w.close()
    window = Params(since - timedelta(minutes=5), utcnow() + timedelta(minutes=5))
    rel = reliability_store.report(open_reader(store), window, as_of=utcnow())
    assert rel["figures"]["causes"]["cancelled_policy"] == 1 and rel["figures"]["attempts"] == 1
    # without the audit row the same accounting reads as an admin's cancel (root's uid 0)
    [alone] = r.classify_all([r.Attempt.from_job(jobs[0])])
    assert alone.cause == "cancelled_admin", alone.reason
