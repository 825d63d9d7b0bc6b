"""The checkpoints the demo's training jobs report (gpufleet.exporter.jobreport.checkpoint_saved), as
the collector stores them (schema.JOB_CHECKPOINTS_DDL), so the Reliability page, `analyze
--reliability` and the Waste page's goodput waterfall show measured lost work and Young/Daly's
advice beside jobs that report nothing (lost work an upper bound, no advice).

A training job's GPUs dip to 0 % for a fraction `b` of every `a` seconds of a run (load.py: its
checkpoint); each whole dip is a checkpoint saved at the dip's end, taking the dip's length. Two of
every three multi-GPU Slurm training jobs (by seed) report them; a requeued job reports in both of
its attempts, so its first attempt's lost work runs from its last checkpoint before the failure.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from gpufleet.demo.fleet import STEP_S, Fleet, Job

REPORTING_PROFILES = ("train", "checkpoint")
EPOCH = datetime(1970, 1, 1)


def reports(j: Job) -> bool:
    """Does the job report its checkpoints?"""
    return j.scheduler == "slurm" and j.profile in REPORTING_PROFILES and len(j.slots) > 1 and j.seed % 3 != 0


def saved(j: Job, lo: datetime, hi: datetime) -> list[tuple[datetime, float]]:
    """(when saved, seconds it took) of the job's checkpoints saved in [lo, hi)."""
    period, fraction, _, off = j.params
    if period <= 0 or fraction <= 0:
        return []
    runs = [(j.start, j.end)] if j.requeue is None else [(j.start, j.requeue.failed_at), (j.requeue.restarted_at, j.end)]
    took = period * fraction
    out = []
    for s0, s1 in runs:
        k = -(-off // period)  # the first dip that starts inside the run: k x period - off >= 0
        while True:
            at = s0 + timedelta(seconds=k * period - off + took)
            if at >= min(s1, hi):
                break
            if at >= lo:
                out.append((at.replace(microsecond=0), round(took, 1)))
            k += 1
    return out


def observations(fleet: Fleet, lo: datetime, hi: datetime) -> list[dict]:
    """The checkpoints the reporting jobs saved in [lo, hi), each as the first scrape after it saw it."""
    out = []
    for j in fleet.jobs:
        if not reports(j):
            continue
        for at, took in saved(j, lo, hi):
            seen = EPOCH + timedelta(seconds=math.ceil((at - EPOCH).total_seconds() / STEP_S) * STEP_S)  # the next scrape
            out.append({"seen": seen, "cluster": j.cluster, "scheduler": j.scheduler, "job_key": j.job_key,
                        "saved_at": at, "duration_s": took})
    return out
