"""SacctSource against a real Slurm 22.05 with accounting (tests/realstack/slurm.py): the rows it
parses must say what `sacct -X -P` says, job for job, read back independently (epoch times, a
plain split), and reading the same window twice must give the same rows.

SacctSource runs sacct in America/New_York here while the reference runs in UTC with epoch
output, so a time-zone slip in either direction shows as a 4-5 h difference.
"""

from __future__ import annotations

import re
import subprocess
import time
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.collector.sources.slurm import WINDOW_STATES, SacctSource

pytestmark = pytest.mark.realstack

TZ = "America/New_York"
REF_FIELDS = "JobIDRaw,JobID,Account,State,ExitCode,AllocTRES,ReqTRES,Start,End,JobName"


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)


def from_epoch(text: str) -> datetime | None:
    return datetime.fromtimestamp(int(text), timezone.utc).replace(tzinfo=None) if text.isdigit() else None


def reference(cluster, start: datetime, end: datetime) -> dict[str, dict]:
    """What `sacct -X -P` says about [start, end] (every state: by each state's own times), read without our parser."""
    env = {**cluster.command_env(), "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "--allusers", f"--format={REF_FIELDS}",
         f"--starttime={start:%Y-%m-%dT%H:%M:%S}", f"--endtime={end:%Y-%m-%dT%H:%M:%S}", f"--state={','.join(WINDOW_STATES)}"],
        env=env, capture_output=True, timeout=60, check=True,
    ).stdout.decode()  # bytes: a name's \r\n stays as sacct printed it
    rows, lines = {}, []
    for line in out.split("\n"):  # a job name may hold a line break (and | ): the name is last
        if line and line.count("|") < 9 and lines:
            lines[-1] += "\n" + line
        elif line:
            lines.append(line)
    for line in lines:
        raw, jid, account, state, exit_code, alloc, req, start_s, end_s, name = line.split("|", 9)
        gpus = re.search(r"(?:^|,)gres/gpu=(\d+)", alloc) or re.search(r"(?:^|,)gres/gpu=(\d+)", req)
        rows[raw] = {
            "job_id": jid, "account": account, "state": state.split(" ")[0], "state_raw": state,
            "exit_code": exit_code, "gpus": int(gpus[1]) if gpus else 0, "name": name,
            "start": from_epoch(start_s), "end": from_epoch(end_s),
        }
    return rows


def run_stable(cluster, src: SacctSource, now: datetime):
    """Run the source between two identical reference reads (no job changed state meanwhile)."""
    for _ in range(5):
        start, end, _ = src.window(now)
        before = reference(cluster, start, end)
        batches = list(src.run(now))
        if reference(cluster, start, end) == before:
            return batches, before
    pytest.fail("sacct kept changing while we read it")


def assert_same(batches, ref: dict[str, dict]) -> dict[str, dict]:
    (batch,) = batches
    assert (batch.rejected, batch.problems) == (0, [])
    rows = {j["job_key"]: j for j in batch.jobs}
    assert sorted(rows) == sorted(ref)
    for key, want in ref.items():
        got = {k: rows[key][k] for k in want}
        assert got == want, key
    return rows


def submit_het(cluster, seconds: int) -> int:
    script = cluster.jobs_dir / "het.sh"
    script.write_text(f"#!/bin/sh\nsleep {seconds}\n")
    out = cluster.run(
        "sbatch", "--parsable", f"--chdir={cluster.jobs_dir}", f"--output={cluster.jobs_dir}/slurm-%j.out",
        "--account=physics", "--gres=gpu:1", ":", "--account=biology", "--gres=gpu:2", str(script),
    )
    return int(out.strip().split(";")[0])


