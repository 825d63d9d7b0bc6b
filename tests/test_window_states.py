"""A window's states from its facts (gpufleet.analytics.window_states): a hand-computed window
(startup, idle, no process, input- and communication-bound, compute, fields absent), equal from
stored facts and from parts cut raw, beside the per-job breakdown; and the invariants on random
fleets: states sum to each job's time with data, teams sum to the fleet, a filtered row equals its
row unfiltered, a state whose fields are absent is None."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Filters, Params
from gpufleet.analytics.states import Thresholds, job_breakdown
from gpufleet.analytics.window_states import STATES, WindowStates, window_states
from gpufleet.collector import schema
from gpufleet.collector.facts import FactParams
from gpufleet.collector.maintenance import compact
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.raw_analysis import RawAnalysis

T0 = datetime(2026, 3, 2)
STEP = 15
H100 = "NVIDIA H100 80GB HBM3"
HOURS = 4
N = HOURS * 3600 // STEP
MIN = 60 // STEP  # samples a minute


def job_row(key: str, account: str, gpus: int, hours: float = HOURS) -> dict:
    row = {c: None for c in schema.JOB_COLUMNS}
    row.update(cluster="c1", scheduler="slurm", job_key=key, job_id=key, name=key, user_name=f"u-{account}", account=account, partition="gpu",
               submit=T0, start=T0, end=T0 + timedelta(hours=hours), state="COMPLETED", state_raw="COMPLETED", exit_code="0:0", gpus=gpus,
               source="test", updated_at=T0 + timedelta(hours=hours))
    return row


def gpu_table(host: str, index: int, util, *, procs=1.0, sm=0.8, tensor=0.5, rx=1e8, nvl=0.0, n: int = N) -> pa.Table:
    """One GPU's samples every STEP s from T0 (a column None: the GPU does not publish it)."""
    def col(v):
        if v is None:
            return pa.nulls(n, pa.float64())
        return pa.array(np.broadcast_to(np.asarray(v, dtype=float), n).copy())

    ts = np.array([T0 + timedelta(seconds=STEP * i) for i in range(n)], dtype="datetime64[ms]")
    return pa.table({
        "ts": pa.array(ts), "cluster": pa.array(["c1"] * n), "host": pa.array([host] * n), "gpu": pa.array(np.full(n, index, dtype=np.int16)),
        "gpu_uuid": pa.array([f"GPU-{host}-{index}"] * n), "model": pa.array([H100] * n), "source": pa.array(["scrape"] * n),
        "gpu_util": col(util), "compute_processes": col(procs), "gpu_up": col(1.0), "sm_active": col(sm), "tensor_active": col(tensor),
        "pcie_rx_bytes_per_s": col(rx), "nvlink_tx_bytes_per_s": col(None if nvl is None else nvl / 2),
        "nvlink_rx_bytes_per_s": col(None if nvl is None else nvl / 2)})


def write(root, jobs: list[dict], gpus: list[tuple[str, str, int, pa.Table]], upkeep: bool) -> None:
    """A store of these jobs and GPU samples (job key, host, index, samples), each GPU held by its
    job from T0 for the job's run; facts built when `upkeep`."""
    w = StoreWriter(root)
    allocs = []
    for key, host, index, _ in gpus:
        for t in (T0, T0 + timedelta(hours=HOURS) - timedelta(seconds=STEP)):
            allocs.append({"ts": t, "cluster": "c1", "scheduler": "slurm", "job_key": key, "host": host, "gpu_uuid": f"GPU-{host}-{index}",
                           "gpu_instance": -1, "gpu": index, "source": "exporter"})
    w.commit(Batch(key="jobs", jobs=jobs, allocations=allocs))
    w.commit(Batch(key="samples", samples=schema.conform_samples(pa.concat_tables([g for *_, g in gpus]))))
    if upkeep:
        compact(w, T0 + timedelta(days=2), FactParams(max_gap_s=30.0, idle_min_s=1800.0), facts_hours=None)
    w.publish()
    w.close()


