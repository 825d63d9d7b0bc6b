"""A week of the simulated fleet's past, written into a real store the way the collector would.

Scraping cannot reach into the past, so the backfill computes what the exporters would have
published at every 15 s scrape (load.py, vectorised a day at a time) and commits it through the
store's own writer: one batch per hour (its key makes a re-run a no-op), the scheduler's jobs
as sacct/Kubernetes would report them at "now", the job-to-GPU observations the exporters'
mapping would have given, the GPU inventory, then the collector's own upkeep (compaction,
the facts of every settled hour). What the demo shows afterwards is the product's analytics over these rows.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable

import polars as pl
import pyarrow as pa

from gpufleet.collector import schema
from gpufleet.collector.maintenance import compact
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter
from gpufleet.exporter.backends.sim_models import MODELS
from gpufleet.demo import checkpoints, load, shared
from gpufleet.demo.fleet import PROFILE_CODE, STEP_S, Fleet, Job, Slot

EPOCH = datetime(1970, 1, 1)


def epoch(t: datetime) -> int:
    return int((t - EPOCH).total_seconds())


def fb_total_mib(s: Slot) -> float:
    """The framebuffer the device reports: the MIG profile's share, or the whole board's."""
    m = MODELS[s.node.model]
    return float(m.mig_profiles[s.mig_profile] if s.mig_profile else m.memory_mib)


def slot_frame(fleet: Fleet) -> pl.DataFrame:
    """One row per device with its identity and the power/clock envelope of its model."""
    rows = []
    for i, s in enumerate(fleet.slots()):
        m = MODELS[s.node.model]
        rows.append(dict(slot=i, cluster=s.node.cluster, host=s.node.host, gpu=s.gpu, gpu_uuid=s.gpu_uuid,
                         gpu_instance=s.gpu_instance, mig_profile=s.mig_profile, model=m.name, fb_total=fb_total_mib(s),
                         idle_w=m.idle_w, tdp_w=m.tdp_w, max_sm=float(m.max_sm_mhz), idle_sm=float(m.idle_sm_mhz),
                         mem_mhz=float(m.mem_mhz)))
    return pl.DataFrame(rows, schema_overrides={"gpu": pl.Int16, "gpu_instance": pl.Int16, "mig_profile": pl.String}, infer_schema_length=None)


def segments(fleet: Fleet, slots: pl.DataFrame) -> pl.DataFrame:
    """Who holds each device when: (slot, s0, s1, prof, shape) sorted by start."""
    index = {(r["host"], r["gpu"], r["gpu_instance"] or 0): r["slot"] for r in slots.iter_rows(named=True)}
    rows = [
        dict(slot=index[s.key], s0=epoch(s0), s1=epoch(s1), prof=PROFILE_CODE[j.profile],
             a=j.params[0], b=j.params[1], c=j.params[2], off=j.params[3], seed=j.seed)
        for j in fleet.jobs for s in j.slots for s0, s1 in _runs(j)
    ]
    return pl.DataFrame(rows, schema_overrides={"prof": pl.Int8}).sort("s0")


def _runs(j: Job) -> list[tuple[datetime, datetime]]:
    """When the job's GPUs work: its run, less the wait of a requeue."""
    if j.requeue is None:
        return [(j.start, j.end)]
    return [(j.start, j.requeue.failed_at), (j.requeue.restarted_at, j.end)]


def device_values(fleet: Fleet, slots: pl.DataFrame, segs: pl.DataFrame, t0: int, t1: int) -> pl.DataFrame:
    """Every scrape from t0 to t1 (epoch s) of every device, with load and derived telemetry."""
    times = pl.DataFrame({"t": pl.int_range(t0, t1, STEP_S, eager=True, dtype=pl.Int64)})
    df = times.join(slots.select("slot"), how="cross").sort("t")
    df = df.join_asof(segs, left_on="t", right_on="s0", by="slot", check_sortedness=False)
    df = df.with_columns(prof=pl.when(pl.col("t") < pl.col("s1")).then(pl.col("prof")))
    df = load.evaluate(df).join(slots, on="slot")
    # the simulated exporter's envelope (exporter/backends/sim.py), so history and live agree
    power = pl.col("idle_w") + (pl.col("tdp_w") - pl.col("idle_w")) * 0.9 * pl.col("util") / 100
    mig = pl.col("gpu_instance").is_not_null()
    return df.with_columns(
        power_w=power.round(3),
        gpu_temp_c=(30 + pl.col("util") * 0.45).round(),
        sm_clock_mhz=pl.when(pl.col("util") > 0).then(pl.col("max_sm")).otherwise(pl.col("idle_sm")),
        gpu_util=pl.when(mig).then(None).otherwise(pl.col("util")),
        gr_engine_active=pl.col("util") / 100,
        fb_used_mib=pl.min_horizontal("fb_mib", pl.col("fb_total") * 0.99).round(),
    )


