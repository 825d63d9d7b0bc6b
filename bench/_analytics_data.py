"""A synthetic GPU fleet written into a real store: samples, inventory, jobs and allocations.

Used by bench/analytics.py. Everything is deterministic for a given scale, so the store is
generated once and reused (bench/results/analytics/store-<scale>-layout<n>/).

The fleet: `gpus / 8` hosts of 8 H100s, one sample per GPU every 15 s. Hosts come in three
pools (by host index mod 8):

  A (0-2)  training: whole-host (8 GPU) and two-host (16 GPU) jobs lasting hours to days;
           busy ~90 % with checkpoint dips, some stall (hung collective: busy, then idle with
           the process still there) and some hold GPUs doing nothing
  B (3-5)  batch: 2- and 4-GPU jobs of a few hours: training, inference with a daily cycle,
           notebooks, idle allocations
  C (6-7)  interactive: 1-GPU jobs of minutes to hours: dev shells (bursts of work between
           pauses), notebooks (idle with a process), inference, short training, idle allocations

Unallocated GPUs sit at 0 % with no process. Two hosts lose their exporter for a while (no data).
Jobs are laid out lane by lane (a lane = the GPUs a job of that size takes: 1, 2, 4, 8 or 16),
with durations and gaps scaled so each lane is 60-95 % occupied; jobs that would start after the
window end are PENDING, jobs still going at the end are RUNNING (no end).

The per-sample columns are computed with polars expressions over (time x GPU) frames joined
as-of to the job segments, one day and group of 16 hosts at a time - no Python loop over samples.
Noise comes from hashing (GPU, time index), so the same scale always gives the same data.
"""

from __future__ import annotations

import hashlib
import math
import random
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from bench._common import env_number
from gpufleet.collector import schema
from gpufleet.collector.schema import Batch
from gpufleet.collector.store import StoreWriter

GEN_VERSION = 2  # bump when the generated data changes: the cache key includes it
STORE_LAYOUT = 3  # bump when the store's files are laid out otherwise (2: compacted hourly files, as the collector leaves them; 3: and in row groups of 491,520 rows)
START = datetime(2026, 11, 2)  # a Monday, 00:00 UTC
STEP = 15  # seconds between samples
CLUSTER = "bench"
MODEL = "NVIDIA H100 80GB HBM3"
HOSTS_PER_GROUP = 16  # generated a day and group of 16 hosts at a time (then committed an hour at a time, compacted)
OVERSHOOT = 1.03  # lanes are laid out over 103 % of the window: some jobs run on, a few pend
PROFILES = {"idle_gpu": 0, "train": 1, "stalled": 2, "held": 3, "notebook": 4, "inference": 5, "dev": 6}
POOL_MIX = {  # profile shares per pool
    "A": [("train", 0.80), ("stalled", 0.12), ("held", 0.08)],
    "B": [("train", 0.45), ("inference", 0.30), ("stalled", 0.08), ("notebook", 0.10), ("held", 0.07)],
    "C": [("dev", 0.40), ("notebook", 0.22), ("inference", 0.15), ("train", 0.13), ("held", 0.10)],
}
LANE_WEIGHT = {16: 0.7, 8: 1.0, 4: 2.5, 2: 3.5, 1: 10.0}  # how many jobs a lane gets, relatively
PARTITION = {"A": "train", "B": "batch", "C": "interactive"}
NAMES = {
    "train": ["pretrain-7b", "finetune-llama", "train-resnet", "sweep-lr", "rlhf-ppo"],
    "stalled": ["pretrain-7b", "finetune-llama", "train-moe"],
    "held": ["salloc", "interactive", "bash"],
    "notebook": ["jupyter", "jupyterlab"],
    "inference": ["serve-llm", "embed-svc", "batch-infer"],
    "dev": ["dev-shell", "debug", "profile-kernels"],
}
N_ACCOUNTS, N_USERS = 24, 240


