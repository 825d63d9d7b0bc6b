"""`gpufleet demo`: the simulated fleet, its backfilled week and the live exporters (the whole
command: test_demo_command.py).

The backfill writes a real store (module fixture, ~30 s); analytics run on it unchanged, and
what they find is checked against what the plan told each job to do.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta

import httpx
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.jobs import job_summaries
from gpufleet.analytics.params import Params
from gpufleet.collector.store import open_reader
from gpufleet.demo import fleet as fleet_mod
from gpufleet.demo import history
from gpufleet.demo.fleet import STEP_S
from tests.realstack.process import wait_for

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
    # upkeep ran: the facts of every settled hour (and of each closed day) are there, none left to build
    settled = (fleet.now - timedelta(minutes=5, seconds=30)).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    hours = con.execute("SELECT count(*) FROM fact_files WHERE grain_s = 300 AND open_upto IS NULL").fetchone()[0]
    assert hours == (settled - fleet.start.replace(minute=0, second=0, microsecond=0)) // timedelta(hours=1) + 1


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


def test_each_pattern_job_shows_where_its_time_went(fleet, store):
    """The demo's training jobs that lose time one way each (fleet.PATTERNS) are found so by the
    breakdown (gpufleet.analytics.states) over what the exporters would have published: a
    20-minute model load, a starved data loader, all-reduce-heavy, one straggler GPU named,
    checkpoints every 30 minutes costing 90 s."""
    from gpufleet.analytics.states import STATE_OPTIONS, Thresholds, job_breakdown

    root, _, _ = store
    con = open_reader(root)
    seen = set()
    for profile in fleet_mod.PATTERNS:
        job = next(j for j in fleet.jobs if j.profile == profile and fleet.start + timedelta(hours=1) <= j.start
                   and j.end <= fleet.now and j.end - j.start >= timedelta(hours=2) and not any(
                       (s.node.host, s.gpu) == fleet.lost_gpu for s in j.slots) and fleet.outage[0] not in {s.node.host for s in j.slots})
        p = Params(start=job.start, end=job.end)
        js = job_breakdown(con, p, job.job_key, Thresholds.of(p, {o.key: o.default for o in STATE_OPTIONS}))
        assert js is not None and sum(js.seconds.values()) == pytest.approx(js.data_s), profile
        share = {k: v / js.data_s for k, v in js.seconds.items()}
        if profile == "loading":
            assert js.seconds["startup"] / len(job.slots) == pytest.approx(20 * 60, abs=2 * STEP_S), js.seconds
        elif profile == "starved":
            assert js.largest_loss == "input_bound" and share["input_bound"] > 0.5, share
            assert "PCIe RX 11." in js.evidence["input_bound"]
        elif profile == "allreduce":
            assert js.largest_loss == "communication_bound" and share["communication_bound"] > 0.5, share
        elif profile == "straggler":
            assert js.straggler is not None and js.straggler["gpu"].endswith(":3") and share["straggler"] > 0.03, (js.straggler, share)
        elif profile == "checkpoint":
            assert js.checkpoints is not None and js.checkpoints.period_s == pytest.approx(1800, rel=0.05), js.checkpoints
            assert js.checkpoints.cost_s == pytest.approx(90, abs=STEP_S)
        seen.add(profile)
    assert seen == set(fleet_mod.PATTERNS)


def test_the_week_has_a_shared_gpu_the_job_and_teams_figures_show(fleet, store):
    """Another team's job attached to a running dev job's GPU for two hours (gpufleet.demo.shared):
    both jobs held the GPU, and each one's split of it reads back per job and per team."""
    from gpufleet.analytics.jobs import gpu_shares
    from gpufleet.analytics.shares import team_shares
    from gpufleet.demo import shared

    root, _, _ = store
    con = open_reader(root)
    host, guest = shared.guest_job(fleet)
    p = Params(start=fleet.start, end=fleet.now)
    [g] = gpu_shares(con, p, "hpc", "slurm", guest.job_key)
    assert (g["host"], g["gpu_uuid"], g["shared_scrapes"]) == (host.slots[0].node.host, host.slots[0].gpu_uuid, 2 * 3600 // STEP_S)
    assert g["sm_share"] == pytest.approx(shared.SM_RATIO["guest"]) and g["memory_max_bytes"] == shared.MEMORY_BYTES["guest"]
    assert [(o["job_key"], o["sm_share"]) for o in g["others"]] == [(host.job_key, pytest.approx(shared.SM_RATIO["host"]))]
    teams = {r["account"]: r for r in team_shares(con, p).to_dicts()}
    assert set(teams) == {host.account, guest.account}
    assert teams[guest.account]["shared_with"] == host.account and teams[guest.account]["jobs"] == 1
    assert con.execute("SELECT state, account FROM jobs WHERE job_key = ?", [guest.job_key]).fetchone() == ("COMPLETED", guest.account)


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


# --- issue #13.6: Fleet now on the demo fleet ---


def test_fleet_now_counts_the_demos_physical_gpus(fleet, store):
    """160 GPUs (128 H100 + 32 A100), not the 176 devices with MIG instances; the GPU that fell
    off the bus is not reporting; its XID 79 is shown although its latest samples carry none."""
    from gpufleet.analytics import fleet_now as fn

    root, _, _ = store
    con = open_reader(root)
    p = Params(start=fleet.now - timedelta(days=1), end=fleet.now)
    states = fn.gpu_states(con, p, fleet.now)
    assert states.height == 176  # devices: MIG instances are rows of their own
    s = fn.summarize(states, p, fleet.now)
    assert (s.gpus, s.reporting, s.lost, s.no_data) == (160, 159, 1, 0)
    # held/free/no-process in GPU equivalents: every device reports except the lost GPU, so held +
    # free = the 159 reporting GPUs, less node 07's unsliced sevenths (4 GPUs x 2 x 3g.40gb = 6/7 each)
    assert abs(s.held + s.free - (159 - 4 / 7)) < 1e-9 and s.held != int(s.held)  # MIG slices held: sevenths
    assert abs(s.unsliced - 4 / 7) < 1e-9 and abs(s.held + s.free + s.unsliced - s.reporting) < 1e-9  # shown as its own figure
    held_mig = states.filter(pl.col("held") & pl.col("mig_profile").is_not_null())
    assert held_mig.height and abs(s.held - float(states.filter(pl.col("held"))["equiv"].sum())) < 1e-9
    host, gpu = fleet.lost_gpu
    lost = states.filter((pl.col("host") == host) & (pl.col("gpu") == gpu)).row(0, named=True)
    assert lost["status"] == "lost" and lost["xid_last"] is None  # nothing after it fell off the bus ...
    assert lost["last_xid"] == 79 and lost["last_xid_at"] == fleet.lost_at - timedelta(seconds=STEP_S)  # ... but XID 79 before
    assert states["compute_processes"].dtype == pl.Int64


def test_fleet_now_idle_since_survives_the_switch_to_live_scrapes(fleet, store, tmp_path):
    """The demo's live collector starts scraping a while after the history ends (the backfill and
    the exporters' start take longer than max_gap). A GPU idle for hours is idle since its last
    busy sample in the history, not since the first live scrape; with none in the look-back it is
    idle "since before" the look-back's first sample."""
    import shutil

    import pyarrow as pa

    from gpufleet.analytics import fleet_now as fn
    from gpufleet.collector import schema
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter

    root, _, _ = store
    copy = tmp_path / "store"
    shutil.copytree(root, copy)
    last = fleet.now - timedelta(seconds=STEP_S)
    latest = open_reader(copy).sql(f"SELECT {', '.join(schema.SAMPLE_SCHEMA.names)} FROM gpu_samples WHERE ts = $t",
                                  params={"t": last}).to_arrow_table()
    live_start = fleet.now + timedelta(seconds=60)  # 75 s after the last history sample: more than max_gap
    scrapes = []
    for k in range(3):  # the live scrapes repeat each device's last state
        t = latest.to_pylist()
        for r in t:
            r["ts"] = live_start + timedelta(seconds=STEP_S * k)
        scrapes += t
    w = StoreWriter(copy)
    w.commit(Batch(key="test-live", samples=schema.conform_samples(pa.Table.from_pylist(scrapes, schema=latest.schema))))
    w.publish()
    w.close()
    as_of = live_start + timedelta(seconds=2 * STEP_S)
    p = Params(start=as_of - timedelta(days=1), end=as_of)
    idle = fn.gpu_states(open_reader(copy), p, as_of).filter(pl.col("idle_allocated"))
    assert idle.height >= 10
    assert idle["idle_since"].max() < fleet.now  # all idle before the history ended: none "since the live start"
    hours = idle.filter(pl.col("idle_since") <= fleet.now - timedelta(hours=1))
    assert hours.height >= 5  # notebooks and held jobs idle for hours
    before = idle.filter(pl.col("idle_since_capped"))
    assert before.height and (before["idle_since"] <= as_of - fn.LOOKBACK + timedelta(seconds=STEP_S)).all()
    # each known idle start is the first sample after the GPU's last busy one (an independent query)
    known = idle.filter(~pl.col("idle_since_capped")).row(0, named=True)
    last_busy = open_reader(copy).execute(
        "SELECT max(ts) FROM gpu_samples WHERE host = ? AND gpu_uuid = ? AND coalesce(gpu_instance, -1) = ? AND ts > ? AND ts <= ? "
        "AND coalesce(gpu_util, gr_engine_active * 100) >= 5", [known["host"], known["gpu_uuid"], known["gi"], as_of - fn.LOOKBACK, as_of]).fetchone()[0]
    assert known["idle_since"] == last_busy + timedelta(seconds=STEP_S)


def test_catch_up_meets_the_live_scrapes_so_idle_counts_and_the_policy_go_on(fleet, store, tmp_path):
    """Issue #53.9: the backfill takes minutes; the demo stores the scrapes of those minutes
    (run.catch_up) before its live exporters start, so the history meets the first live scrape
    within max_gap. No GPU's idle count restarts, and a fresh demo's policy has its idle jobs to
    act on (it planned 0 actions with notify_after = 1h when every count restarted)."""
    import shutil

    from gpufleet.analytics.policy import Rules, plan_from_store
    from gpufleet.demo.run import catch_up

    root, _, _ = store
    copy = tmp_path / "store"
    shutil.copytree(root, copy)
    backfill_took = timedelta(seconds=151)  # the slowest backfill the issue saw
    now = fleet.now + backfill_took
    assert catch_up(fleet, copy, clock=lambda: now) == backfill_took
    assert catch_up(fleet, copy, clock=lambda: fleet.now + timedelta(seconds=3)) == timedelta(0)  # within CAUGHT_UP: nothing
    con = open_reader(copy)
    # every reporting device's scrapes run on without a gap across the history's end
    gaps = con.execute("""SELECT max(gap), count(*) FROM (SELECT epoch(ts) - epoch(lag(ts) OVER (PARTITION BY host, gpu_uuid, gpu_instance ORDER BY ts)) AS gap
                          FROM gpu_samples WHERE ts >= ? AND gpu_up > 0)""", [fleet.now - timedelta(minutes=5)]).fetchone()
    assert gaps[0] == STEP_S and gaps[1] == 175 * (20 + 11)  # 175 reporting devices: 5 min of history, 09:30:00 to 09:32:30 caught up
    last = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0]
    assert now - timedelta(seconds=STEP_S) < last < now  # the live exporters' first scrape follows within max_gap
    plan = plan_from_store(con, Rules(), Params(start=now - timedelta(days=1), end=now), now)
    assert plan.actions, plan.closest
    assert all(a.job.idle_s > backfill_took.total_seconds() for a in plan.actions)  # counted from the history, not restarted


