"""Reliability: `gpufleet analyze --reliability`'s report for a synthetic week (attempts classified, figures, lemons, chains).

1. A synthetic week written into a real store through StoreWriter: GPUFLEET_BENCH_REL_GPUS H100s
   (hosts of 8) and GPUFLEET_BENCH_REL_JOBS Slurm jobs (MIXES: sizes 1-64 GPUs, at 100,000 GPUs
   mostly single-GPU jobs - 4.8M jobs on ~6.7M allocations; 1 in 50 ending FAILED or
   NODE_FAIL, a third of the failures with an XID 79 on one of their GPUs a minute before the end:
   those GPUs' samples around it are the only samples), with every job's allocations; then
   compacted with every hour's facts built (collector.maintenance.compact), as the collector's
   upkeep leaves a store: the report reads health events from the facts (a store without them is
   read raw, an hour at a time: 57 s rather than 2 s at 1,024 GPUs).
2. gpufleet.analytics.reliability_store.report over the week in a process of its own: wall time
   and peak RSS (VmHWM) are the report's own.

Goals (issue #54): the 1,024-GPU week (50,000 jobs) in <= 0.5 s; the 100,000-GPU week (4.8M jobs)
in <= 10 s and <= 2 GiB.

Knobs (environment): GPUFLEET_BENCH_REL_GPUS=1024, GPUFLEET_BENCH_REL_JOBS=50000,
GPUFLEET_BENCH_CACHE=bench/results/reliability (generated stores, reused), GPUFLEET_BENCH_BEFORE=<a checkout of
the code before> (its report measured too, just before this code's, with the ratio).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench._common import BEFORE_ENV, ROOT, Table, before_checkout, in_checkout, progress

START = datetime(2026, 3, 2)
WEEK = timedelta(days=7)
MEASURE = r"""
import json, resource, sys, time
from datetime import datetime
from gpufleet.analytics import reliability_store
from gpufleet.analytics.params import Params
from gpufleet.collector.store import open_reader
t = time.perf_counter()
rel = reliability_store.report(open_reader(sys.argv[1]), Params(datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3])))
wall = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"wall_s": wall, "rss_mib": hwm, "attempts": rel["figures"]["attempts"],
                  "interruptions": rel["figures"]["interruptions"], "hardware": rel["figures"]["hardware_interruptions"]}))