@dataclass(frozen=True)
class Scale:
    gpus: int = 1024
    days: int = 7
    jobs: int = 50_000
    live: bool = False  # "now" is the window's end: its last hour not compacted, its facts up to the last settled hour

    def __post_init__(self) -> None:
        if self.gpus < 8 or self.gpus % 8:
            raise SystemExit(f"GPUFLEET_BENCH_GPUS={self.gpus}: expected a multiple of 8 (8 GPUs per host)")
        if self.days < 1:
            raise SystemExit(f"GPUFLEET_BENCH_DAYS={self.days}: expected at least 1")

    @property
    def hosts(self) -> int:
        return self.gpus // 8

    @property
    def start(self) -> datetime:
        return START

    @property
    def end(self) -> datetime:
        return START + timedelta(days=self.days)

    @property
    def seconds(self) -> int:
        return self.days * 86400

    @property
    def samples(self) -> int:
        return self.gpus * self.seconds // STEP

    @property
    def key(self) -> str:
        return f"{self.gpus}g-{self.days}d-{self.jobs}j-v{GEN_VERSION}{'-live' if self.live else ''}"

    @property
    def now(self) -> datetime:
        """When the store's upkeep last ran: at the window's end when live, else two hours later (every hour closed)."""
        return self.end if self.live else self.end + timedelta(hours=2)

    def describe(self) -> str:
        return (f"{self.gpus:,} GPUs ({self.hosts} hosts x 8 H100), {self.days} d at {STEP} s "
                f"= {self.samples / 1e6:.1f}M GPU-samples, {self.jobs:,} jobs"
                + (", live (the last hour open: not compacted, facts up to the last settled hour)" if self.live else ""))


def scale_from_env() -> Scale:
    """The fleet the benches generate and measure: GPUFLEET_BENCH_GPUS / _DAYS / _JOBS / _LIVE."""
    return Scale(int(env_number("GPUFLEET_BENCH_GPUS", 1024)), int(env_number("GPUFLEET_BENCH_DAYS", 7)),
                 int(env_number("GPUFLEET_BENCH_JOBS", 50_000)), live=bool(env_number("GPUFLEET_BENCH_LIVE", 0)))


def host_name(h: int) -> str:
    return f"gpu-node-{h:03d}"


def gpu_uuid(h: int, g: int) -> str:
    x = hashlib.md5(f"{CLUSTER}/{h}/{g}".encode()).hexdigest()
    return f"GPU-{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:32]}"


def pool_of(h: int) -> str:
    return "A" if h % 8 < 3 else "B" if h % 8 < 6 else "C"


def lanes(hosts: int) -> list[tuple[str, list[int]]]:
    """(pool, global GPU indices) of every lane; jobs in a lane run one after another."""
    out: list[tuple[str, list[int]]] = []
    a_hosts = [h for h in range(hosts) if pool_of(h) == "A"]
    for i in range(0, len(a_hosts), 2):
        pair = a_hosts[i:i + 2]
        if len(pair) == 2 and (i // 2) % 3 == 0:
            out.append(("A", [h * 8 + g for h in pair for g in range(8)]))
        else:
            out += [("A", [h * 8 + g for g in range(8)]) for h in pair]
    for h in range(hosts):
        pool = pool_of(h)
        if pool == "B":
            sizes = [[4, 4], [4, 2, 2], [2, 2, 2, 2]][h % 3]
            g = 0
            for s in sizes:
                out.append(("B", [h * 8 + g + k for k in range(s)]))
                g += s
        elif pool == "C":
            out += [("C", [h * 8 + g]) for g in range(8)]
    return out


def _split(total: int, weights: list[float]) -> list[int]:
    """Integers proportional to weights that add up to total (largest remainder)."""
    w = sum(weights)
    raw = [total * x / w for x in weights]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: total - sum(out)]:
        out[i] += 1
    return out


def _scaled(values: list[float], total: float) -> list[float]:
    s = sum(values)
    return [v * total / s for v in values] if s > 0 else values


