"""Oracle: allocated GPU-hours per account from the analytics equal what Slurm itself records.

A real single-node Slurm 22.05 with accounting (tests/realstack/slurm.py, 8 fake GPUs) runs jobs
of two accounts with --gres=gpu:1/2/3 and different lengths, some at the same time, some queued
behind others for GPUs. The collector's SacctSource ingests them into a real store (StoreWriter +
Collector.run_once, as `gpufleet collect` does); Analysis(...).utilization("account") gives
allocated GPU-hours per account for a window that starts inside the first jobs and ends inside
the last one, so both edges clip. The reference is computed here without any of our parsing:
`sacct -X -P -o JobIDRaw,Account,AllocTRES,Start,End` (epoch times), gres/gpu=N x
(min(End, window end) - max(Start, window start)), summed per account. They must agree to the
second: Slurm records whole seconds, so any slip (time zone, inclusive/exclusive edge, a lost
or doubled job, a requested-vs-allocated mix-up) shows as an integer difference.

sreport: `sreport -T gres/gpu cluster AccountUtilizationByUser` reads slurmdbd's *rollup* tables,
not the job records. slurmdbd rolls usage up once per hour, for the hours that have ended (and
sreport rounds start/end to whole hours), so usage of jobs that ran minutes ago, inside the
current hour, is in no rollup yet: sreport reports nothing for them (seen on 22.05.8: header,
no rows). Making it cover our jobs would mean waiting up to an hour, or back-dating job records
and forcing a re-rollup through slurmdbd's database; neither is cheap. What is cheap is the last
*complete* hour: its rollup exists (unless the hour ended moments ago), and we compare it with
the analytics over the same hour. In a short session that hour holds no jobs, and both say zero;
in a session that has run across an hour boundary it holds other tests' jobs and the comparison
is a real one. (Checked by hand on this harness: jobs of 3 GPUs x 7 s and 2 x 5 s + 1 x 4 s in
the 12:00 hour; at 13:00:16 sreport said biology 21, physics 14 TRES-seconds, the same as
gres/gpu x elapsed, and this file's parsing of its -P output reads exactly those lines.) The
hour's rollup lags the boundary by some seconds, so a missing rollup is waited for up to a
minute; if the hour ended under 5 minutes ago that part (only) is skipped with the reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.slurm import SacctSource
from gpufleet.collector.store import StoreWriter, open_reader

pytestmark = pytest.mark.realstack

CLUSTER = "gpufleet"  # the harness's ClusterName; SacctSource's cluster label
GPU_RE = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")

# (account, GPUs, seconds): the first four fit the node's 8 GPUs at once (1+2+3+1 = 7); the
# 3-GPU biology job queues until the 3-GPU physics job ends, the last until another ends.
PLAN = [
    ("physics", 1, 7),
    ("biology", 2, 4),
    ("physics", 3, 3),
    ("biology", 1, 5),
    ("biology", 3, 3),
    ("physics", 2, 2),
]


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)


def epoch(t: datetime) -> int:
    return int(t.replace(tzinfo=timezone.utc).timestamp())


def sacct_jobs(cluster, start: datetime, end: datetime) -> dict[str, dict]:
    """Every job allocation sacct lists for [start, end]: {JobIDRaw: account, gpus, start, end}
    with epoch-second times (None for Unknown), read with a plain split and nothing of ours."""
    env = {**cluster.command_env(), "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
    out = subprocess.run(
        ["sacct", "-X", "-P", "--noheader", "--allusers", "-o", "JobIDRaw,Account,AllocTRES,Start,End",
         f"--starttime={start:%Y-%m-%dT%H:%M:%S}", f"--endtime={end:%Y-%m-%dT%H:%M:%S}"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    rows = {}
    for line in out.splitlines():
        raw, account, alloc, s, e = line.split("|")
        m = GPU_RE.search(alloc)
        rows[raw] = {"account": account, "gpus": int(m[1]) if m else 0,
                     "start": int(s) if s.isdigit() else None, "end": int(e) if e.isdigit() else None}
    return rows


def reference_gpu_seconds(jobs: dict[str, dict], ws: int, we: int, now: int) -> dict[str, int]:
    """Allocated GPU-seconds per account inside [ws, we): gres/gpu x the clipped run time.
    A job still running counts until `now` (as the analytics does); a pending one not at all."""
    out: dict[str, int] = defaultdict(int)
    for j in jobs.values():
        if j["start"] is None:
            continue
        end = j["end"] if j["end"] is not None else now
        seconds = max(0, min(end, we) - max(j["start"], ws))
        if j["gpus"] and seconds:
            out[j["account"]] += j["gpus"] * seconds
    return dict(out)


def analytics_gpu_seconds(con, ws: datetime, we: datetime, now: datetime) -> dict[str, int]:
    """utilization('account')['allocated_gpu_h'] x 3600 per account, which must be whole seconds."""
    df = Analysis(con, Params(ws, we), now=now).utilization("account")
    out = {}
    for row in df.iter_rows(named=True):
        assert row["cluster"] == CLUSTER
        seconds = row["allocated_gpu_h"] * 3600
        assert abs(seconds - round(seconds)) < 1e-6, (row, "not a whole number of GPU-seconds")
        if round(seconds):
            out[row["account"]] = round(seconds)
    return out


@pytest.fixture(scope="module")
def ingested(slurm_cluster, tmp_path_factory):
    """Run PLAN on the real cluster, ingest sacct into a store; the store and what sacct says."""
    c = slurm_cluster
    submitted = [c.sbatch(f"sleep {secs}\n", account=acct, gpus=gpus) for acct, gpus, secs in PLAN]
    states = [c.wait_job(j, timeout=90) for j in submitted]
    assert states == ["COMPLETED"] * len(PLAN), states

    store = tmp_path_factory.mktemp("oracle-slurm") / "store"
    writer = StoreWriter(store)
    src = SacctSource(cluster=CLUSTER, env=c.env, initial_lookback=timedelta(hours=2))
    collector = Collector(writer, [ScheduledSource(src, 60)])
    for _ in range(5):  # sacct read by the source and by us must see the same jobs (another test's may be changing)
        now = utcnow()
        before = sacct_jobs(c, now - timedelta(hours=2), now)
        assert collector.run_once(), "SacctSource failed (see the log)"
        after = sacct_jobs(c, now - timedelta(hours=2), now)
        if before == after:
            break
    else:
        pytest.fail("sacct kept changing while the collector read it")
    writer.close()
    mine = {str(j): after[str(j)] for j in submitted}
    return {"store": store, "sacct": after, "mine": mine, "ingested_at": now, "submitted": submitted}


def test_our_jobs_are_what_we_asked_for(ingested):
    """The scenario itself: accounts and GPU counts as submitted, some jobs overlapping, some queued."""
    mine = ingested["mine"]
    assert [(j["account"], j["gpus"]) for j in mine.values()] == [(a, g) for a, g, _ in PLAN]
    for j, (_, _, secs) in zip(mine.values(), PLAN):
        assert j["end"] - j["start"] >= secs
    first = list(mine.values())
    assert first[0]["start"] < first[1]["end"] and first[1]["start"] < first[0]["end"], "the first two jobs overlap"
    assert first[4]["start"] >= min(first[1]["end"], first[2]["end"]), "the second 3-GPU job waited for GPUs"


@pytest.mark.parametrize("edges", ["clipped", "whole"])
def test_allocated_gpu_seconds_per_account_equal_sacct(ingested, edges):
    mine = list(ingested["mine"].values())
    t_first = min(j["start"] for j in mine)
    t_last = max(j["end"] for j in mine)
    if edges == "clipped":
        # starts 2 s into the first jobs (the 7 s one surely still runs) and ends 1 s before the
        # last job ends: both edges cut through jobs
        ws, we = t_first + 2, t_last - 1
        assert any(j["start"] < ws < j["end"] for j in mine) and any(j["start"] < we < j["end"] for j in mine)
    else:
        ws, we = t_first - 60, epoch(ingested["ingested_at"])
    now = ingested["ingested_at"]
    ws_dt = datetime.fromtimestamp(ws, timezone.utc).replace(tzinfo=None)
    we_dt = datetime.fromtimestamp(we, timezone.utc).replace(tzinfo=None)
    assert we_dt <= now

    want = reference_gpu_seconds(ingested["sacct"], ws, we, epoch(now))
    con = open_reader(ingested["store"])
    got = analytics_gpu_seconds(con, ws_dt, we_dt, now)
    assert got == want
    assert set(want) >= {"physics", "biology"}

    # our own jobs alone, job by job (utilization by job): the same, to the second
    per_job = Analysis(con, Params(ws_dt, we_dt), now=now).utilization("job")
    got_jobs = {r["job_key"]: r["allocated_gpu_h"] * 3600 for r in per_job.iter_rows(named=True)}
    for key, j in ingested["mine"].items():
        want_s = j["gpus"] * max(0, min(j["end"], we) - max(j["start"], ws))
        assert got_jobs.get(key, 0.0) == pytest.approx(want_s, abs=1e-6), key
    if edges == "whole":
        # nothing clipped: gres/gpu x elapsed, and the fleet total equals the accounts' sum
        assert {k: round(v) for k, v in got_jobs.items() if k in ingested["mine"]} == {
            k: j["gpus"] * (j["end"] - j["start"]) for k, j in ingested["mine"].items()}
    totals = Analysis(con, Params(ws_dt, we_dt), now=now).totals()
    assert totals.allocated_gpu_h * 3600 == pytest.approx(sum(want.values()), abs=1e-6)


def test_gpufleet_analyze_json_agrees(ingested, tmp_path):
    """The same figures through the CLI: `gpufleet analyze --by account --format json`
    (schema gpufleet.analyze/v1: utilization.rows per account, totals)."""
    mine = list(ingested["mine"].values())
    ws = datetime.fromtimestamp(min(j["start"] for j in mine) + 2, timezone.utc).replace(tzinfo=None)
    we = datetime.fromtimestamp(max(j["end"] for j in mine) - 1, timezone.utc).replace(tzinfo=None)
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(f'[collector]\nstore = "{ingested["store"]}"\ncluster = "{CLUSTER}"\nlisten = ""\n')
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "analyze", "--config", str(cfg), "--from", ws.isoformat() + "Z",
                        "--to", we.isoformat() + "Z", "--by", "account", "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpufleet.analyze/v1" and doc["utilization"]["by"] == "account"
    got = {}
    for row in doc["utilization"]["rows"]:
        seconds = row["allocated_gpu_h"] * 3600
        assert abs(seconds - round(seconds)) < 1e-6, row
        if round(seconds):
            got[row["account"]] = round(seconds)
    want = reference_gpu_seconds(ingested["sacct"], epoch(ws), epoch(we), epoch(ingested["ingested_at"]))
    assert got == want
    assert doc["totals"]["allocated_gpu_h"] * 3600 == pytest.approx(sum(want.values()), abs=1e-6)


def test_reingesting_changes_nothing(ingested, slurm_cluster):
    """A second collector run over the same window (sacct read again) leaves the figures as they were."""
    mine = list(ingested["mine"].values())
    ws = datetime.fromtimestamp(min(j["start"] for j in mine) + 2, timezone.utc).replace(tzinfo=None)
    we = datetime.fromtimestamp(max(j["end"] for j in mine) - 1, timezone.utc).replace(tzinfo=None)
    now = ingested["ingested_at"]
    before = analytics_gpu_seconds(open_reader(ingested["store"]), ws, we, now)
    writer = StoreWriter(ingested["store"])
    try:
        # the persisted watermark makes it read [watermark - overlap, now]: our jobs again
        src = SacctSource(cluster=CLUSTER, env=slurm_cluster.env, initial_lookback=timedelta(hours=2))
        assert Collector(writer, [ScheduledSource(src, 60)]).run_once()
    finally:
        writer.close()
    assert analytics_gpu_seconds(open_reader(ingested["store"]), ws, we, now) == before


def sreport_gpu_seconds(cluster, h0: datetime, h1: datetime) -> dict[str, int]:
    """Per-account gres/gpu TRES-seconds from sreport's hourly rollups for [h0, h1) (sreport
    prints it as h0 .. h1 - 1 s); accounts without usage have no line."""
    out = cluster.run("sreport", "-T", "gres/gpu", "-P", "-n", "-t", "Seconds", "cluster", "AccountUtilizationByUser",
                      f"start={h0:%Y-%m-%dT%H:%M:%S}", f"end={h1:%Y-%m-%dT%H:%M:%S}", timeout=120)
    got = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 6:
            continue
        _cluster, account, login, _name, tres, used = fields
        if login == "" and account != "root" and tres == "gres/gpu" and int(used):
            got[account] = int(used)  # the account's own line (users have a Login)
    return got


def test_sreport_last_complete_hour_agrees(slurm_cluster, tmp_path):
    """sreport's rollup of the last complete hour vs the analytics over that hour (see module doc)."""
    c = slurm_cluster
    now = utcnow()
    h1 = now.replace(minute=0, second=0)
    h0 = h1 - timedelta(hours=1)
    jobs = sacct_jobs(c, h0 - timedelta(hours=1), now)
    want = reference_gpu_seconds(jobs, epoch(h0), epoch(h1), epoch(now))
    # a store holding every job of that hour: ingest with a lookback reaching back before it
    writer = StoreWriter(tmp_path / "store")
    try:
        src = SacctSource(cluster=CLUSTER, env=c.env, initial_lookback=timedelta(hours=3))
        assert Collector(writer, [ScheduledSource(src, 60)]).run_once()
    finally:
        writer.close()
    got = analytics_gpu_seconds(open_reader(tmp_path / "store"), h0, h1, now)
    assert got == want  # analytics vs sacct records, over a whole past hour

    deadline = time.monotonic() + (60 if want else 0)
    while True:
        rolled = sreport_gpu_seconds(c, h0, h1)
        if rolled == want or time.monotonic() >= deadline:
            break
        time.sleep(2)
    if want and not rolled and now - h1 < timedelta(minutes=5):
        pytest.skip(f"slurmdbd has not rolled up {h0:%H:%M}-{h1:%H:%M} yet (the hour ended {now - h1} ago)")
    assert rolled == want == got