def test_fleet_now_page_on_the_demo_store(fleet, store, monkeypatch):
    """The dashboard's Fleet now on the demo's store: 159 of 160 GPUs reporting, the lost GPU's
    XID 79, process counts as integers, idle since from the history."""
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    root, _, _ = store
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "dashboards" / "app.py"), default_timeout=180)
    at.query_params.update({"from": f"{fleet.now - timedelta(days=1):%Y-%m-%dT%H:%M}", "to": f"{fleet.now:%Y-%m-%dT%H:%M}"})
    at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    m = {x.label: x.value for x in at.metric}
    assert m["GPUs reporting"] == "159 of 160"
    assert m["Lost / error / no data (GPUs)"] == "1 / 0 / 0"
    problems = at.container("fleet_problems").dataframe[0].value
    host, gpu = fleet.lost_gpu
    row = problems[(problems["host"] == host) & (problems["gpu"] == gpu)].iloc[0]
    assert row["status"] == "lost" and row["last_xid"] == "79"  # (the code; "none" / "unknown" where there is none)
    from gpufleet.dashboards import ui

    at.session_state[ui.details_key("fleet_gpus")] = True  # (the table of every GPU is made once its expander is opened)
    at.run()
    gpus = at.container("fleet_gpus").dataframe[0].value
    assert len(gpus["compute_processes"].dropna()) == 175  # all but the lost GPU
    for key in ("fleet_gpus", "fleet_idle"):  # integers, shown as 1, not 1.00
        assert json.loads(at.container(key).dataframe[0].proto.columns)["compute_processes"]["type_config"]["format"] == "localized"
    idle = at.container("fleet_idle").dataframe[0].value
    assert idle["idle_since_text"].str.match(r"^(before )?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$").all()