def _health(fleet: Fleet, df: pl.DataFrame) -> pl.DataFrame:
    """The lost GPU's XIDs and its fall off the bus; the outage host's missing scrapes."""
    host, gpu = fleet.lost_gpu
    on_lost = (pl.col("host") == host) & (pl.col("gpu") == gpu)
    (x1, code1), (x2, code2) = fleet.xids
    t = pl.col("t")
    xid = pl.when(t >= epoch(x2)).then(code2).when(t >= epoch(x1)).then(code1).otherwise(0)
    requeued = pl.lit(0)
    for j in fleet.jobs:  # a requeued job's XID on one of its GPUs, from a minute before the failure to the restart
        if j.requeue is not None:
            q, slot = j.requeue, j.slots[j.requeue.slot]
            on = (pl.col("host") == slot.node.host) & (pl.col("gpu") == slot.gpu) & (t >= epoch(q.failed_at) - 60) & (t < epoch(q.restarted_at))
            requeued = pl.when(on).then(q.xid).otherwise(requeued)
    df = df.with_columns(
        xid_last=pl.when(on_lost).then(xid).otherwise(requeued),
        ecc_dbe_vol=pl.when(on_lost & (t >= epoch(x1))).then(1).otherwise(0),
        gpu_up=pl.lit(1.0),
    )
    lost = on_lost & (t >= epoch(fleet.lost_at))
    keep = ("t", "slot", "host", "gpu", "gpu_uuid", "gpu_instance", "cluster")
    df = df.with_columns(
        [pl.when(lost).then(None).otherwise(pl.col(c)).alias(c) for c in df.columns if c not in keep and c != "gpu_up"]
        + [pl.when(lost).then(0.0).otherwise(pl.col("gpu_up")).alias("gpu_up")]
    )
    o_host, o0, o1 = fleet.outage
    return df.filter(~((pl.col("host") == o_host) & (t >= epoch(o0)) & (t < epoch(o1))))


def sample_table(df: pl.DataFrame) -> pa.Table:
    """The rows as gpufleet.collector.schema.SAMPLE_SCHEMA; fields the simulator does not model stay null."""
    out = df.select(
        ts=(pl.col("t") * 1000).cast(pl.Datetime("ms")), cluster="cluster", host="host", gpu="gpu", gpu_uuid="gpu_uuid",
        gpu_instance="gpu_instance", mig_profile="mig_profile", model="model", source=pl.lit("scrape"),
        gpu_util="gpu_util", fb_used_mib="fb_used_mib", fb_total_mib=pl.when(pl.col("gpu_up") > 0).then(pl.col("fb_total")),
        power_w="power_w", gpu_temp_c="gpu_temp_c", sm_clock_mhz="sm_clock_mhz",
        mem_clock_mhz=pl.when(pl.col("gpu_up") > 0).then(pl.col("mem_mhz")),
        xid_last="xid_last", ecc_dbe_vol="ecc_dbe_vol", gr_engine_active="gr_engine_active",
        tensor_active=pl.when(pl.col("gpu_instance").is_null()).then(pl.col("tensor")),
        # the other profiling fields, as the simulated exporters publish them (live.py): whole GPUs
        **{c: pl.when(pl.col("gpu_instance").is_null()).then(v) for c, v in (
            ("sm_active", pl.col("sm_active")), ("pcie_rx_bytes_per_s", pl.col("pcie_rx")),
            ("nvlink_rx_bytes_per_s", pl.col("nvlink") / 2), ("nvlink_tx_bytes_per_s", pl.col("nvlink") / 2))},
        compute_processes="procs", gpu_up="gpu_up",
    ).sort("host", "gpu_uuid", "gpu_instance", "ts").to_arrow()
    return schema.conform_samples(out)


