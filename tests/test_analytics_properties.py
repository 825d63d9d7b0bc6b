"""Properties of the analytics (contract 4) over random small fleets, with hypothesis.

Each example builds a real store (StoreWriter, several batches) holding 1-4 GPUs on two hosts
whose samples come in runs: a run is k samples at one spacing with one utilization and process
count, so there are long idle stretches, busy stretches, and gaps shorter and longer than
max_gap (30 s) both inside runs and between them; sometimes a sample has no utilization. Jobs
start and end anywhere, cross the window edges, may still be running, may share a GPU, and
hold at most as many GPUs (allocations from the exporter's job map) as accounting says they have.

Properties:
1. Windows add up: figures of [a, b) equal those of [a, m) plus [m, b) for capacity, data,
   no-data, busy, allocated (accounting), idle allocated, no-process and stranded GPU-hours, in
   totals, per GPU and per account. Idle and no-process stretches are judged by their whole
   length, also when m cuts them (the analysis reads idle_min_duration + max_gap beyond each edge).
2. Re-ingesting the same batches (a second writer, the batches again, in another order) leaves
   every figure unchanged.
3. Bounds. Two "allocated" figures exist and they bound different things:
   - per GPU, allocated_data_gpu_h (exporter allocations intersected with the GPU's data time) is
     part of data_gpu_h, which is part of capacity: allocated_data + stranded == data and
     no_data + data == capacity, busy <= data. Idle allocated time on a GPU is part of its
     allocated data time when no two jobs held that GPU at once (with sharing, each job's idle
     time counts for that job, and their sum can exceed the GPU's wall time).
   - per job, accounting's allocated GPU-hours (GPUs x run time) bound the job's idle and
     no-process GPU-hours, since a job holds at most the GPUs accounting gives it; so the idle
     total is at most the accounting total. Accounting is *not* bounded by capacity: a job may
     hold GPUs the store never saw a sample of (it counts in allocated, not in capacity).
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import asdict
from datetime import datetime, timedelta

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter, open_reader

BASE = datetime(2026, 3, 1, 0, 0, 0)
MAX_GAP = 30
CLUSTER = "prop"
SPACINGS = [1, 5, 15, 15, 15, 29, 30, 31, 60, 400]
UTILS = [0.0, 0.0, 0.0, 2.0, 4.9, 5.0, 30.0, 100.0, None]  # below idle_threshold (5 %) more often than not
PROCS = [0.0, 0.0, 1.0, 2.0, None]
FIELDS = ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_gpu_h",
          "idle_allocated_gpu_h", "no_process_gpu_h", "stranded_gpu_h")
GPU_FIELDS = ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_data_gpu_h", "stranded_gpu_h")
TOL = dict(rel=1e-9, abs=1e-9)


def at(seconds: int) -> datetime:
    return BASE + timedelta(seconds=seconds)


def uuid(g: int) -> str:
    return f"GPU-prop-{g}"


# (samples, spacing, utilization, processes, time to the next run's first sample)
RUN = st.tuples(st.integers(1, 60), st.sampled_from(SPACINGS), st.sampled_from(UTILS), st.sampled_from(PROCS), st.sampled_from(SPACINGS))
# a long regular stretch below the idle threshold, as a held-but-unused GPU shows
IDLE_RUN = st.tuples(st.integers(20, 80), st.sampled_from([15, 30]), st.sampled_from([0.0, 2.0, 4.9]), st.sampled_from([0.0, 1.0]),
                     st.sampled_from([15, 30, 31, 400]))


@st.composite
def fleets(draw):
    gpus = []
    horizon = 0
    for g in range(draw(st.integers(1, 4))):
        t = draw(st.integers(0, 300))
        samples = []
        runs = draw(st.lists(RUN | IDLE_RUN, min_size=1, max_size=5))
        for count, spacing, util, procs, then in runs:
            for _ in range(count):
                samples.append((t, util, procs))
                t += spacing
            t += then - spacing  # the next run starts `then` after this run's last sample
        gpus.append({"gpu": g, "host": f"h{g % 2}", "uuid": uuid(g), "samples": samples})
        horizon = max(horizon, samples[-1][0])
    jobs = []
    for j in range(draw(st.integers(0, 4))):
        start = draw(st.integers(-300, horizon + 100))
        dur = draw(st.integers(1, max(60, horizon + 300)))
        running = draw(st.booleans()) and draw(st.booleans())
        n = draw(st.integers(1, 4))
        mapped = draw(st.sampled_from([0, 1, 1, 1]))  # mostly the exporter saw it on some GPU
        held = draw(st.lists(st.sampled_from(range(len(gpus))), unique=True, min_size=min(mapped, len(gpus)), max_size=n))
        jobs.append({"key": f"{100 + j}", "account": draw(st.sampled_from(["alpha", "beta"])), "user": "u",
                     "start": start, "end": None if running else start + dur, "seen_until": start + dur, "gpus": n, "held": held})
    horizon = max([horizon] + [j["seen_until"] for j in jobs])
    cuts = sorted(draw(st.lists(st.integers(-400, horizon + 400), min_size=3, max_size=3, unique=True)))
    now = horizon + MAX_GAP + draw(st.integers(0, 600))
    idle_min = draw(st.sampled_from([60, 120, 300, 600]))
    return {"gpus": gpus, "jobs": jobs, "cuts": cuts, "now": now, "idle_min": idle_min}


H100 = "NVIDIA H100 80GB HBM3"


def whole_h100(g) -> dict:
    """Where a fleet GPU sits: by default a whole H100 (other tests place some in MIG slices)."""
    return dict(host=g["host"], gpu=g["gpu"], gpu_uuid=g["uuid"], gpu_instance=None, mig_profile=None, model=H100)


def batches(fleet, placement=whole_h100, fields=lambda g, t: {}) -> list[Batch]:
    """The fleet as the collector would commit it: one sample batch per GPU, then one for jobs.
    `placement(g)`: the GPU's sample labels; `fields(g, t)`: more sample fields at time t."""
    out = []
    for g in fleet["gpus"]:
        where = placement(g)
        rows = [dict(ts=at(t), cluster=CLUSTER, source="scrape", gpu_util=u, compute_processes=p, **fields(g, t), **where)
                for t, u, p in g["samples"]]
        table = pa.Table.from_pydict({f.name: [r.get(f.name) for r in rows] for f in schema.SAMPLE_SCHEMA}, schema=schema.SAMPLE_SCHEMA)
        inv = dict(where, gpu_instance=-1 if where["gpu_instance"] is None else where["gpu_instance"])
        seen = [dict(ts=at(t), cluster=CLUSTER, fb_total_mib=None, driver_version=None, **inv) for t in (g["samples"][0][0], g["samples"][-1][0])]
        out.append(Batch(key=f"samples:{g['uuid']}", samples=table, gpus=seen))
    jobs, allocs = [], []
    for j in fleet["jobs"]:
        row = {c: None for c in schema.JOB_COLUMNS}
        row.update(cluster=CLUSTER, scheduler="slurm", job_key=j["key"], job_id=j["key"], user_name=j["user"], account=j["account"],
                   partition="gpu", submit=at(j["start"]), start=at(j["start"]), end=None if j["end"] is None else at(j["end"]),
                   state="RUNNING" if j["end"] is None else "COMPLETED", gpus=j["gpus"], source="test", updated_at=at(j["start"]))
        jobs.append(row)
        for g in j["held"]:
            where = placement(fleet["gpus"][g])
            gi = -1 if where["gpu_instance"] is None else where["gpu_instance"]
            for t in (j["start"], j["seen_until"]):
                allocs.append(dict(ts=at(t), cluster=CLUSTER, scheduler="slurm", job_key=j["key"], host=where["host"],
                                   gpu_uuid=where["gpu_uuid"], gpu_instance=gi, gpu=None, source="exporter"))
    out.append(Batch(key="jobs", jobs=jobs, allocations=allocs))
    return out