def hand_store(root, upkeep: bool) -> None:
    """Job a (team t1, 1 GPU): 20 min of loading at 0 %, busy, idle 02:00-03:00, busy (compute).
    Job b (team t2, 2 GPUs): GPU 0 starved (SM 20 % with PCIe RX 5 GB/s), GPU 1 all-reducing
    (NVLink 20 GB/s, tensor 10 %, SM 30 %) and idle with no process the last hour.
    Job c (team t2, 1 GPU): busy 50 %, publishes no profiling field (dcgm without DCP).
    Job d (team t1, 1 GPU): 20 % with no compute process (a non-compute use)."""
    t = np.arange(N) * STEP
    ua = np.where(t < 1200, 0.0, 95.0)
    ua[(t >= 7200) & (t < 10800)] = 0.0
    ub1 = np.where(t >= 3 * 3600, 0.0, 60.0)
    gpus = [("a", "h1", 0, gpu_table("h1", 0, ua)),
            ("b", "h2", 0, gpu_table("h2", 0, 60.0, sm=0.2, rx=5e9, nvl=1e9)),
            ("b", "h2", 1, gpu_table("h2", 1, ub1, procs=np.where(t >= 3 * 3600, 0.0, 1.0), sm=0.3, tensor=0.1, nvl=2e10)),
            ("c", "h3", 0, gpu_table("h3", 0, 50.0, procs=None, sm=None, tensor=None, rx=None, nvl=None)),
            ("d", "h4", 0, gpu_table("h4", 0, 20.0, procs=0.0))]
    write(root, [job_row("a", "t1", 1), job_row("b", "t2", 2), job_row("c", "t2", 1), job_row("d", "t1", 1)], gpus, upkeep)


HAND = {  # GPU-hours per job and state, by hand (the module's rules)
    "a": {"startup": 1 / 3, "idle": 1.0, "no_process": 0.0, "input_bound": 0.0, "communication_bound": 0.0, "compute": HOURS - 4 / 3,
          "busy_unresolved": 0.0},
    "b": {"startup": 0.0, "idle": 0.0, "no_process": 1.0, "input_bound": 4.0, "communication_bound": 3.0, "compute": 0.0, "busy_unresolved": 0.0},
    "c": {"startup": 0.0, "idle": 0.0, "no_process": 0.0, "input_bound": None, "communication_bound": 0.0, "compute": 0.0, "busy_unresolved": 4.0},
    "d": {"startup": 0.0, "idle": 0.0, "no_process": 4.0, "input_bound": 0.0, "communication_bound": 0.0, "compute": 0.0, "busy_unresolved": 0.0},
}


def params(**kw) -> Params:
    return Params(T0, T0 + timedelta(hours=HOURS), **kw)


