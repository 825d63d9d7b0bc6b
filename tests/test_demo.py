"""`gpufleet demo`: the simulated fleet, its backfilled week, the live exporters, the whole command.

The backfill writes a real store (module fixture, ~30 s); analytics run on it unchanged, and
what they find is checked against what the plan told each job to do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta

import httpx
import pytest

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.jobs import job_summaries
from gpufleet.analytics.params import Params
from gpufleet.collector.store import open_reader
from gpufleet.demo import fleet as fleet_mod
from gpufleet.demo import history
from gpufleet.demo.fleet import STEP_S
from tests.realstack.process import free_port, wait_for
from tests.support.dashboard import dashboard_healthy

NOW = datetime(2026, 11, 21, 9, 30, 7)  # a Saturday morning; rounds down to 09:30:00


@pytest.fixture(scope="module")
def fleet():
    return fleet_mod.build(NOW)


@pytest.fixture(scope="module")
def store(fleet, tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "store"
    steps = []
    counts = history.backfill(fleet, str(root), lambda done, total: steps.append((done, total)))
    return root, counts, steps


def test_fleet_is_the_promised_mix(fleet):
    assert fleet.now == datetime(2026, 11, 21, 9, 30, 0)
    hpc = [n for n in fleet.nodes if n.cluster == "hpc"]
    k8s = [n for n in fleet.nodes if n.cluster == "k8s"]
    assert (len(hpc), {n.gpus for n in hpc}, {n.model for n in hpc}) == (16, {8}, {"NVIDIA H100 80GB HBM3"})
    assert (len(k8s), {n.gpus for n in k8s}, {n.model for n in k8s}) == (8, {4}, {"NVIDIA A100-SXM4-80GB"})
    # MIG: node 07 = 4 GPUs x 2 x 3g.40gb, node 08 = 2 GPUs x 7 x 1g.10gb + 2 whole GPUs
    # -> devices: 128 + 6 x 4 + 8 + (14 + 2) = 176
    assert len(fleet.slots()) == 128 + 24 + 8 + 16 == 176
    profiles = Counter(j.profile for j in fleet.jobs)
    assert all(profiles[p] > 10 for p in ("train", "stalled", "held", "notebook", "inference", "dev")), profiles
    states = Counter(j.state_at(fleet.now) for j in fleet.jobs)
    assert states["PENDING"] >= 5 and states["RUNNING"] >= 50 and states["FAILED"] >= 50, states
    assert {j.account for j in fleet.jobs if j.scheduler == "slurm"} == set(fleet_mod.SLURM_ACCOUNTS)
    assert {j.partition for j in fleet.jobs if j.scheduler == "kubernetes"} == set(fleet_mod.K8S_TEAMS)
    assert fleet.shares["nlp"] == 30 and fleet.shares["platform"] == 20
    # the GPU that falls off the bus: XID 48 then XID 79, the job on it ends NODE_FAIL, nothing after
    host, gpu = fleet.lost_gpu
    on_it = [j for j in fleet.jobs if any((s.node.host, s.gpu) == (host, gpu) for s in j.slots)]
    assert [code for _, code in fleet.xids] == [48, 79]
    assert max(j.start for j in on_it) < fleet.lost_at
    assert [j.final_state for j in on_it if j.end == fleet.lost_at] == ["NODE_FAIL"]
    # same inputs, same plan; times in whole seconds, as schedulers record them
    assert fleet_mod.build(NOW).jobs == fleet.jobs
    assert all(t.microsecond == 0 for j in fleet.jobs for t in (j.submit, j.start, j.end))


def test_no_device_is_double_booked(fleet):
    by_slot: dict = {}
    for j in fleet.jobs:
        for s in j.slots:
            by_slot.setdefault(s.key, []).append((j.start, j.end))
    for spans in by_slot.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_backfill_stores_every_scrape_of_the_week(fleet, store):
    root, counts, steps = store
    scrapes = 7 * 86400 // STEP_S  # 40,320 per device
    outage = 4 * (2 * 3600 // STEP_S)  # k8s-a100-03's exporter down 2 h: 4 GPUs x 480 scrapes
    assert counts["samples"] == 176 * scrapes - outage == 7_094_400
    assert steps[-1] == (9, 9)  # 8 calendar days touched (09:30 to 09:30) + the scheduler batch
    con = open_reader(root)
    rows = con.execute("SELECT count(*), min(ts), max(ts) FROM gpu_samples").fetchone()
    assert rows == (7_094_400, fleet.start, fleet.now - timedelta(seconds=STEP_S))
    lost = con.execute("SELECT min(ts) FROM gpu_samples WHERE gpu_up = 0").fetchone()[0]
    assert lost == fleet.lost_at
    assert con.execute("SELECT count(*) FROM gpu_rollup_5m").fetchone()[0] > 0  # compaction ran


def test_backfill_twice_stores_nothing_new(fleet, store, tmp_path):
    root, _, _ = store
    before = open_reader(root).execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    again = history.backfill(fleet, str(root))
    assert again["samples"] == 0
    assert open_reader(root).execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == before


def _held_job(fleet, lo, hi):
    """A Slurm job of the `held` profile (allocated, no process, 0 %) wholly inside [lo, hi)."""
    for j in fleet.jobs:
        if j.profile == "held" and j.scheduler == "slurm" and lo <= j.start and j.end <= hi and j.end - j.start > timedelta(hours=1):
            return j
    raise AssertionError("the plan has no held job in the window")


def test_analytics_find_what_jobs_were_told_to_do(fleet, store):
    """Over one day: a held job's GPUs are idle and process-less for its whole run; a training
    job's utilization is what its profile gives (~90 % outside checkpoint dips)."""
    root, _, _ = store
    lo, hi = fleet.now - timedelta(days=2), fleet.now - timedelta(days=1)
    held = _held_job(fleet, lo, hi)
    a = Analysis(open_reader(root), Params(start=lo, end=hi))
    jobs = job_summaries(a)
    row = jobs.filter(jobs["job_key"] == held.job_key).to_dicts()[0]
    gpu_h = len(held.slots) * (held.end - held.start).total_seconds() / 3600
    # samples are on 15 s scrapes: each GPU's run is seen from the first scrape at/after start to
    # the last before end, so up to one scrape interval per GPU is not counted
    slack = len(held.slots) * STEP_S / 3600
    assert gpu_h - slack <= row["idle_gpu_h"] <= gpu_h + 1e-9
    assert gpu_h - slack <= row["no_process_gpu_h"] <= gpu_h + 1e-9
    assert row["mean_utilization_pct"] == 0 and row["verdict"] == "no_process"
    assert row["account"] == held.account and row["user_name"] == held.user
    train = next(j for j in fleet.jobs if j.profile == "train" and j.scheduler == "slurm" and lo <= j.start and j.end <= hi
                 and j.end - j.start > timedelta(hours=2))
    t = jobs.filter(jobs["job_key"] == train.job_key).to_dicts()[0]
    # busy scrapes draw 90 + 9 (u1 + u2 - 1), mean 90; checkpoint dips (a fraction b = 2-6 % of
    # each period) are 0 %: the mean lies between 90 x 0.94 = 84.6 and 90 x 0.98 = 88.2, +- noise
    assert 83.5 <= t["mean_utilization_pct"] <= 89.5, t
    assert t["verdict"] == "ok"