def test_demo_policy_reads_no_squeue(tmp_path):
    """The simulated Slurm has no squeue: with a Slurm client installed on the machine, reading
    opt-out tags through it failed and left the demo's idle jobs alone every round."""
    import tomllib

    from gpufleet.analytics.policy import load_rules
    from gpufleet.demo.run import config_text

    doc = tomllib.loads(config_text(tmp_path, "127.0.0.1:8501", {"nlp": 1.0}, pdf=False))
    assert load_rules(doc, "demo").options["squeue"] == ""


def test_planned_hardware_failures_are_requeued_attempts_the_reliability_report_shows(fleet, store):
    """The plan's XIDs on running training jobs (fleet._plan_failures): each job's first attempt
    is stored apart (job_attempts), ends as a hardware interruption with its XID as evidence, and
    its chain (the requeued second attempt) lost time: ETTR < 1."""
    from gpufleet.analytics import reliability_store
    from gpufleet.demo import checkpoints

    root, _, _ = store
    planned = {j.job_id: j for j in fleet.jobs if j.requeue is not None}
    on_lemon = [j for j in planned.values() if j.slots[0].node.host == fleet_mod.LEMON_NODE]
    assert sorted(j.requeue.xid for j in planned.values() if j not in on_lemon) == [48, 79, 79, 94]
    assert [j.requeue.xid for j in on_lemon] == list(fleet_mod.LEMON_XIDS)
    rel = reliability_store.report(open_reader(root), Params(fleet.start, fleet.now), as_of=fleet.now, top=1000)
    first = {a["job_id"]: a for a in rel["interrupted_attempts"] if a["job_id"] in planned}
    assert sorted(first) == sorted(planned)
    for job_id, a in first.items():
        j = planned[job_id]
        slot = j.slots[j.requeue.slot]
        assert (a["attempt"], a["cause"], a["end"]) == (1, "hardware", j.requeue.failed_at), a
        assert (a["evidence"][0]["host"], a["evidence"][0]["gpu"], a["evidence"][0]["code"]) == (slot.node.host, slot.gpu, j.requeue.xid)
    chains = {ch["job_ids"][0]: ch for ch in rel["chains"] if ch["job_ids"][0] in planned}
    for job_id, ch in chains.items():
        assert ch["causes"][0] == "hardware" and len(ch["causes"]) == 2 and ch["requeue_wait_h"] == pytest.approx(0.25), ch
        assert 0 <= ch["ettr"] < 1, ch
        if ch["causes"][1] == "completed":
            assert ch["ettr"] > 0, ch
        elif not checkpoints.reports(planned[job_id]):  # a second attempt that failed too lost all, without checkpoints
            assert ch["ettr"] == 0 and ch["lost_basis"] == "upper bound", ch
    assert sorted(chains) == sorted(planned)
    assert 0 < rel["goodput"]["ettr"] < 1 and rel["figures"]["lost_gpu_hours_by_cause"]["hardware"] > 0