def test_sacct_source_says_what_sacct_says(slurm_cluster):
    c = slurm_cluster
    arr = c.sbatch("sleep 1\n", account="physics", gpus=1, extra_args=["--array=0-2"])
    fail = c.sbatch("exit 1\n", account="biology", gpus=2, extra_args=["--job-name=fail|pipe <b>\"q'"])
    cancel = c.sbatch("sleep 120\n", account="physics", gpus=3, extra_args=["--job-name=two\r\nlines|x"])
    het = submit_het(c, 120)
    try:
        c.wait_running(cancel)
        c.run("scancel", str(cancel))
        assert c.wait_job(arr, array_tasks=3) == "COMPLETED"
        assert c.wait_job(fail) == "FAILED"
        assert c.wait_job(cancel).startswith("CANCELLED")

        # while the het job is pending or running: its two components, GPUs requested or allocated.
        # slurmdbd records a pending job a moment after sbatch (later still on a loaded machine):
        # wait until sacct itself lists both components before comparing with it
        deadline = time.monotonic() + 60
        while c.sacct("-X", "-n", "-P", "-o", "JobID", "-j", str(het)).split().count(f"{het}+1") == 0:
            assert time.monotonic() < deadline, "sacct never listed the het job"
            time.sleep(0.5)
        src = SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(hours=2))
        rows = assert_same(*run_stable(c, src, utcnow()))
        het_rows = sorted((r["job_id"], r["het_job_id"], r["het_job_offset"], r["account"], r["gpus"])
                          for r in rows.values() if r["het_job_id"] == str(het))
        assert het_rows == [(f"{het}+0", str(het), 0, "physics", 1), (f"{het}+1", str(het), 1, "biology", 2)]
    finally:
        c.run("scancel", str(het), check=False)
    c.wait_job(het)

    now = utcnow()
    src = SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(hours=2))
    batches, ref = run_stable(c, src, now)
    rows = assert_same(batches, ref)
    mine = {r["job_id"]: r for r in rows.values() if r["job_id"].split("_")[0].split("+")[0] in map(str, (arr, fail, cancel, het))}
    summary = {jid: (r["account"], r["state"], r["gpus"], r["array_job_id"], r["array_task_id"]) for jid, r in mine.items()}
    assert summary == {
        f"{arr}_0": ("physics", "COMPLETED", 1, str(arr), "0"),
        f"{arr}_1": ("physics", "COMPLETED", 1, str(arr), "1"),
        f"{arr}_2": ("physics", "COMPLETED", 1, str(arr), "2"),
        str(fail): ("biology", "FAILED", 2, None, None),
        str(cancel): ("physics", "CANCELLED", 3, None, None),
        f"{het}+0": ("physics", "CANCELLED", 1, None, None),
        f"{het}+1": ("biology", "CANCELLED", 2, None, None),
    }
    # the | survived; slurmdbd itself stores a job name's " as ` (sacct -P shows the same)
    assert (mine[str(fail)]["exit_code"], mine[str(fail)]["name"]) == ("1:0", "fail|pipe <b>`q'")
    assert mine[str(cancel)]["state_raw"] == "CANCELLED by 0"
    # a name with a line break: sacct prints it as is, the next line continues it
    assert mine[str(cancel)]["name"] == "two\r\nlines|x"
    for r in mine.values():
        if r["het_job_id"] is None:
            assert r["start"] <= r["end"] <= now and now - r["start"] < timedelta(minutes=10)
            assert (r["cluster"], r["source"], r["user_name"], r["partition"]) == ("gpufleet", "sacct", "root", "main")

    # the same window again (a fresh source, as after a restart): the same rows and key
    again = list(SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(hours=2)).run(now))
    assert [b.key for b in again] == [b.key for b in batches]
    assert again[0].jobs == batches[0].jobs


def test_running_job_is_read_again_until_it_ends(slurm_cluster):
    c = slurm_cluster
    job = c.sbatch("sleep 4\n", account="biology", gpus=2)
    c.wait_running(job)
    src = SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(minutes=30))
    deadline = time.monotonic() + 15
    while True:  # slurmdbd learns of the start a moment after squeue shows RUNNING
        first = {j["job_key"]: j for b in src.run(utcnow()) for j in b.jobs}.get(str(job))
        if first or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert first, f"job {job} never appeared in sacct while running"
    assert (first["state"], first["end"], first["gpus"]) == ("RUNNING", None, 2)
    assert first["start"] is not None

    assert c.wait_job(job) == "COMPLETED"
    now = utcnow()
    (batch,) = list(src.run(now))  # from the remembered watermark minus the overlap
    assert batch.key.startswith("sacct:gpufleet:") and batch.watermark == ("sacct:gpufleet", now.isoformat())
    second = {j["job_key"]: j for j in batch.jobs}[str(job)]
    assert (second["state"], second["start"], second["gpus"]) == ("COMPLETED", first["start"], 2)
    assert first["start"] < second["end"] <= now
    ref = reference(c, now - timedelta(minutes=30), now)[str(job)]
    assert (second["start"], second["end"]) == (ref["start"], ref["end"])


def test_every_job_accounting_knows_is_in_a_window_whatever_its_eligible_time(slurm_cluster):
    """Slurm 22.05 records no eligible time for some jobs that start the instant they are
    submitted (Eligible=Unknown), and sacct -S/-E without a state selects by eligible time: such
    a job was in no window, its GPU-hours lost without a word (seen in CI: test_job_gpus_real's
    sacct-only job, in 6 of 11-20 runs here). The window read names every state, so slurmdbd selects by
    each state's own times: short jobs submitted back to back and after an idle pause, and a long
    one started before the window, are all read by a window that starts after the long one did.
    (Whether a job here gets Eligible=Unknown is up to slurmctld's timing; the assertion holds
    either way.)"""
    c = slurm_cluster
    long_job = c.sbatch("sleep 30\n", account="physics", gpus=1)
    c.wait_running(long_job)
    time.sleep(1.5)
    window_start = utcnow()
    short = []
    for pause in (0, 0, 3, 3):
        time.sleep(pause)
        short.append(c.sbatch("sleep 1\n", account="biology", gpus=1))
        c.wait_job(short[-1])
    try:
        keys = [str(j) for j in (long_job, *short)]
        eligible = dict(line.split("|") for line in c.sacct("-X", "-n", "-P", "-o", "JobIDRaw,Eligible", "-j", ",".join(keys)).split())
        assert sorted(eligible) == sorted(keys)  # accounting knows every job (some may say Eligible=Unknown)
        src = SacctSource(cluster="gpufleet", env=c.env, tz=TZ, initial_lookback=timedelta(hours=2))
        start, end, _ = src.window(utcnow())
        read = {j["job_key"]: j for j in src.read_window(window_start, end).jobs}
        assert {k: read[k]["state"] if k in read else None for k in keys} == {
            str(long_job): "RUNNING", **{str(j): "COMPLETED" for j in short}}, eligible
    finally:
        c.run("scancel", str(long_job), check=False)
    c.wait_job(long_job)