def test_mig_slices_count_as_their_share(fleet, store):
    root, _, _ = store
    con = open_reader(root)
    rows = dict(con.execute("""SELECT mig_profile, count(DISTINCT (host, gpu_uuid, gpu_instance)) FROM gpu_samples
                           WHERE cluster = 'k8s' AND gpu_instance IS NOT NULL GROUP BY 1""").fetchall())
    assert rows == {"3g.40gb": 8, "1g.10gb": 14}
    lo, hi = fleet.now - timedelta(hours=6), fleet.now
    per_gpu = Analysis(con, Params(start=lo, end=hi)).per_gpu()
    node8 = per_gpu.filter((per_gpu["host"] == "k8s-a100-08") & per_gpu["mig_profile"].is_not_null())
    # 14 slices of 1/7 GPU for 6 h = 2 GPUs x 6 h = 12 GPU-hours of capacity
    assert abs(node8["capacity_gpu_h"].sum() - 14 * (1 / 7) * 6) < 1e-6


def _scrape(url: str) -> str:
    return httpx.get(url, timeout=5).text


def test_live_exporters_continue_the_plan(fleet, tmp_path):
    """Started at the fleet's "now", every hpc exporter labels each GPU with the job the plan
    puts there and publishes that job's utilization; the lost GPU is down; k8s pods and MIG
    slices arrive through the kubelet pod-resources API."""
    from gpufleet.demo import load
    from gpufleet.demo.live import LiveFleet

    clock_at = (fleet.now - datetime(1970, 1, 1)).total_seconds()
    live = LiveFleet(fleet, tmp_path, clock=lambda: clock_at, tick_seconds=3600)
    live.start()
    try:
        holders = dict(zip([s.key for s in live._slots], live.holders(fleet.now)))
        node = next(n for n in fleet.nodes if n.cluster == "hpc" and any(holders[(n.host, g, 0)] for g in range(8)))
        gpu = next(g for g in range(8) if holders[(node.host, g, 0)])
        job = holders[(node.host, gpu, 0)]
        text = _scrape(live.nodes[node.host].url)
        info = [line for line in text.splitlines() if line.startswith("gpufleet_gpu_job_info") and f'gpu="{gpu}"' in line]
        assert len(info) == 1 and f'job_id="{job.job_id}"' in info[0]
        import polars as pl

        frame = pl.DataFrame({"t": [int(clock_at)], "slot": [live._slots.index(next(s for s in live._slots if s.key == (node.host, gpu, 0)))],
                              "prof": [fleet_mod.PROFILE_CODE[job.profile]], "s0": [history.epoch(job.start)],
                              "a": [job.params[0]], "b": [job.params[1]], "c": [job.params[2]], "off": [job.params[3]]},
                             schema_overrides={"prof": pl.Int8})
        expected = load.evaluate(frame)["util"][0]
        util = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'gpu="{gpu}"' in line]
        assert float(util[0].rsplit(" ", 1)[1]) == expected
        lost_host, lost_gpu = fleet.lost_gpu
        lost = [line for line in _scrape(live.nodes[lost_host].url).splitlines()
                if line.startswith("gpufleet_gpu_up{") and f'gpu="{lost_gpu}"' in line]
        assert lost and lost[0].endswith(" 0")
        wait_for("a MIG slice's pod label", lambda: 'GPU_I_PROFILE="1g.10gb"' in _scrape(live.nodes["k8s-a100-08"].url)
                 and 'namespace="notebooks"' in _scrape(live.nodes["k8s-a100-08"].url), timeout=20)
    finally:
        live.stop()