def plan_jobs(scale: Scale) -> tuple[list[dict], list[dict], pl.DataFrame]:
    """Jobs (JOB_COLUMNS rows), allocation observations, and the per-GPU segments that drive samples."""
    all_lanes = lanes(scale.hosts)
    counts = _split(scale.jobs, [LANE_WEIGHT[len(g)] for _, g in all_lanes])
    horizon = scale.seconds * OVERSHOOT
    users = [(f"user-{u:03d}", f"acct-{u % N_ACCOUNTS:02d}") for u in range(N_USERS)]
    user_w = [1 / (u + 1) ** 0.8 for u in range(N_USERS)]
    planned = []  # (start s, end s, pool, profile, gpus, params, user, account, name)
    for li, ((pool, gpus), n) in enumerate(zip(all_lanes, counts)):
        if n == 0:
            continue
        rng = random.Random(f"lane/{li}/{scale.key}")
        occ = rng.uniform(0.60, 0.95)
        durs = _scaled([rng.lognormvariate(0, 0.9) for _ in range(n)], horizon * occ)
        gaps = _scaled([rng.expovariate(1.0) for _ in range(n)], horizon * (1 - occ))
        profs, weights = zip(*POOL_MIX[pool])
        t = 0.0
        for d, g in zip(durs, gaps):
            t += g
            start, dur = int(t), max(120, int(d))
            t = start + dur
            prof = rng.choices(profs, weights)[0]
            if prof in ("train", "stalled"):
                period = rng.uniform(45, 150) * 60
                params = (period, rng.uniform(0.02, 0.06), dur * rng.uniform(0.2, 0.7), rng.uniform(0, period))
            elif prof == "inference":
                params = (rng.uniform(5, 30), rng.uniform(30, 65), rng.uniform(13, 17), 0.0)
            elif prof == "dev":
                period = rng.uniform(10, 60) * 60
                params = (period, rng.uniform(0.2, 0.7), 0.0, rng.uniform(0, period))
            else:
                params = (0.0, 0.0, 0.0, 0.0)
            user, account = rng.choices(users, user_w)[0]
            name = rng.choice(NAMES[prof])
            planned.append((start, start + dur, pool, prof, gpus, params, user, account, name, rng.random(), rng.expovariate(1 / 600)))
    planned.sort(key=lambda j: (j[0], j[4][0]))

    jobs, allocs = [], []
    seg = {k: [] for k in ("gidx", "s0", "s1", "prof", "a", "b", "c", "off")}
    end_s = scale.seconds
    for i, (s0, s1, pool, prof, gpus, params, user, account, name, u, wait) in enumerate(planned):
        key = str(5_000_000 + i)
        hosts = sorted({g // 8 for g in gpus})
        partition = "inference" if prof == "inference" and pool != "A" else PARTITION[pool]
        row = {c: None for c in schema.JOB_COLUMNS}
        row.update(cluster=CLUSTER, scheduler="slurm", job_key=key, job_id=key, name=name, user_name=user, account=account,
                   partition=partition, qos="normal", gpus=len(gpus), gpu_type="h100", node_count=len(hosts),
                   nodes=",".join(host_name(h) for h in hosts), source="sacct",
                   alloc_tres=f"cpu={16 * len(gpus)},gres/gpu={len(gpus)},node={len(hosts)}")
        if s0 >= end_s:  # would start after the window end ("now"): still queued
            sub = START + timedelta(seconds=end_s - 1 - int(wait) % 3600)
            row.update(submit=sub, eligible=sub, state="PENDING", state_raw="PENDING", updated_at=scale.end)
            jobs.append(row)
            continue
        start = START + timedelta(seconds=s0)
        running = s1 > end_s
        state = "RUNNING" if running else ("COMPLETED" if u < 0.88 else "FAILED" if u < 0.95 else "CANCELLED" if u < 0.98 else "TIMEOUT")
        row.update(submit=start - timedelta(seconds=int(wait)), eligible=start - timedelta(seconds=int(wait)), start=start,
                   end=None if running else START + timedelta(seconds=s1), state=state,
                   state_raw=state if state != "CANCELLED" else "CANCELLED by 1000",
                   exit_code="0:0" if state in ("COMPLETED", "RUNNING") else "1:0",
                   updated_at=scale.end if running else START + timedelta(seconds=s1))
        jobs.append(row)
        # what the exporters saw: the first and last scrape inside the job
        first = START + timedelta(seconds=-(-s0 // STEP) * STEP)
        last = START + timedelta(seconds=(min(s1, end_s) - 1) // STEP * STEP)
        for g in gpus:
            obs = dict(cluster=CLUSTER, scheduler="slurm", job_key=key, host=host_name(g // 8), gpu_uuid=gpu_uuid(g // 8, g % 8),
                       gpu_instance=None, gpu=g % 8, source="exporter")
            allocs += [dict(obs, ts=first), dict(obs, ts=max(first, last))]
            for k, v in zip(seg, (g, s0, s1, PROFILES[prof], *params)):
                seg[k].append(v)
    segments = pl.DataFrame(seg, schema={"gidx": pl.Int32, "s0": pl.Int64, "s1": pl.Int64, "prof": pl.Int8,
                                         "a": pl.Float64, "b": pl.Float64, "c": pl.Float64, "off": pl.Float64})
    return jobs, allocs, segments.sort("s0")


def outages(scale: Scale) -> list[tuple[int, int, int]]:
    """(host, from s, to s): exporter down, no samples."""
    h = scale.hosts
    return [(5 % h, 86400 + 3 * 3600, 86400 + 6 * 3600), ((h * 3 // 5) % h, min(scale.days - 1, 4) * 86400 + 13 * 3600, min(scale.days - 1, 4) * 86400 + 13 * 3600 + 2700)]


def _u(seed: int) -> pl.Expr:
    """Uniform [0, 1) noise per (GPU, time index)."""
    return (pl.col("key").hash(seed) % 1_000_003).cast(pl.Float64) / 1_000_003


def chunk(scale: Scale, day: int, group: int, segments: pl.DataFrame, gpus: pl.DataFrame) -> pa.Table:
    """The samples of one day and one group of hosts, as SAMPLE_SCHEMA, sorted by host, gpu, ts."""
    per_day = 86400 // STEP
    hosts = range(group * HOSTS_PER_GROUP, min(scale.hosts, (group + 1) * HOSTS_PER_GROUP))
    g = gpus.filter(pl.col("host_i").is_in(list(hosts)))
    d0, d1 = day * 86400, (day + 1) * 86400
    times = pl.DataFrame({"k": pl.int_range(day * per_day, (day + 1) * per_day, eager=True).cast(pl.Int64)}).with_columns(t=pl.col("k") * STEP)
    seg = segments.filter(pl.col("gidx").is_in(g["gidx"].implode()) & (pl.col("s1") > d0) & (pl.col("s0") < d1))
    df = times.join(g, how="cross").with_columns(key=pl.col("gidx").cast(pl.Int64) * 100_000_000 + pl.col("k"))
    df = df.join_asof(seg, left_on="t", right_on="s0", by="gidx", check_sortedness=False)

    t, rel = pl.col("t").cast(pl.Float64), (pl.col("t") - pl.col("s0")).cast(pl.Float64)
    alloc = pl.col("prof").is_not_null() & (pl.col("t") < pl.col("s1"))
    prof = pl.when(alloc).then(pl.col("prof")).otherwise(0)
    u1, u2, u3 = _u(1), _u(2), _u(3)
    phase = ((rel + pl.col("off")) % pl.col("a")) / pl.col("a")
    train_busy = phase >= pl.col("b")  # checkpoint dip at the start of each period
    busy_util = (90 + 9 * (u1 + u2 - 1)).round().clip(0, 100)
    diurnal = 0.5 + 0.5 * ((t % 86400 / 3600 - pl.col("c")) * (2 * math.pi / 24)).cos()
    infer_util = (pl.col("a") + pl.col("b") * diurnal + 10 * (u1 - 0.5)).round().clip(0, 100)
    dev_busy = phase < pl.col("b")
    util = (
        pl.when(prof == 1).then(pl.when(train_busy).then(busy_util).otherwise(0.0))
        .when(prof == 2).then(pl.when((rel < pl.col("c")) & train_busy).then(busy_util).otherwise(0.0))
        .when(prof == 4).then(pl.when(u3 > 0.997).then((10 + 30 * u1).round()).otherwise(0.0))
        .when(prof == 5).then(infer_util)
        .when(prof == 6).then(pl.when(dev_busy).then((35 + 65 * u1).round()).otherwise(0.0))
        .otherwise(0.0)
    )
    procs = pl.when(prof.is_in([0, 3])).then(0.0).when(prof == 1).then(pl.when(pl.col("gpu") == 0).then(2.0).otherwise(1.0)).otherwise(1.0)
    fb = (pl.when(prof.is_in([0, 3])).then(0.0).when(prof.is_in([1, 2])).then(72_000.0).when(prof == 5).then(40_000.0)
          .when(prof == 4).then(6_000.0).otherwise(20_000.0) + pl.when(prof.is_in([0, 3])).then(0.0).otherwise(500 * u2).round())
    df = df.with_columns(gpu_util=util).with_columns(
        compute_processes=procs,
        tensor_active=pl.when(pl.col("gpu_util") > 0).then(pl.col("gpu_util") / 100 * pl.when(prof.is_in([1, 2])).then(0.45 + 0.1 * u3).otherwise(0.2 * u3)).otherwise(0.0),
        sm_clock_mhz=pl.when(pl.col("gpu_util") > 0).then(1980.0).when(prof.is_in([0, 3])).then(345.0).otherwise(1755.0),
        fb_used_mib=fb,
        power_w=(pl.when(prof.is_in([0, 3])).then(68.0).otherwise(110.0) + 5.6 * pl.col("gpu_util") + 8 * u2).round(1),
    )
    for h, a, b in outages(scale):
        if h in hosts and a < d1 and b > d0:
            df = df.filter(~((pl.col("host_i") == h) & (pl.col("t") >= a) & (pl.col("t") < b)))
    start_ms = int((START - datetime(1970, 1, 1)).total_seconds() * 1000)
    df = df.sort("gidx", "t").select(
        ts=(pl.col("t") * 1000 + start_ms).cast(pl.Datetime("ms")),
        cluster=pl.lit(CLUSTER), host="host", gpu=pl.col("gpu").cast(pl.Int16), gpu_uuid="gpu_uuid",
        model=pl.lit(MODEL), source=pl.lit("scrape"),
        gpu_util=pl.col("gpu_util").cast(pl.Float32), compute_processes=pl.col("compute_processes").cast(pl.Float32),
        tensor_active=pl.col("tensor_active").round(3).cast(pl.Float32), sm_clock_mhz=pl.col("sm_clock_mhz").cast(pl.Float32),
        fb_used_mib=pl.col("fb_used_mib").cast(pl.Float32), power_w=pl.col("power_w").cast(pl.Float32),
    )
    arrow = df.to_arrow()
    return schema.conform_samples(arrow)


def gpu_frame(scale: Scale) -> pl.DataFrame:
    hs = [h for h in range(scale.hosts) for _ in range(8)]
    gs = [g for _ in range(scale.hosts) for g in range(8)]
    return pl.DataFrame({
        "gidx": pl.Series([h * 8 + g for h, g in zip(hs, gs)], dtype=pl.Int32),
        "host_i": pl.Series(hs, dtype=pl.Int32), "gpu": pl.Series(gs, dtype=pl.Int16),
        "host": [host_name(h) for h in hs], "gpu_uuid": [gpu_uuid(h, g) for h, g in zip(hs, gs)],
    })


def inventory_obs(gpu: dict, ts: datetime) -> dict:
    """One inventory observation of a GPU (a gpu_frame row) at `ts`."""
    return dict(cluster=CLUSTER, host=gpu["host"], gpu_uuid=gpu["gpu_uuid"], gpu_instance=-1, gpu=gpu["gpu"], mig_profile=None,
                model=MODEL, fb_total_mib=81559.0, driver_version="550.90.07", ts=ts)


def generate(scale: Scale, root: Path, progress=lambda msg: None) -> dict:
    """Write the whole store to `root` (which must not exist yet) as the product would have it:
    each (day, group of hosts) chunk committed an hour at a time, as the collector's rounds
    land, then each day's closed hours merged into one file per hour and rolled up by the
    product's compaction (gpufleet.collector.maintenance.compact_hours). Returns counts."""
    from gpufleet.collector.maintenance import SETTLE, compact_hours

    jobs, allocs, segments = plan_jobs(scale)
    gpus = gpu_frame(scale)
    inventory = [obs for r in gpus.iter_rows(named=True) for obs in (inventory_obs(r, scale.start),
                                                                     inventory_obs(r, scale.end - timedelta(seconds=STEP)))]
    w = StoreWriter(root, clock=lambda: scale.end)
    rows = 0
    groups = -(-scale.hosts // HOSTS_PER_GROUP)
    try:
        for day in range(scale.days):
            t0 = time.monotonic()
            date = START + timedelta(days=day)
            for group in range(groups):
                t = chunk(scale, day, group, segments, gpus)
                hour = pc.hour(t["ts"])
                for h in range(24):
                    rows += w.commit(Batch(key=f"bench/{date:%Y-%m-%d}/{h:02d}/hosts-{group:02d}",
                                           samples=t.filter(pc.equal(hour, h)))).samples_written
            # (live: the last day's compaction runs at the window's end, as the collector's would, so
            # its last hour stays in the files its rounds wrote)
            last = scale.live and day == scale.days - 1
            hours = compact_hours(w, scale.now if last else date + timedelta(days=1) + SETTLE + timedelta(seconds=1))
            progress(f"  day {day + 1}/{scale.days}: {rows / 1e6:.1f}M samples so far, {hours} hours compacted "
                     f"({time.monotonic() - t0:.0f} s)")
        w.commit(Batch(key="bench/jobs", jobs=jobs, allocations=allocs, gpus=inventory))
        w.publish()
    finally:
        w.close()
    return {"samples": rows, "jobs": len(jobs), "allocations": len(allocs) // 2}


def store_dir(scale: Scale, cache: Path) -> Path:
    """Where the store for `scale` is cached (its data's and its layout's versions in the name)."""
    return cache / f"store-{scale.key}-layout{STORE_LAYOUT}"


def ensure_store(scale: Scale, cache: Path, progress=lambda msg: None) -> tuple[Path, bool]:
    """The cached store for `scale` under `cache`, generated first if missing. (path, generated now)."""
    root = store_dir(scale, cache)
    if (root / ".complete").exists():
        return root, False
    tmp = cache / f".{root.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    counts = generate(scale, tmp, progress)
    (tmp / ".complete").write_text(f"{counts}\n")
    tmp.rename(root)
    return root, True


def ensure_facts(scale: Scale, store: Path, progress=lambda msg: None) -> tuple[float, bool]:
    """The product's facts of every settled hour and closed day of the cached store
    (gpufleet.collector.maintenance.compact, default parameters: those of the analysis), built
    once; (seconds it took, built now)."""
    from gpufleet.collector.facts import FactParams
    from gpufleet.collector.maintenance import compact

    p = FactParams()
    mark = store / f".facts-{p.tag()}"
    if mark.exists():
        return float(mark.read_text().split()[0]), False
    t0 = time.monotonic()
    w = StoreWriter(store, clock=lambda: scale.now)
    try:
        compact(w, scale.now, p, facts_hours=None)
    finally:
        w.close()
    took = time.monotonic() - t0
    progress(f"  facts built in {took:.0f} s")
    mark.write_text(f"{took:.1f} s\n")
    return took, True


def ensure_history(store: Path, weeks: int, progress=lambda msg: None) -> Path:
    """The cached store with `weeks` earlier weeks of accounting beside its own: its jobs and
    allocations copied a week, two weeks, ... back (keys renamed), published as settled segments
    the way a long-running store keeps them (one per week, in end and last-sighting order). The
    samples and facts are the store's own (linked, not copied): an analysis of its window reads the
    same figures with a longer history to skip. Built once, beside the store."""
    import json

    import duckdb

    root = store.parent / f"{store.name}-history{weeks}w"
    if (root / ".complete").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    (root / "tables").mkdir(parents=True)
    for name in ("samples", "facts"):
        (root / name).symlink_to(store / name)
    manifest = json.loads((store / "manifest.json").read_text())
    for rel in manifest["tables"].values():
        shutil.copy2(store / rel, root / rel)
    progress(f"  {weeks} earlier weeks of jobs and allocations")
    con = duckdb.connect()
    segments: dict[str, list[str]] = {"jobs": [], "allocations": []}
    for k in range(1, weeks + 1):
        back = f"INTERVAL {7 * k} DAY"
        jobs, allocations = f"tables/jobs-history-{k:03d}.parquet", f"tables/allocations-history-{k:03d}.parquet"
        con.execute(f"""COPY (SELECT * REPLACE (job_key || '-w{k}' AS job_key, job_id || '-w{k}' AS job_id, submit - {back} AS submit,
                                              eligible - {back} AS eligible, start - {back} AS start, "end" - {back} AS "end",
                                              updated_at - {back} AS updated_at)
                              FROM read_parquet('{store / manifest["tables"]["jobs"]}') WHERE "end" IS NOT NULL ORDER BY "end")
                        TO '{root / jobs}' (FORMAT parquet)""")
        con.execute(f"""COPY (SELECT * REPLACE (job_key || '-w{k}' AS job_key, first_seen - {back} AS first_seen, last_seen - {back} AS last_seen)
                              FROM read_parquet('{store / manifest["tables"]["allocations"]}') ORDER BY last_seen)
                        TO '{root / allocations}' (FORMAT parquet)""")
        segments["jobs"].append(jobs)
        segments["allocations"].append(allocations)
    manifest["segments"] = {name: [*manifest.get("segments", {}).get(name, []), *files] for name, files in segments.items()}
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / ".complete").write_text(f"{weeks} weeks\n")
    return root