def test_demo_jobs_report_checkpoints_so_lost_work_is_measured_and_advice_given(fleet, store):
    """Two of three multi-GPU training jobs report their checkpoints (gpufleet.demo.checkpoints): the
    requeued ones that do lose the work since their last checkpoint before the XID (measured), the
    others their whole first attempt (an upper bound); the largest chains that report get Young/Daly's
    advice from their measured cost (the checkpoint dip's length)."""
    from gpufleet.analytics import goodput, reliability_store
    from gpufleet.analytics.core import Analysis
    from gpufleet.demo import checkpoints

    root, _, _ = store
    con = open_reader(root)
    stored = con.sql("SELECT count(*) FROM job_checkpoints").fetchall()[0][0]
    assert stored >= len(checkpoints.observations(fleet, fleet.start, fleet.now)) > 100
    planned = {j.job_id: j for j in fleet.jobs if j.requeue is not None}
    reporting = {i for i, j in planned.items() if checkpoints.reports(j)}
    assert reporting and reporting != set(planned)  # both kinds in the demo
    rel = reliability_store.report(con, Params(fleet.start, fleet.now), as_of=fleet.now, top=1000)
    for a in rel["interrupted_attempts"]:
        if a["job_id"] not in planned:
            continue
        j = planned[a["job_id"]]
        before = [t for t, _ in checkpoints.saved(j, j.start, j.requeue.failed_at)]
        if a["job_id"] in reporting and before:
            assert (a["lost_basis"], a["lost_since"]) == ("measured", max(before)), a
        else:
            assert (a["lost_basis"], a["lost_since"]) == ("upper bound", j.start), a
    f = rel["figures"]
    assert 0 < f["lost_measured_interruptions"] < f["interruptions"] and f["lost_is_upper_bound"]
    advised = [x for x in rel["checkpoint_advice"] if x["advised_interval_s"] is not None]
    assert advised and all(x["checkpoint_save_s"] > 0 and x["mttf_h"] > 0 for x in advised)
    assert any(x["no_advice"] for x in rel["checkpoint_advice"])  # jobs that report nothing: no advice, said
    # the waterfall over the demo's week: monotone, the teams adding up to the fleet
    fall = goodput.compute(Analysis(con, Params(fleet.start, fleet.now), now=fleet.now), con, Params(fleet.start, fleet.now), as_of=fleet.now)
    steps = [r["gpu_h"] for r in fall["fleet"]]
    assert all(b is None or a is None or b <= a + 1e-6 for a, b in zip(steps, steps[1:])), steps
    assert steps[4] < steps[3]  # interruptions lost busy time