@pytest.mark.parametrize("upkeep", [True, False], ids=["facts", "raw-cut parts"])
def test_a_hand_computed_window(tmp_path, upkeep):
    hand_store(tmp_path, upkeep)
    con = open_reader(tmp_path)
    p = params()
    a = Analysis(con, p, now=T0 + timedelta(days=3))
    if upkeep:
        assert a.fw.tiles and a.fw.raw_us == 0  # every part from stored facts
    ws = window_states(a, Thresholds.of(p, {}))
    got = {r["job_key"]: r for r in ws.jobs.iter_rows(named=True)}
    for job, states in HAND.items():
        for s, v in states.items():
            if v is None:
                assert got[job][f"{s}_gpu_h"] is None, (job, s)
            else:
                assert got[job][f"{s}_gpu_h"] == pytest.approx(v, abs=1e-9), (job, s)
    assert got["a"]["largest_loss"] == "idle" and got["a"]["largest_loss_share_pct"] == pytest.approx(25.0)
    assert got["b"]["largest_loss"] == "input_bound"
    assert got["c"]["largest_loss"] is None and "DCGM_FI_PROF_SM_ACTIVE" in got["c"]["unknown_fields"]
    assert got["d"]["largest_loss"] == "no_process"
    # the teams and the fleet, priced (H100's $/GPU-hour)
    t2 = ws.teams.filter(pl.col("account") == "t2").row(0, named=True)
    assert t2["input_bound_gpu_h"] == pytest.approx(4.0) and t2["busy_unresolved_gpu_h"] == pytest.approx(4.0)
    assert t2["input_bound_cost"] == pytest.approx(4.0 * a.prices[H100])
    assert ws.fleet["idle_gpu_h"] == pytest.approx(1.0) and ws.fleet["no_process_gpu_h"] == pytest.approx(5.0)
    assert ws.fleet["data_gpu_h"] == pytest.approx(5 * HOURS)
    causes = ws.team_causes()
    assert causes.filter(pl.col("account") == "t1")["state"].to_list() == ["no_process", "idle", "startup"]
    # a loss the report would write as "0.0 GPU-h" is not listed
    tiny = ws.teams.with_columns(pl.when(pl.col("account") == "t1").then(0.04).otherwise(pl.col("startup_gpu_h")).alias("startup_gpu_h"))
    assert WindowStates(ws.jobs, tiny, ws.fleet).team_causes().filter(pl.col("account") == "t1")["state"].to_list() == ["no_process", "idle"]
    # job a beside its per-job breakdown (the same rules for a startup without blips, a long idle run)
    js = job_breakdown(con, p, "a", Thresholds.of(p, {}))
    for s in ("startup", "idle", "compute"):
        assert js.seconds[s] / 3600 == pytest.approx(HAND["a"][s], abs=1e-9)
    # ... and job b's idle hour with no process is no process in both (the job page's order: no process before idle)
    jb = job_breakdown(con, p, "b", Thresholds.of(p, {}))
    assert jb.seconds["no_process"] / 3600 == pytest.approx(HAND["b"]["no_process"], abs=1e-9) and jb.seconds["idle"] == 0.0


@pytest.mark.parametrize("upkeep", [True, False], ids=["facts", "raw-cut parts"])
def test_jobs_held_only_in_the_reach_are_not_the_window_s(tmp_path, upkeep):
    """A window starting 10 minutes after every job ended reads their last parts (its reach: an idle
    run may cross its start) but holds none of their time: no job, team or fleet time in it, and a
    window over their last hour holds exactly theirs."""
    hand_store(tmp_path, upkeep)
    con = open_reader(tmp_path)
    end = T0 + timedelta(hours=HOURS)
    after = Params(end + timedelta(minutes=10), end + timedelta(hours=1))
    ws = window_states(Analysis(con, after, now=T0 + timedelta(days=3)), Thresholds.of(after, {}))
    assert ws.jobs.is_empty() and ws.teams.is_empty() and ws.fleet["data_gpu_h"] == 0.0
    last = Params(end - timedelta(hours=1), end + timedelta(hours=1))
    ws = window_states(Analysis(con, last, now=T0 + timedelta(days=3)), Thresholds.of(last, {}))
    # every GPU (a, b's two, c, d) sampled through the last hour of its job
    assert sorted(ws.jobs["job_key"]) == sorted(HAND) and ws.fleet["data_gpu_h"] == pytest.approx(5 * 1.0, abs=1e-9)


