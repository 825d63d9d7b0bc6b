"""Random fleets' stores as the store's tests build them (on test_analytics_properties' fleets):
MIG placement, the detail fields, each GPU's samples over several files, collector shards, late
data; and a window's figures compared frame by frame."""

from __future__ import annotations

from dataclasses import asdict

import pyarrow as pa
import pytest
from test_analytics_golden import A100, H100
from test_analytics_properties import TOL, batches, frames_equal

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.jobs import job_summaries, per_job_gpu
from gpufleet.analytics.mfu import job_mfu
from gpufleet.collector.schema import Batch
from gpufleet.collector.shard import shard_of


def mig_some(g) -> dict:
    """Every third fleet GPU is a 1g.10gb slice of one A100 (instance = its number); the rest whole H100s."""
    if g["gpu"] % 3 == 2:
        return dict(host="hm", gpu=0, gpu_uuid="GPU-prop-mig", gpu_instance=g["gpu"], mig_profile="1g.10gb", model=A100)
    return dict(host=g["host"], gpu=g["gpu"], gpu_uuid=g["uuid"], gpu_instance=None, mig_profile=None, model=H100)


def detail_fields(g, t) -> dict:
    """Memory, tensor activity (with gaps) and an SM clock (on some GPUs only), for the per-job detail."""
    return {"fb_used_mib": None if (t // 30) % 5 == 0 else float((t * 7 + g["gpu"] * 13) % 500),
            "tensor_active": None if (t // 40) % 4 == 0 else ((t // 20) % 9) / 10,
            "sm_clock_mhz": 1410.0 + (t // 60) % 3 * 100 if g["gpu"] % 2 == 0 else None}


def split(fleet, parts: int, interleave: bool, fields=detail_fields):
    """The fleet's batches, each GPU's samples over `parts` files (slices, or every parts-th sample)."""
    out = []
    for b in batches(fleet, placement=mig_some, fields=fields):
        n = b.samples.num_rows if b.samples is not None else 0
        if n < parts:
            out.append(b)
            continue
        for k in range(parts):
            idx = list(range(k, n, parts)) if interleave else list(range(k * n // parts, (k + 1) * n // parts))
            out.append(type(b)(key=f"{b.key}/{k}", samples=b.samples.take(pa.array(idx, pa.int64())), gpus=b.gpus))
    return out



def figures(an: Analysis, detail: bool = False) -> dict:
    """The window's figures; with `detail`, also the per-job ones (memory, MFU) from
    Analysis.allocation_detail."""
    out = {
        "totals": asdict(an.totals()),
        "per_gpu": an.per_gpu(),
        "idle": an.idle_stretches("idle"),
        "no_process": an.idle_stretches("no_process"),
        "waste": an.waste_by("account"),
        "top": an.top_wasteful_jobs(),
    }
    for by in ("fleet", "host", "model", "account", "user_name", "job"):
        out[f"by_{by}"] = an.utilization(by)
    if detail:
        out["per_job_gpu"] = per_job_gpu(an)
        out["job_mfu"] = job_mfu(an)
        out["jobs"] = job_summaries(an)
    return out


def mismatches(raw: dict, got: dict) -> list[str]:
    bad = []
    for name, x in raw.items():
        y = got[name]
        if isinstance(x, dict):
            for k, v in x.items():
                w = y[k]
                if isinstance(v, float) or isinstance(w, float):
                    if (v is None) != (w is None) or (v is not None and w != pytest.approx(v, **TOL)):
                        bad.append(f"{name}.{k}: {v} != {w}")
                elif v != w:
                    bad.append(f"{name}.{k}: {v} != {w}")
        elif not frames_equal(x, y):
            bad.append(f"{name}:\n{x}\n{y}")
    return bad



def host_of_shard(k: int, n: int) -> str:
    return next(h for h in (f"node-{i}" for i in range(1000)) if shard_of(h, n) == k)


def by_shard(batch: Batch, n: int) -> dict[int, Batch]:
    """A batch as n collector shards store it: each node's samples, inventory and job map with the
    shard its host hashes to, the jobs (accounting) with shard 1."""
    out: dict[int, Batch] = {}
    if batch.samples is not None:
        where = [shard_of(h, n) for h in batch.samples["host"].to_pylist()]
        for k in sorted(set(where)):
            rows = pa.array([i for i, s in enumerate(where) if s == k], pa.int64())
            out[k] = Batch(key=batch.key, samples=batch.samples.take(rows), gpus=[g for g in batch.gpus if shard_of(g["host"], n) == k])
    if batch.jobs:
        out.setdefault(1, Batch(key=batch.key)).jobs = batch.jobs
    for a in batch.allocations:
        out.setdefault(shard_of(a["host"], n), Batch(key=batch.key)).allocations.append(a)
    return out