# fsync dominates a store's build on a disk; a tmpfs keeps 40 examples within seconds
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def scratch():
    return tempfile.TemporaryDirectory(prefix="gpufleet-prop-", dir=SCRATCH)


def build(root, fleet, **how):
    """A store of the fleet (batches(fleet, **how)), published; its reader."""
    w = StoreWriter(root)
    for b in batches(fleet, **how):
        w.commit(b)
    w.publish()
    w.close()
    return open_reader(root)


def figures(con, fleet, a: int, b: int) -> dict:
    """Everything we check, for the window [a, b) (seconds from BASE)."""
    p = Params(at(a), at(b), max_gap=timedelta(seconds=MAX_GAP), idle_min_duration=timedelta(seconds=fleet["idle_min"]))
    an = Analysis(con, p, now=at(fleet["now"]))
    return {
        "totals": asdict(an.totals()),
        "per_gpu": an.per_gpu().sort("gpu_uuid"),
        "accounts": an.utilization("account"),
        "jobs": an.utilization("job"),
        "idle": an.idle_stretches("idle"),
        "no_process": an.idle_stretches("no_process"),
    }


def by_key(df: pl.DataFrame, key: str, col: str) -> dict:
    if df.is_empty():
        return {}
    out: dict = {}
    for k, v in zip(df[key].to_list(), df[col].to_list()):
        out[k] = out.get(k, 0.0) + (v or 0.0)
    return out