def requeued_store(root, upkeep: bool) -> None:
    """Job r was requeued: its first attempt ran 00:00-01:00 on h1 and h2 (busy after 10 min), its
    second from 01:05 to 02:00 on h1 alone (busy after 15 min). The mapping saw h1 from 00:00 to
    02:00 and h2 until 01:00; both GPUs report all along."""
    t = np.arange(N) * STEP
    u1 = np.full(N, 95.0)
    u1[(t < 600) | ((t >= 3600) & (t < 3900 + 900)) | (t >= 2 * 3600)] = 0.0
    u2 = np.where(t < 600, 0.0, 95.0)
    job = job_row("r", "t1", 1)
    job.update(start=T0 + timedelta(minutes=65), end=T0 + timedelta(hours=2))
    first = {**{c: None for c in schema.ATTEMPT_COLUMNS}, "cluster": "c1", "scheduler": "slurm", "job_key": "r", "job_id": "r", "start": T0,
             "end": T0 + timedelta(hours=1), "state": "REQUEUED", "gpus": 2, "source": "test", "updated_at": T0 + timedelta(hours=1)}
    allocs = [{"ts": T0 + timedelta(seconds=s), "cluster": "c1", "scheduler": "slurm", "job_key": "r", "host": h, "gpu_uuid": f"GPU-{h}-0",
               "gpu_instance": -1, "gpu": 0, "source": "exporter"} for h, last in (("h1", 2 * 3600 - STEP), ("h2", 3600 - STEP)) for s in (0, last)]
    w = StoreWriter(root)
    w.commit(Batch(key="jobs", jobs=[job], allocations=allocs))
    w.commit(Batch(key="attempts", attempts=[first]))
    w.commit(Batch(key="samples", samples=schema.conform_samples(pa.concat_tables([gpu_table("h1", 0, u1), gpu_table("h2", 0, u2)]))))
    if upkeep:
        compact(w, T0 + timedelta(days=2), FactParams(max_gap_s=30.0, idle_min_s=1800.0), facts_hours=None)
    w.publish()
    w.close()


@pytest.mark.parametrize("upkeep", [True, False], ids=["facts", "raw-cut parts"])
def test_a_requeue_on_the_same_gpu_starts_up_again(tmp_path, upkeep):
    """Each run of a requeued job holds its GPUs from its own start: h1's two startups, 10 + 15
    min, and h2's 10 min of the first attempt; h2 is not the job's after 01:00. Time with data:
    h1 60 + 55 min, h2 60 min, the job's allocated time (accounting: 2 GPUs x 1 h + 1 GPU x 55
    min); compute the rest (h1 50 + 40 min, h2 50 min). The per-job breakdown says the same, h1
    one GPU of two (no straggler between its own runs)."""
    requeued_store(tmp_path, upkeep)
    con = open_reader(tmp_path)
    p = params()
    a = Analysis(con, p, now=T0 + timedelta(days=3))
    ws = window_states(a, Thresholds.of(p, {}))
    r = ws.jobs.row(0, named=True)
    want = {"startup": 35 / 60, "idle": 0.0, "no_process": 0.0, "input_bound": 0.0, "communication_bound": 0.0, "compute": 140 / 60,
            "busy_unresolved": 0.0}
    assert {s: r[f"{s}_gpu_h"] for s in STATES} == pytest.approx(want, abs=1e-9)
    assert r["data_gpu_h"] == pytest.approx(175 / 60, abs=1e-9)
    use = a.utilization("job").row(0, named=True)
    assert use["allocated_gpu_h"] == pytest.approx(175 / 60, abs=1e-9) and use["data_gpu_h"] == pytest.approx(175 / 60, abs=1e-9)
    js = job_breakdown(con, p, "r", Thresholds.of(p, {}))
    assert js.seconds["startup"] == pytest.approx(35 * 60) and js.seconds["compute"] == pytest.approx(140 * 60)
    assert js.data_s == pytest.approx(175 * 60) and js.straggler is None
    assert {g.gpu: g.seconds["startup"] for g in js.gpus} == pytest.approx({"h1:0": 25 * 60, "h2:0": 10 * 60})