def test_demo_command_runs_the_pipeline_and_stops_on_ctrl_c(tmp_path):
    """The README's main command: backfill, live exporters, collector, dashboard, report; then
    SIGINT (what Ctrl-C sends) stops it with exit 0 and leaves no child process behind."""
    port = free_port()
    log = tmp_path / "demo.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "demo", "--no-browser", "--workdir", str(tmp_path / "w"),
         "--listen", f"127.0.0.1:{port}"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_for("the demo to print its URLs", lambda: "Ctrl-C stops the demo" in log.read_text(), timeout=240)
        out = log.read_text()
        assert f"dashboard          http://127.0.0.1:{port}/" in out and "backfilling a week of history" in out
        wait_for("the dashboard", lambda: dashboard_healthy(port, timeout=5), timeout=90)
        store = open_reader(tmp_path / "w" / "store")
        history_end = store.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0]

        def live_rows() -> bool:
            con = open_reader(tmp_path / "w" / "store")
            return con.execute("SELECT count(DISTINCT cluster) FROM gpu_samples WHERE ts > ?", [history_end]).fetchone()[0] == 2

        wait_for("the collector to store live scrapes of both clusters", live_rows, timeout=90)
        wait_for("the weekly report", lambda: "weekly report written" in log.read_text(), timeout=300)
        reports = sorted(p.suffix for p in (tmp_path / "w" / "reports").iterdir())
        assert ".html" in reports and ".txt" in reports
        text = next((tmp_path / "w" / "reports").glob("*.txt")).read_text()
        assert "THE 10 MOST WASTEFUL JOBS" in text and "nlp" in text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", str(tmp_path / "w")], capture_output=True, text=True).stdout.split()
        assert left == [], f"processes left behind: {left}"
    finally:
        if proc.poll() is None:  # a failed assertion: stop it the way Ctrl-C does, so its children go too
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