def add(x: dict, y: dict) -> dict:
    return {k: x.get(k, 0.0) + y.get(k, 0.0) for k in set(x) | set(y)}


def same(x: dict, y: dict) -> bool:
    return all(x.get(k, 0.0) == pytest.approx(y.get(k, 0.0), **TOL) for k in set(x) | set(y))


def shared_gpus(fleet) -> set[str]:
    """GPUs that two jobs held at the same time (exporter allocation spans)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for j in fleet["jobs"]:
        end = j["end"] if j["end"] is not None else j["seen_until"] + MAX_GAP
        for g in j["held"]:
            spans.setdefault(uuid(g), []).append((j["start"], end))
    shared = set()
    for u, s in spans.items():
        s.sort()
        if any(s[i + 1][0] < max(e for _, e in s[: i + 1]) for i in range(len(s) - 1)):
            shared.add(u)
    return shared


# Two jobs share one GPU for the first half of [0, 1200) and nobody holds it in the second: the
# GPU stood unallocated for 600 s, whichever way the window is cut. (Summing the jobs' pieces
# per GPU counted the shared half twice, and clamping at the data time hid it: [0, 1200) said
# 0 s stranded while its two halves said 0 + 600.)
SHARED_GPU = {
    "gpus": [{"gpu": 0, "host": "h0", "uuid": uuid(0), "samples": [(t, 50.0, 1.0) for t in range(0, 1200, 15)]}],
    "jobs": [{"key": k, "account": acct, "user": "u", "start": 0, "end": 600, "seen_until": 600, "gpus": 1, "held": [0]}
             for k, acct in (("1", "alpha"), ("2", "beta"))],
    "cuts": [0, 600, 1200], "now": 5000, "idle_min": 60,
}

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# re-ingest is content-addressed (batch keys + checksums): fewer examples say as much
REINGEST_SETTINGS = settings(SETTINGS, max_examples=25)


@SETTINGS
@given(fleets())
@example(SHARED_GPU)
def test_windows_add_up_and_figures_keep_their_bounds(fleet):
    with scratch() as tmp:
        con = build(tmp, fleet)
        a, m, b = fleet["cuts"]
        whole, left, right = figures(con, fleet, a, b), figures(con, fleet, a, m), figures(con, fleet, m, b)

        # 1. additivity
        for f in FIELDS:
            assert whole["totals"][f] == pytest.approx(left["totals"][f] + right["totals"][f], **TOL), f
        for f in GPU_FIELDS:
            assert same(by_key(whole["per_gpu"], "gpu_uuid", f),
                        add(by_key(left["per_gpu"], "gpu_uuid", f), by_key(right["per_gpu"], "gpu_uuid", f))), f
        for f in ("allocated_gpu_h", "data_gpu_h", "busy_gpu_h", "no_data_gpu_h"):
            assert same(by_key(whole["accounts"], "account", f),
                        add(by_key(left["accounts"], "account", f), by_key(right["accounts"], "account", f))), f
        for kind in ("idle", "no_process"):
            assert same(by_key(whole[kind], "job_key", "gpu_h"),
                        add(by_key(left[kind], "job_key", "gpu_h"), by_key(right[kind], "job_key", "gpu_h"))), kind

        # 3. bounds, in each of the three windows
        shared = shared_gpus(fleet)
        for (lo, hi), fig in (((a, b), whole), ((a, m), left), ((m, b), right)):
            hours = (hi - lo) / 3600
            t = fig["totals"]
            g = fig["per_gpu"]
            for r in g.iter_rows(named=True):
                assert 0 <= r["capacity_gpu_h"] <= hours + 1e-12
                assert r["no_data_gpu_h"] + r["data_gpu_h"] == pytest.approx(r["capacity_gpu_h"], **TOL)
                assert 0 <= r["busy_gpu_h"] <= r["data_gpu_h"] + 1e-12
                assert 0 <= r["allocated_data_gpu_h"] <= r["data_gpu_h"] + 1e-12
                assert r["allocated_data_gpu_h"] + r["stranded_gpu_h"] == pytest.approx(r["data_gpu_h"], **TOL)
            idle_per_gpu = by_key(fig["idle"], "gpu_uuid", "gpu_h")
            alloc_per_gpu = by_key(g, "gpu_uuid", "allocated_data_gpu_h")
            for u, h in idle_per_gpu.items():
                if u not in shared:
                    assert h <= alloc_per_gpu.get(u, 0.0) + 1e-12, u
            accounting = by_key(fig["jobs"], "job_key", "allocated_gpu_h")
            for kind in ("idle", "no_process"):
                for job, h in by_key(fig[kind], "job_key", "gpu_h").items():
                    assert h <= accounting.get(job, 0.0) + 1e-12, (kind, job)
            assert t["idle_allocated_gpu_h"] <= t["allocated_gpu_h"] + 1e-12
            assert t["no_process_gpu_h"] <= t["allocated_gpu_h"] + 1e-12
            assert t["data_gpu_h"] <= t["capacity_gpu_h"] + 1e-12
            assert t["no_data_gpu_h"] + t["data_gpu_h"] == pytest.approx(t["capacity_gpu_h"], **TOL)
            assert t["capacity_gpu_h"] <= len(fleet["gpus"]) * hours + 1e-12


def frames_equal(x: pl.DataFrame, y: pl.DataFrame) -> bool:
    if x.columns != y.columns or x.height != y.height:
        return False
    keys = [c for c, t in x.schema.items() if not t.is_float()]
    x, y = x.sort(keys, nulls_last=True), y.sort(keys, nulls_last=True)
    for c, t in x.schema.items():
        if t.is_float():
            if [v is None for v in x[c]] != [v is None for v in y[c]]:
                return False
            if [v for v in x[c] if v is not None] != pytest.approx([v for v in y[c] if v is not None], **TOL):
                return False
        elif x[c].to_list() != y[c].to_list():
            return False
    return True


@REINGEST_SETTINGS
@given(fleets(), st.randoms(use_true_random=False))
def test_reingesting_the_same_batches_changes_nothing(fleet, rnd: random.Random):
    with scratch() as tmp:
        con = build(tmp, fleet)
        a, m, b = fleet["cuts"]
        before = figures(con, fleet, a, b)
        again = batches(fleet)
        rnd.shuffle(again)
        w = StoreWriter(tmp)  # a second writer, as after a restart
        for batch in again:
            r = w.commit(batch)
            assert not r.conflict
            assert r.samples_written == 0  # a known key with the same rows: a duplicate
        w.publish()
        w.close()
        con = open_reader(tmp)
        assert con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == sum(len(g["samples"]) for g in fleet["gpus"])
        after = figures(con, fleet, a, b)
        for k, v in before["totals"].items():
            assert after["totals"][k] == (pytest.approx(v, **TOL) if isinstance(v, float) else v), k
        for name in ("per_gpu", "accounts", "jobs", "idle", "no_process"):
            assert frames_equal(before[name], after[name]), name