"""


# Job sizes (GPUs) and how often each is drawn, and the longest job: the 1,024-GPU week's mix
# (large jobs, many overlapping), and the 100,000-GPU week's (issue #54: 4.8M jobs on 6.3M
# allocations, ~1.3 GPUs a job, most of them single-GPU jobs of minutes to a few hours)
MIXES = {
    "1024": ((1, 2, 4, 8, 16, 64), (2, 1, 1, 2, 1, 1), 12 * 3600),
    "100000": ((1, 2, 4, 8, 64), (88, 7, 3, 1.8, 0.2), 4 * 3600),
}
FAIL_RATE = 0.02  # jobs ending FAILED or NODE_FAIL
XID_SHARE = 0.33  # of those, the ones with an XID 79 on their first GPU a minute before the end
COMMITS = 5  # the jobs are committed in this many batches (each commit merges into every job stored before it)


def mix_of(gpus: int) -> str:
    return "1024" if gpus <= 1024 else "100000"


def generate(root: Path, gpus: int, jobs: int, seed: int = 54) -> None:
    """The synthetic week, drawn with numpy (one array per column), committed in COMMITS batches
    through the store's writer as a source's would be, then compacted."""
    import numpy as np
    import pyarrow as pa

    from gpufleet.collector import schema
    from gpufleet.collector.maintenance import compact
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter

    rng = np.random.default_rng(seed)
    hosts = gpus // 8
    sizes, weights, longest = MIXES[mix_of(gpus)]
    size = rng.choice(np.array(sizes), jobs, p=np.array(weights) / sum(weights))
    week_s = int(WEEK.total_seconds())
    start_s = rng.integers(0, week_s, jobs)
    end_s = np.minimum(start_s + rng.integers(300, longest, jobs), week_s)
    first_gpu = rng.integers(0, hosts * 8, jobs)  # (a job's GPUs: consecutive from here, host after host)
    failed = rng.random(jobs) < FAIL_RATE
    state = np.where(failed, np.where(rng.random(jobs) < 0.5, "FAILED", "NODE_FAIL"), "COMPLETED")
    xid = failed & (rng.random(jobs) < XID_SHARE)
    at = lambda s: START + timedelta(seconds=int(s))  # noqa: E731
    host_of = lambda g: f"h{(g // 8) % hosts:05d}"  # noqa: E731
    uuid_of = lambda g: f"GPU-{(g // 8) % hosts:05d}-{g % 8}"  # noqa: E731
    samples = []
    for i in np.flatnonzero(xid).tolist():  # an XID 79 on its first GPU a minute before its end: those samples alone
        g = int(first_gpu[i])
        for k in range(-3, 3):
            samples.append({"ts": at(end_s[i] + 60 * k), "cluster": "c1", "host": host_of(g), "gpu": g % 8, "gpu_uuid": uuid_of(g),
                            "model": "NVIDIA H100 80GB HBM3", "source": "scrape", "xid_last": 79 if k >= -1 else 0, "gpu_up": 1.0})
    cols = {f.name: [r.get(f.name) for r in samples] for f in schema.SAMPLE_SCHEMA}
    w = StoreWriter(root)
    try:
        chunk = -(-jobs // COMMITS)
        for lo in range(0, jobs, chunk):
            rows, allocs = [], []
            for i in range(lo, min(lo + chunk, jobs)):
                start, end, st = at(start_s[i]), at(end_s[i]), str(state[i])
                row = dict.fromkeys(schema.JOB_COLUMNS)
                row.update(cluster="c1", scheduler="slurm", job_key=str(i), job_id=str(i), name=f"job-{i % 997}", user_name=f"u{i % 300}",
                           account=f"a{i % 12}", partition="gpu", submit=start, start=start, end=end, state=st, state_raw=st,
                           exit_code="0:0" if st == "COMPLETED" else "1:0", gpus=int(size[i]), source="bench", updated_at=end)
                rows.append(row)
                for g in range(int(first_gpu[i]), int(first_gpu[i]) + int(size[i])):
                    host, uuid = host_of(g), uuid_of(g)
                    for t in (start, end):
                        allocs.append({"ts": t, "cluster": "c1", "scheduler": "slurm", "job_key": str(i), "host": host, "gpu_uuid": uuid,
                                       "gpu_instance": -1, "gpu": None, "source": "exporter"})
            w.commit(Batch(key=f"bench-rel-{lo}", jobs=rows, allocations=allocs,
                           samples=pa.Table.from_pydict(cols, schema=schema.SAMPLE_SCHEMA) if lo == 0 and samples else None))
            progress(f"  {min(lo + chunk, jobs):,} of {jobs:,} jobs committed")
        w.publish()
        compact(w, START + WEEK + timedelta(days=1), facts_hours=None)  # every hour closed, its facts built
    finally:
        w.close()


def run() -> list[Table]:
    gpus = int(os.environ.get("GPUFLEET_BENCH_REL_GPUS", "1024"))
    jobs = int(os.environ.get("GPUFLEET_BENCH_REL_JOBS", "50000"))
    cache = Path(os.environ.get("GPUFLEET_BENCH_CACHE") or ROOT / "bench" / "results" / "reliability")
    root = cache / f"store-{gpus}-{jobs}-v2"  # (v2: drawn with numpy, the mix by fleet size; stores before it are not read)
    done = root / ".generated"  # (written last: a store whose generation or compaction was cut short is made again)
    if not done.exists():
        progress(f"generating {gpus} GPUs, {jobs} jobs under {root}")
        t = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        generate(root, gpus, jobs)
        done.touch()
        progress(f"generated in {time.monotonic() - t:.0f} s")
    before = before_checkout()
    old = _measure(root, before) if before is not None else None
    got = _measure(root)
    goal_s = 0.5 if gpus <= 1024 else 10.0
    t = Table(f"reliability: the week's report, {gpus:,} GPUs, {jobs:,} jobs ({got['attempts']:,} attempts, "
              f"{got['interruptions']:,} interruptions, {got['hardware']:,} hardware)")
    t.add("wall time", f"{got['wall_s']:.2f} s", f"<= {goal_s:g} s", got["wall_s"] <= goal_s)
    t.add("peak RSS", f"{got['rss_mib']:.0f} MiB", "<= 2048 MiB", got["rss_mib"] <= 2048)
    if old is not None:
        t.add(f"  the code before ({before}): wall / peak RSS; this code's wall / before's",
              f"{old['wall_s']:.2f} s / {old['rss_mib']:.0f} MiB; x{got['wall_s'] / old['wall_s']:.2f}")
        t.notes += [f"{BEFORE_ENV}: the code before, its report measured in the same way just before this code's"]
    return [t]


def _measure(root: Path, checkout: Path | None = None) -> dict:
    """The week's report in a process of its own (MEASURE), with gpufleet from `checkout` (default this one)."""
    code = MEASURE if checkout is None else in_checkout(MEASURE, checkout)
    out = subprocess.run([sys.executable, "-c", code, str(root), START.isoformat(), (START + WEEK).isoformat()],
                         capture_output=True, text=True, check=True, cwd=checkout or ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])