def test_no_process_is_unknown_without_process_counts(tmp_path):
    write(tmp_path, [job_row("c", "t2", 1)], [("c", "h3", 0, gpu_table("h3", 0, 50.0, procs=None))], upkeep=False)
    p = params()
    ws = window_states(Analysis(open_reader(tmp_path), p, now=T0 + timedelta(days=3)), Thresholds.of(p, {}))
    assert ws.jobs["no_process_gpu_h"].to_list() == [None] and ws.fleet["no_process_gpu_h"] is None
    assert ws.jobs["compute_gpu_h"][0] == pytest.approx(HOURS)


def test_a_job_on_two_models_is_one_job_and_its_unknown_state_leaves_both_rows_out_of_its_team():
    """_assemble on WINDOW_STATE_JOBS' rows (a job's rows consecutive, one per model): the job on two models (a) is one job row
    summing both; its input-bound state is unknown (its busy time knew no PCIe field), so both of its rows stay out of the
    team's input-bound sum while its data counts; b's and c's known states count, each at its model's price; a team of
    unknown jobs alone (d) has the state unknown."""
    from gpufleet.analytics.window_states import _assemble

    zero = {f"{s}_s": 0.0 for s in STATES}

    def row(job, account, model, data, **states):
        told = {"input_told_s": states.pop("input_told_s", 0.0), "comm_told_s": 0.0}
        return {"cluster": "c1", "scheduler": "slurm", "job_key": job, "job_id": job, "user_name": "u", "account": account, "partition": "p",
                "model": model, "hk_min": ord(job), "hk_max": ord(job), "any_inside": True, "data_s": data, **zero,
                **{f"{s}_s": v for s, v in states.items()}, "compute_multi_s": 0.0, "busy_unresolved_multi_s": 0.0, **told,
                "busy_s": sum(v for s, v in states.items() if s in ("input_bound", "communication_bound", "compute", "busy_unresolved")),
                "sm_missing": False, "rx_missing": False, "nvl_missing": False, "tensor_missing": False}

    rows = pl.DataFrame([row("a", "t1", "X", 3600.0, compute=3600.0), row("a", "t1", "Y", 7200.0, compute=7200.0),
                         row("b", "t1", "X", 3600.0, input_bound=3600.0, input_told_s=3600.0), row("c", "t2", "Y", 1800.0, idle=1800.0),
                         row("d", "t3", "X", 3600.0, busy_unresolved=3600.0)])
    ws = _assemble(rows, {"X": 2.0, "Y": 3.0}, True)
    jobs = {r["job_key"]: r for r in ws.jobs.iter_rows(named=True)}
    assert list(jobs) == ["a", "b", "c", "d"]
    assert jobs["a"]["data_gpu_h"] == pytest.approx(3.0) and jobs["a"]["compute_gpu_h"] == pytest.approx(3.0)
    assert jobs["a"]["input_bound_gpu_h"] is None and jobs["b"]["input_bound_gpu_h"] == pytest.approx(1.0)
    assert jobs["c"]["input_bound_gpu_h"] == 0.0  # (no busy time: nothing to tell, so known)
    teams = {r["account"]: r for r in ws.teams.iter_rows(named=True)}
    assert teams["t1"]["data_gpu_h"] == pytest.approx(4.0) and teams["t1"]["data_cost"] == pytest.approx(1 * 2.0 + 2 * 3.0 + 1 * 2.0)
    assert teams["t1"]["input_bound_gpu_h"] == pytest.approx(1.0) and teams["t1"]["input_bound_cost"] == pytest.approx(2.0)
    assert teams["t1"]["compute_gpu_h"] == pytest.approx(3.0) and teams["t1"]["compute_cost"] == pytest.approx(1 * 2.0 + 2 * 3.0)
    assert teams["t2"]["idle_gpu_h"] == pytest.approx(0.5) and teams["t2"]["idle_cost"] == pytest.approx(1.5)
    # a team whose every job's state is unknown has it unknown; one whose job knew it (no busy time) has 0
    assert teams["t3"]["input_bound_gpu_h"] is None and teams["t2"]["input_bound_gpu_h"] == 0.0
    assert ws.fleet["input_bound_gpu_h"] == pytest.approx(1.0) and ws.fleet["data_gpu_h"] == pytest.approx(5.5)
    assert ws.fleet["compute_cost"] == pytest.approx(1 * 2.0 + 2 * 3.0) and ws.fleet["data_cost"] == pytest.approx(3 * 2.0 + 2.5 * 3.0)

    # a model with no price: a cost with time on it is unknown (None), one without time on it is not; the hours stand
    ws = _assemble(rows.vstack(pl.DataFrame([row("e", "t4", "Z", 3600.0, compute=3600.0)], schema=rows.schema)), {"X": 2.0, "Y": 3.0}, True)
    t4 = ws.teams.filter(pl.col("account") == "t4").row(0, named=True)
    assert t4["compute_gpu_h"] == pytest.approx(1.0) and t4["compute_cost"] is None and t4["data_cost"] is None
    assert t4["idle_gpu_h"] == 0.0 and t4["idle_cost"] == 0.0
    assert ws.fleet["compute_gpu_h"] == pytest.approx(4.0) and ws.fleet["compute_cost"] is None and ws.fleet["data_cost"] is None
    assert ws.fleet["idle_cost"] == pytest.approx(1.5)