def _lemon_jobs(fleet) -> dict[str, object]:
    """The lemon node's planned failures (fleet._plan_lemon): job id -> job."""
    return {j.job_id: j for j in fleet.jobs if j.requeue is not None and {s.node.host for s in j.slots} == {fleet_mod.LEMON_NODE}}


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), now=st.datetimes(datetime(2025, 1, 1), datetime(2028, 1, 1)))
@example(seed=3380, now=datetime(2025, 1, 1))  # three jobs on the lemon node can fail
def test_every_plan_has_its_lemon(seed, now):
    """Whatever the seed and the moment (`gpufleet demo --seed N` starts now), the lemon node's jobs
    lose attempts over the week to the first LEMON_XIDS, each in its own job, on the lemon node's
    GPUs: all six where the node ran six jobs that can fail (_can_fail), and never fewer than the
    lemon test needs to name a node (about 1 plan in 200 has only 3-5 such jobs: seed 3380 at
    2025-01-01 has 3)."""
    from gpufleet.analytics.reliability import Settings

    f = fleet_mod.build(now, seed)
    lemon = _lemon_jobs(f)
    # (one of them may have failed in the last day's plan, _plan_failures, before the lemon's)
    can_fail = [j for j in f.jobs if {s.node.host for s in j.slots} == {fleet_mod.LEMON_NODE}
                and j.start >= f.start and fleet_mod._can_fail(j, f.now)]
    n = len(fleet_mod.LEMON_XIDS) if len(can_fail) > len(fleet_mod.LEMON_XIDS) else min(len(lemon), len(fleet_mod.LEMON_XIDS))
    assert n >= Settings().lemon_min_failures, (len(can_fail), lemon)
    planned = fleet_mod.LEMON_XIDS[:n]
    # (a failure of the last day's plan, _plan_failures, may add one)
    assert not Counter(planned) - Counter(j.requeue.xid for j in lemon.values()), lemon
    assert all(f.start <= j.requeue.failed_at < f.now for j in lemon.values())