def job_rows(fleet: Fleet, now: datetime) -> list[dict]:
    """The jobs table as the scheduler reports it at `now` (sacct -X, Kubernetes pods)."""
    rows = []
    for j in fleet.jobs:
        state = j.state_at(now)
        if state is not None:
            rows.append(job_row(j, state, now))
    return rows


def job_row(j: Job, state: str, now: datetime) -> dict:
    row = {c: None for c in schema.JOB_COLUMNS}
    hosts = sorted({s.node.host for s in j.slots})
    started = state != "PENDING"
    ended = state not in ("PENDING", "RUNNING")
    row.update(
        cluster=j.cluster, scheduler=j.scheduler, job_key=j.job_key, job_id=j.job_id, name=j.name, user_name=j.user,
        account=j.account, partition=j.partition, qos="normal" if j.scheduler == "slurm" else None,
        submit=j.submit, eligible=j.submit, start=j.started_at(now) if started else None, end=j.end if ended else None,
        state=state, state_raw=state, exit_code=("0:0" if state in ("COMPLETED", "RUNNING", "PENDING") else "1:0"),
        gpus=len(j.slots), gpu_type="h100" if j.cluster == "hpc" else "a100", node_count=len(hosts),
        gpus_source="kubernetes" if j.scheduler == "kubernetes" else "slurmdbd" if ended else "slurmdbd_running",
        nodes=",".join(hosts) if started else None,
        alloc_tres=f"cpu={16 * len(j.slots)},gres/gpu={len(j.slots)},node={len(hosts)}" if j.scheduler == "slurm" and started else None,
        source="sacct" if j.scheduler == "slurm" else "kubernetes", updated_at=now,
    )
    return row


def attempt_rows(fleet: Fleet, now: datetime) -> list[dict]:
    """The earlier attempts sacct --duplicates shows at `now` (schema.ATTEMPT_COLUMNS): each
    requeued job's first, ended REQUEUED by its failure."""
    rows = []
    for j in fleet.jobs:
        if j.requeue is not None and now >= j.requeue.failed_at:
            hosts = sorted({s.node.host for s in j.slots})
            rows.append(dict(cluster=j.cluster, scheduler=j.scheduler, job_key=j.job_key, start=j.start, job_id=j.job_id, submit=j.submit,
                             end=j.requeue.failed_at, state="REQUEUED", state_raw="REQUEUED", exit_code="0:0", gpus=len(j.slots),
                             node_count=len(hosts), nodes=",".join(hosts), source="sacct", updated_at=now))
    return rows


def observations(fleet: Fleet, lo: datetime, hi: datetime) -> tuple[list[dict], list[dict]]:
    """What the exporters' job mapping and inventory would have shown between lo and hi:
    (allocation observations, GPU inventory observations)."""
    lost_host, lost_gpu = fleet.lost_gpu
    allocs = []
    for j in fleet.jobs:
        a, b = max(j.start, lo), min(j.end, hi)
        if a >= b:
            continue
        first = _ceil_scrape(a)
        last = _ceil_scrape(b) - timedelta(seconds=STEP_S)
        if last < first:
            continue
        for s in j.slots:
            obs = dict(cluster=j.cluster, scheduler=j.scheduler, job_key=j.job_key, host=s.node.host, gpu_uuid=s.gpu_uuid,
                       gpu_instance=s.gpu_instance if s.gpu_instance is not None else -1, gpu=s.gpu, source="exporter")
            allocs += [dict(obs, ts=first), dict(obs, ts=last)]
    inventory = []
    for s in fleet.slots():
        last = hi - timedelta(seconds=STEP_S)
        if (s.node.host, s.gpu) == (lost_host, lost_gpu):
            last = fleet.lost_at - timedelta(seconds=STEP_S)
            if last < lo:  # lost before this span: not seen in it
                continue
        obs = dict(cluster=s.node.cluster, host=s.node.host, gpu_uuid=s.gpu_uuid,
                   gpu_instance=s.gpu_instance if s.gpu_instance is not None else -1, gpu=s.gpu, mig_profile=s.mig_profile,
                   model=MODELS[s.node.model].name, fb_total_mib=fb_total_mib(s),
                   driver_version="550.54.15")
        inventory += [dict(obs, ts=lo), dict(obs, ts=last)]
    return allocs, inventory