def test_a_job_of_several_gpus_takes_the_communication_rule_even_from_a_gpu_held_outside_the_window_alone():
    """_assemble: whether a job holds several GPUs is the job's (its rows' hk bounds), not a row's: m's GPU of model Y is held
    only in the reach (no part inside), yet m is multi, so its model X row takes its several-GPU sums (communication-bound,
    compute and busy not resolved as comm_known tells them) and the Y row is dropped; s, of one GPU, takes its one-GPU sums."""
    from gpufleet.analytics.window_states import _assemble

    def row(job, model, hk, inside, **sums):
        base = {f"{s}_s": 0.0 for s in STATES} | {"compute_multi_s": 0.0, "busy_unresolved_multi_s": 0.0}
        return {"cluster": "c1", "scheduler": "slurm", "job_key": job, "job_id": job, "user_name": "u", "account": "t", "partition": "p",
                "model": model, "hk_min": hk, "hk_max": hk, "any_inside": inside, "data_s": 3600.0 if inside else 0.0, **base, **sums,
                "input_told_s": 3600.0, "comm_told_s": 3600.0, "busy_s": 3600.0 if inside else 0.0,
                "sm_missing": False, "rx_missing": False, "nvl_missing": False, "tensor_missing": False}

    both = {"communication_bound_s": 1000.0, "compute_s": 3600.0, "compute_multi_s": 2000.0, "busy_unresolved_multi_s": 600.0}
    rows = pl.DataFrame([row("m", "X", 1, True, **both), row("m", "Y", 2, False), row("s", "X", 3, True, **both)])
    ws = _assemble(rows, {"X": 1.0, "Y": 1.0}, True)
    jobs = {r["job_key"]: r for r in ws.jobs.iter_rows(named=True)}
    assert list(jobs) == ["m", "s"]
    assert (jobs["m"]["communication_bound_gpu_h"], jobs["m"]["compute_gpu_h"], jobs["m"]["busy_unresolved_gpu_h"]) == pytest.approx(
        (1000 / 3600, 2000 / 3600, 600 / 3600))
    assert (jobs["s"]["communication_bound_gpu_h"], jobs["s"]["compute_gpu_h"], jobs["s"]["busy_unresolved_gpu_h"]) == (0.0, 1.0, 0.0)
    assert ws.fleet["data_gpu_h"] == pytest.approx(2.0) and ws.fleet["communication_bound_gpu_h"] == pytest.approx(1000 / 3600)