def test_the_lemon_node_is_the_only_node_the_reliability_report_flags(fleet, store):
    """The planned lemon (fleet.LEMON_NODE: an XID ends an attempt of its jobs all week) is named by
    the lemon test with the default settings, with each of its failures as evidence; no other node
    is, although four other nodes lost an attempt to an XID and one a GPU."""
    from gpufleet.analytics import reliability_store
    from gpufleet.analytics.reliability import Settings

    root, _, _ = store
    lemon = _lemon_jobs(fleet)
    assert len(lemon) == len(fleet_mod.LEMON_XIDS)
    # spread over the week, none in the day the job checks above read
    assert max(j.start for j in lemon.values()) - min(j.start for j in lemon.values()) > timedelta(days=5)
    rel = reliability_store.report(open_reader(root), Params(fleet.start, fleet.now), as_of=fleet.now, top=1000)
    assert [x["node"] for x in rel["lemons"]] == [fleet_mod.LEMON_NODE], rel["lemons"]
    x = rel["lemons"][0]
    assert (x["cluster"], x["scheduler"], x["failures"]) == ("hpc", "slurm", len(lemon))
    assert x["failures"] > 5 * x["expected_failures"] and x["p_value"] < Settings().lemon_fp_rate / 24  # 24 nodes held GPUs
    assert sorted(e.split(":")[0] for e in x["evidence"]) == sorted(f"job {i}" for i in lemon)
    for j in lemon.values():
        assert any(e.startswith(f"job {j.job_id}: REQUEUED; XID {j.requeue.xid} ") and f" on {fleet_mod.LEMON_NODE} GPU " in e
                   for e in x["evidence"]), (j.job_id, x["evidence"])
    # the other nodes' failures: the four planned requeues and the lost GPU's NODE_FAIL, one a node
    hardware = [a for a in rel["interrupted_attempts"] if a["cause"] in ("hardware", "node_failure")]
    others = Counter(a["evidence"][0]["host"] for a in hardware if a["job_id"] not in lemon)
    assert len(others) == 5 and set(others.values()) == {1}, others


def test_reliability_page_and_weekly_report_show_the_demos_lemon(fleet, store, monkeypatch):
    """The Reliability page on the demo's store lists the lemon node with each failure's evidence;
    the weekly report's reliability section names it with its reason."""
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install '.[dashboards]'")
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from gpufleet.report import render
    from gpufleet.report.model import gather
    from gpufleet.report.window import span_window

    root, _, _ = store
    lemon = _lemon_jobs(fleet)
    monkeypatch.setenv("GPUFLEET_DASHBOARD_STORE", str(root))
    monkeypatch.delenv("GPUFLEET_CONFIG", raising=False)
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "dashboards" / "app.py"), default_timeout=180)
    at.query_params.update({"from": f"{fleet.start:%Y-%m-%dT%H:%M}", "to": f"{fleet.now:%Y-%m-%dT%H:%M}"})
    at.run()
    at = at.switch_page("views/reliability.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    shown = at.container("reliability_lemons").dataframe[0].value
    assert list(shown["node"]) == [fleet_mod.LEMON_NODE] and list(shown["failures"]) == [len(lemon)]
    assert shown["reason"].iloc[0].startswith(f"lemon: {len(lemon)} hardware/node failures in ")
    proto = json.loads(at.container("reliability_lemons").dataframe[0].proto.columns)
    assert proto["p_value"]["type_config"]["format"] == "scientific"  # (~1e-5: not "0.00")
    evidence = at.container("reliability_lemon_evidence").dataframe[0].value
    assert set(evidence["node"]) == {fleet_mod.LEMON_NODE}
    assert sorted(e.split(":")[0] for e in evidence["evidence"]) == sorted(f"job {i}" for i in lemon)

    w = span_window(fleet.start, fleet.now)
    report = gather(open_reader(root), Params(w.start, w.end), w, now=fleet.now)
    text = render.text(report)
    named = [line.strip() for line in text.splitlines() if line.strip().startswith("node ")]
    # (the reason says "lemon: ..."; the line said "Lemon node X: lemon: ...")
    assert named == [f"node {fleet_mod.LEMON_NODE}: {report.reliability['lemons'][0]['reason']}"], named
    assert f'<ul id="lemons">\n<li>{fleet_mod.LEMON_NODE}: ' in render.html(report)
