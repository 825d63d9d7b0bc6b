"""SlurmrestdSource against the real slurmrestd of Debian's Slurm 22.05 (tests/realstack/slurm.py's
single-node cluster): its jobs must say what `sacct -X -P` says, job for job.

Debian's 22.05 packages carry no auth_jwt.so (AuthAltTypes=auth/jwt cannot be configured) and only
the openapi v0.0.36-v0.0.38 plugins, so the JWT path cannot run here: slurmrestd is started with
rest_auth/local on a unix socket (the caller's uid, munge to Slurm), the way a site runs it on the
controller. The JWT header itself is tested against the loopback server (test_slurmrestd_source.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from gpufleet.collector.sources.slurmrestd import SlurmrestdSource
from tests.realstack.debian import ensure_packages
from tests.realstack.process import wait_for
from tests.test_sacct_real import TZ, reference, utcnow

pytestmark = pytest.mark.realstack


@contextmanager
def serving_slurmrestd(c, tmp_path: Path):
    """slurmrestd of cluster `c` on a unix socket under `tmp_path` (rest_auth/local): its path."""
    ensure_packages("slurmrestd")
    sock = tmp_path / "restd.sock"
    # in New York: v0.0.38 reads the window's edges in slurmrestd's zone, a slip shows as 4-5 h
    env = {**c.command_env(), "TZ": TZ, "SLURMRESTD_SECURITY": "disable_unshare_files,disable_unshare_sysv,disable_user_check"}
    log = open(tmp_path / "slurmrestd.log", "wb")
    proc = subprocess.Popen(["slurmrestd", "-a", "rest_auth/local", "-s", "openapi/v0.0.38,openapi/dbv0.0.38", f"unix:{sock}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log.close()
            pytest.fail(f"slurmrestd did not start: {(tmp_path / 'slurmrestd.log').read_text()[-2000:]}")
        time.sleep(0.2)
    try:
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


@pytest.fixture
def restd(slurm_cluster, tmp_path):
    with serving_slurmrestd(slurm_cluster, tmp_path) as sock:
        yield sock


def test_real_slurmrestd_says_what_sacct_says(slurm_cluster, restd):
    c = slurm_cluster
    arr = c.sbatch("sleep 1\n", account="physics", gpus=1, extra_args=["--array=0-1"])
    fail = c.sbatch("exit 1\n", account="biology", gpus=2)
    assert c.wait_job(arr, array_tasks=2) == "COMPLETED"
    assert c.wait_job(fail) == "FAILED"
    src = SlurmrestdSource(url="http://slurmrestd", transport=httpx.HTTPTransport(uds=str(restd)), cluster="gpufleet",
                           tz=TZ, initial_lookback=timedelta(hours=2), current_jobs=False)
    now = utcnow()
    start, end, _ = src.window(now)
    [batch] = list(src.run(now))
    assert src.version() == "v0.0.38"
    ref = reference(c, start, end)
    rows = {j["job_key"]: j for j in batch.jobs}
    assert (batch.rejected, batch.problems) == (0, [])
    assert sorted(rows) == sorted(ref)
    for key, want in ref.items():
        # slurmrestd 22.05's dbv0.0.38 writes exit_code {status: SUCCESS, return_code: 0} for every
        # job, one sacct shows as FAILED 1:0 included (the same slurmdbd record, its batch step too):
        # a FAILED job with a success code is stored as unknown, never as 0:0; other jobs' codes
        # are read as given. Every other field must agree (the window also holds other tests' jobs).
        if want["exit_code"] != "0:0":
            assert rows[key]["exit_code"] == (None if want["state"] == "FAILED" else "0:0"), key
            want = {k: v for k, v in want.items() if k != "exit_code"}
        if want["state_raw"].startswith("CANCELLED by "):  # sacct adds who; dbv0.0.38's state.current has no uid
            assert rows[key]["state_raw"] == "CANCELLED", key
            want = {k: v for k, v in want.items() if k != "state_raw"}
        assert {k: rows[key][k] for k in want} == want, key
    assert (ref[str(fail)]["exit_code"], rows[str(fail)]["exit_code"]) == ("1:0", None)
    mine = {r["job_id"]: (r["account"], r["state"], r["gpus"]) for r in rows.values()
            if r["job_id"].split("_")[0] in (str(arr), str(fail))}
    assert mine == {f"{arr}_0": ("physics", "COMPLETED", 1), f"{arr}_1": ("physics", "COMPLETED", 1), str(fail): ("biology", "FAILED", 2)}


def test_real_slurmctld_jobs_running_and_pending(slurm_cluster, restd):
    c = slurm_cluster
    run = c.sbatch("sleep 120\n", account="physics", gpus=2)
    held = c.sbatch("sleep 1\n", account="biology", gpus=1, extra_args=["--hold"])
    try:
        c.wait_running(run)
        src = SlurmrestdSource(url="http://slurmrestd", transport=httpx.HTTPTransport(uds=str(restd)), cluster="gpufleet", tz=TZ)
        batch = src.read_current(utcnow())
        rows = {j["job_key"]: j for j in batch.jobs}
        assert (rows[str(run)]["state"], rows[str(run)]["gpus"], rows[str(run)]["account"]) == ("RUNNING", 2, "physics")
        assert (rows[str(held)]["state"], rows[str(held)]["gpus"], rows[str(held)]["start"]) == ("PENDING", 1, None)
        # ended jobs slurmctld still keeps are read too (their GPUs are what accounting may lack,
        # issue #51); every job's GPU count is slurmctld's, known
        assert {(j["gpus"] is not None, j["gpus_source"]) for j in batch.jobs} == {(True, "slurmctld")}
    finally:
        c.run("scancel", str(run), str(held), check=False)


def _output(c, job: int) -> str:
    """The job's output so far ('' before its script has written any)."""
    try:
        return c.job_output(job)
    except FileNotFoundError:
        return ""