def test_the_raw_paths_analysis_is_refused(tmp_path):
    hand_store(tmp_path, upkeep=False)
    p = params()
    with pytest.raises(ValueError, match="facts"):
        window_states(RawAnalysis(open_reader(tmp_path), p, now=T0 + timedelta(days=3)), Thresholds.of(p, {}))


@st.composite
def fleets(draw):
    """2-4 GPUs (one per host) held by jobs of one or two GPUs of two teams, each GPU's utilization
    piecewise constant (low, dips, busy), some with no compute process, gaps (no data) and
    profiling fields published or not; a window inside or across the jobs' run."""
    n = draw(st.integers(2, 4), label="gpus")
    sizes = draw(st.lists(st.sampled_from([1, 2]), min_size=n, max_size=n), label="sizes")
    owner, jobs, g = [], [], 0
    while g < n:
        size = min(sizes[g], n - g)
        key = f"j{len(jobs)}"
        jobs.append(job_row(key, draw(st.sampled_from(["t1", "t2"])), size))
        owner += [key] * size
        g += size
    gpus = []
    for g in range(n):
        util, procs, keep = np.zeros(N), np.ones(N), np.ones(N, dtype=bool)
        at = 0
        while at < N:
            length = draw(st.sampled_from([4, 40, 130, 250]))  # 1 min, 10 min, 32 min, an hour
            util[at:at + length] = draw(st.sampled_from([0.0, 2.0, 30.0, 95.0]))
            procs[at:at + length] = draw(st.sampled_from([0.0, 1.0, 1.0]))
            keep[at:at + length] = draw(st.booleans()) or draw(st.booleans())
            at += length
        fields = draw(st.booleans(), label=f"gpu {g} profiling fields")
        rx = draw(st.sampled_from([1e8, 5e9]))
        t = gpu_table(f"h{g}", 0, util, procs=procs if draw(st.booleans()) or g else None,
                      sm=draw(st.sampled_from([0.1, 0.8])) if fields else None, tensor=0.1 if fields else None,
                      rx=rx if fields else None, nvl=2e10 if fields else None)
        gpus.append((owner[g], f"h{g}", 0, t.filter(pa.array(keep))))
    lo = draw(st.integers(-3600, 3 * 3600), label="lo")
    hi = draw(st.integers(lo + 300, 5 * 3600), label="hi")
    return {"jobs": jobs, "gpus": gpus, "lo": lo, "hi": hi, "upkeep": draw(st.booleans(), label="upkeep")}


def _close(x, y) -> bool:
    return (x is None) == (y is None) and (x is None or abs(x - y) <= 1e-9 * max(1.0, abs(y)))