def _aligned(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """[lo, hi) cut at multiples of `step` (epoch seconds): whole days or clock hours."""
    cuts = [lo] + list(range((lo // step + 1) * step, hi, step)) + [hi]
    return list(zip(cuts, cuts[1:]))


def _ceil_scrape(t: datetime) -> datetime:
    s = epoch(t)
    return EPOCH + timedelta(seconds=-(-s // STEP_S) * STEP_S)


def _write_samples(w: StoreWriter, fleet: Fleet, slots: pl.DataFrame, segs: pl.DataFrame, lo: int, hi: int, key: str,
                   progress: Callable[[int, int], None], total: int) -> int:
    """Every scrape in [lo, hi) (epoch s) committed as one batch per clock hour (`key` and the
    hour name it: a re-run stores nothing new); the samples written."""
    written = 0
    for i, (d0, d1) in enumerate(_aligned(lo, hi, 86400)):
        hours = [(h0, h1, f"{key}:{EPOCH + timedelta(seconds=h0):%Y-%m-%dT%H:%M}")
                 for h0, h1 in _aligned(d0, d1, 3600)]  # one batch per clock hour, as compaction groups them
        if not all(w.has_batch(batch_key) for _, _, batch_key in hours):  # a day stored before is not made again
            day = _health(fleet, device_values(fleet, slots, segs, d0, d1))
            for h0, h1, batch_key in hours:
                hour = day.filter((pl.col("t") >= h0) & (pl.col("t") < h1))
                written += w.commit(Batch(key=batch_key, samples=sample_table(hour))).samples_written
        progress(i + 1, total)
    return written


def backfill(fleet: Fleet, store: str, progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Write [fleet.start, fleet.now) into the store at `store`; returns counts.

    Each hour is its own batch, keyed by the fleet's start and the hour, so running it twice
    for the same fleet stores nothing new."""
    slots = slot_frame(fleet)
    segs = segments(fleet, slots)
    lo, hi = epoch(fleet.start), epoch(fleet.now)
    total = len(_aligned(lo, hi, 86400)) + 1
    w = StoreWriter(store, clock=lambda: fleet.now)
    try:
        written = _write_samples(w, fleet, slots, segs, lo, hi, f"demo-history:{fleet.start.isoformat()}", progress, total)
        allocs, inventory = observations(fleet, fleet.start, fleet.now)
        jobs = job_rows(fleet, fleet.now)
        w.commit(Batch(key=f"demo-history:{fleet.start.isoformat()}:scheduler", jobs=jobs, attempts=attempt_rows(fleet, fleet.now),
                       allocations=allocs, gpus=inventory, checkpoints=checkpoints.observations(fleet, fleet.start, fleet.now)))
        guests, guest_allocs, split = shared.records(fleet)  # a shared GPU (gpufleet.demo.shared)
        w.commit(Batch(key=f"demo-history:{fleet.start.isoformat()}:shared", jobs=[job_row(j, j.state_at(fleet.now), fleet.now) for j in guests],
                       allocations=guest_allocs, shares=split))
        compact(w, fleet.now, facts_hours=None)  # (the week's facts at once, as a rebuild writes them)
        progress(total, total)
    finally:
        w.close()
    return {"samples": written, "jobs": len(jobs), "devices": slots.height}


def catch_up(fleet: Fleet, store: str, since: datetime, until: datetime) -> int:
    """Write the scrapes of [since, until) - the minutes the backfill itself took, after the
    history's end (fleet.now) - with what the job mapping and inventory saw in them, so the
    history meets the live exporters' first scrape without a gap: a gap longer than max_gap is no
    data, which would restart every GPU's idle count (and the idle-GPU policy's clock) at the
    first live sample. The jobs' states after fleet.now are the live scheduler source's to report.
    Returns the samples written."""
    lo, hi = -(-epoch(since) // STEP_S) * STEP_S, epoch(until)  # on the scrape grid the history keeps
    if hi <= lo:
        return 0
    slots = slot_frame(fleet)
    w = StoreWriter(store, clock=lambda: until)
    try:
        written = _write_samples(w, fleet, slots, segments(fleet, slots), lo, hi, f"demo-catch-up:{since.isoformat()}",
                                 lambda done, total: None, 0)
        allocs, inventory = observations(fleet, since, until)
        w.commit(Batch(key=f"demo-catch-up:{since.isoformat()}:mapping", allocations=allocs, gpus=inventory,
                       checkpoints=checkpoints.observations(fleet, since, until)))
        w.publish()  # (the readers see it now: the collector's upkeep compacts it later)
    finally:
        w.close()
    return written