def test_real_slurmrestd_reads_every_attempt_and_every_instant_job(slurm_cluster, restd):
    """A job requeued with `scontrol requeue` is two slurmdbd records under one job id: the window
    read lists both, the earlier an attempt of the job (job_attempts), the later the job. And short
    jobs submitted one after another on the idle node - some start the instant they are submitted,
    and sacct shows their Eligible as Unknown - are all in the window: the read names every state
    (slurmrestd.WINDOW_STATES), so slurmdbd selects them by start and end, not eligible time."""
    c = slurm_cluster
    # the first run sleeps until it is requeued, the second ends at once (SLURM_RESTART_COUNT: its runs before)
    requeued = c.sbatch('echo "run ${SLURM_RESTART_COUNT:-0}"\n[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 60\n',
                        extra_args=["--requeue", "--job-name=rq"])
    try:
        c.wait_running(requeued)
        wait_for(f"job {requeued}'s script running", lambda: "run 0" in _output(c, requeued), timeout=60, daemons=c.daemons, interval=0.2)
        c.run("scontrol", "requeue", str(requeued))

        def first_run_gone() -> bool:  # slurmd has killed the first run: the node is no longer completing it
            first = c.sacct("-X", "-n", "-P", "--duplicates", "-j", str(requeued), "-o", "State").split()[:1] == ["REQUEUED"]
            completing = any(state.startswith("comp") for state in c.run("sinfo", "-h", "-o", "%t").split())
            return first and c.job_state(requeued) == "PENDING" and not completing

        wait_for(f"job {requeued}'s first run requeued and killed", first_run_gone, timeout=120, daemons=c.daemons, interval=0.5)
        # slurmd refuses a launch whose credential is not newer than the second it killed the job's first run in
        # ("already killed, do not launch batch job"): under load that second can come after the requeue's
        time.sleep(2)

        def rerun() -> bool:  # the first attempt REQUEUED, the second ran to the end
            # a requeued job is eligible again ~2 min on (BeginTime), maybe held: start it now
            c.run("scontrol", "release", str(requeued), check=False)
            c.run("scontrol", "update", f"JobId={requeued}", "StartTime=now", check=False)
            return c.sacct("-X", "-n", "-P", "--duplicates", "-j", str(requeued), "-o", "State").split() == ["REQUEUED", "COMPLETED"]

        wait_for(f"job {requeued} requeued, then completed", rerun, timeout=180, daemons=c.daemons, interval=1.0)
        short = [c.sbatch("true\n", gpus=None) for _ in range(8)]
        for j in short:
            c.wait_job(j)
        eligible = {j: c.sacct("-X", "-n", "-P", "-j", str(j), "-o", "Eligible").strip() for j in short}
        src = SlurmrestdSource(url="http://slurmrestd", transport=httpx.HTTPTransport(uds=str(restd)), cluster="gpufleet",
                               tz=TZ, initial_lookback=timedelta(hours=2), current_jobs=False)
        [batch] = list(src.run(utcnow()))
        assert (batch.rejected, batch.problems) == (0, [])
        jobs = {j["job_key"]: j for j in batch.jobs}
        [first] = [a for a in batch.attempts if a["job_key"] == str(requeued)]
        assert (first["state"], first["source"]) == ("REQUEUED", "slurmrestd")
        latest = jobs[str(requeued)]
        assert latest["state"] == "COMPLETED" and latest["start"] >= first["end"] >= first["start"], (latest, first)
        # every short job, whatever sacct says of its eligible time (`eligible` names it on failure)
        assert {str(j) for j in short} <= set(jobs), eligible
    finally:
        c.run("scancel", str(requeued), check=False)