@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # (no shrinking: minutes)
@given(fleets())
def test_states_partition_each_jobs_time_and_teams_sum_to_the_fleet(tmp_path_factory, fleet):
    root = tmp_path_factory.mktemp("ws")
    write(root, fleet["jobs"], fleet["gpus"], fleet["upkeep"])
    con = open_reader(root)
    p = Params(T0 + timedelta(seconds=fleet["lo"]), T0 + timedelta(seconds=fleet["hi"]))
    a = Analysis(con, p, now=T0 + timedelta(days=3))
    ws = window_states(a, Thresholds.of(p, {}))
    # each job's known states sum to its time with data, which is the job's row of utilization by job
    use = {r["job_key"]: r["data_gpu_h"] for r in a.utilization("job").iter_rows(named=True)}
    for r in ws.jobs.iter_rows(named=True):
        assert sum(r[f"{s}_gpu_h"] or 0.0 for s in STATES) == pytest.approx(r["data_gpu_h"], abs=1e-9)
        assert r["data_gpu_h"] == pytest.approx(use[r["job_key"]], abs=1e-9)
        assert all((r[f"{s}_gpu_h"] or 0.0) >= -1e-12 for s in STATES)
        # a state whose fields none of the job's busy time has is unknown, and its time is unresolved
        if r["input_bound_gpu_h"] is None:
            assert r["busy_unresolved_gpu_h"] > 0 and "DCGM_FI_PROF_SM_ACTIVE" in r["unknown_fields"]
    gpus_with_fields = {key for key, _, _, t in fleet["gpus"] if t["sm_active"].null_count == 0}
    for r in ws.jobs.iter_rows(named=True):
        if r["job_key"] not in gpus_with_fields and r["busy_unresolved_gpu_h"] > 0:
            assert r["input_bound_gpu_h"] is None
    # the teams sum to the fleet, state by state (an unknown state: left out, None where all are)
    for s in STATES:
        for u in ("gpu_h", "cost"):
            col = ws.teams[f"{s}_{u}"]
            want = None if col.null_count() == len(col) or (u == "cost" and col.null_count()) else float(col.sum())
            if u == "gpu_h" or not col.null_count():
                assert _close(ws.fleet[f"{s}_{u}"], want), (s, u, ws.fleet, ws.teams.to_dicts())
    assert ws.fleet["data_gpu_h"] == pytest.approx(float(ws.teams["data_gpu_h"].sum()) if ws.teams.height else 0.0, abs=1e-9)
    # the states' idle is the idle allocated figure less the stretches startup and no process took (ORDER_NOTE): never more than it
    assert (ws.fleet["idle_gpu_h"] or 0.0) <= a.totals().idle_allocated_gpu_h + 1e-9
    # a filtered row equals its row unfiltered (by team and by job)
    for r in ws.teams.iter_rows(named=True):
        f = window_states(Analysis(con, Params(p.start, p.end, filters=Filters(account=r["account"])), now=T0 + timedelta(days=3)),
                          Thresholds.of(p, {}))
        assert f.teams.height == 1 and all(_close(f.teams.row(0, named=True)[c], r[c]) for c in ws.teams.columns if c not in ("cluster", "account"))
    for r in ws.jobs.head(1).iter_rows(named=True):
        f = window_states(Analysis(con, Params(p.start, p.end, filters=Filters(job_key=r["job_key"])), now=T0 + timedelta(days=3)),
                          Thresholds.of(p, {}))
        assert f.jobs.height == 1 and all(_close(f.jobs.row(0, named=True)[c], r[c]) if isinstance(r[c], float) or r[c] is None
                                          else f.jobs.row(0, named=True)[c] == r[c] for c in ws.jobs.columns)


def test_analyze_by_account_carries_each_rows_states(tmp_path):
    import io
    import json

    from gpufleet.analytics import cli

    hand_store(tmp_path, upkeep=False)
    p = params()
    r = cli.build_report(open_reader(tmp_path), p, "account", 5, None, now=T0 + timedelta(days=3))
    rows = {row["account"]: {s["state"]: s for s in row["states"]} for row in json.loads(json.dumps(r, default=str))["utilization"]["rows"]}
    assert rows["t2"]["input_bound"]["gpu_h"] == pytest.approx(4.0) and rows["t2"]["input_bound"]["share"] == pytest.approx(4 / 12)
    assert rows["t1"]["no_process"]["gpu_h"] == pytest.approx(4.0)
    assert rows["t1"]["checkpoint"]["gpu_h"] is None and "open the job" in rows["t1"]["checkpoint"]["unknown"]
    out = io.StringIO()
    cli.print_table(r, out)
    text = out.getvalue()
    assert "Where the GPU time went by account" in text
    # headed by the states' words, not the figures' ("idle allocated"), with what sets them apart said under the table
    states_table = text[text.index("Where the GPU time went"):text.index("Most wasteful jobs")]
    assert "idle GPU-h" in states_table and "no process GPU-h" in states_table and "idle allocated" not in states_table.split("\n")[1]
    assert "counts once, in the first state that matches" in states_table
    assert "states" not in cli.build_report(open_reader(tmp_path), p, "user_name", 5, None, now=T0 + timedelta(days=3))["utilization"]["rows"][0]
