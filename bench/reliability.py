"""Reliability: `gpufleet analyze --reliability`'s report for a synthetic week (attempts classified, figures, lemons, chains).

1. A synthetic week written into a real store through StoreWriter: GPUFLEET_BENCH_REL_GPUS H100s
   (hosts of 8) and GPUFLEET_BENCH_REL_JOBS Slurm jobs (sizes 1-64 GPUs, 1 in 50 ending FAILED or
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
GPUFLEET_BENCH_CACHE=bench/results/reliability (generated stores, reused).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench._common import ROOT, Table, progress

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


def generate(root: Path, gpus: int, jobs: int, seed: int = 54) -> None:
    import pyarrow as pa

    from gpufleet.collector import schema
    from gpufleet.collector.maintenance import compact
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter

    rng = random.Random(seed)
    hosts = gpus // 8
    rows, allocs, samples = [], [], []
    for i in range(jobs):
        size = rng.choice((1, 1, 2, 4, 8, 8, 16, 64))
        start = START + timedelta(seconds=rng.randrange(int(WEEK.total_seconds())))
        end = min(start + timedelta(seconds=rng.randrange(300, 12 * 3600)), START + WEEK)
        h0 = rng.randrange(hosts)
        held = [(f"h{(h0 + k // 8) % hosts:05d}", f"GPU-{(h0 + k // 8) % hosts:05d}-{k % 8}") for k in range(size)]
        state = "COMPLETED"
        if rng.random() < 0.02:
            state = rng.choice(("FAILED", "NODE_FAIL"))
            if rng.random() < 0.33:  # an XID 79 on one of its GPUs a minute before its end
                host, uuid = held[0]
                for s in range(-3, 3):
                    t = end + timedelta(seconds=60 * s)
                    samples.append({"ts": t, "cluster": "c1", "host": host, "gpu": int(uuid[-1]), "gpu_uuid": uuid, "model": "NVIDIA H100 80GB HBM3",
                                    "source": "scrape", "xid_last": 79 if s >= -1 else 0, "gpu_up": 1.0})
        row = {c: None for c in schema.JOB_COLUMNS}
        row.update(cluster="c1", scheduler="slurm", job_key=str(i), job_id=str(i), name=f"job-{i % 997}", user_name=f"u{i % 300}",
                   account=f"a{i % 12}", partition="gpu", submit=start, start=start, end=end, state=state, state_raw=state,
                   exit_code="0:0" if state == "COMPLETED" else "1:0", gpus=size, source="bench", updated_at=end)
        rows.append(row)
        for host, uuid in held:
            for t in (start, end):
                allocs.append({"ts": t, "cluster": "c1", "scheduler": "slurm", "job_key": str(i), "host": host, "gpu_uuid": uuid,
                               "gpu_instance": -1, "gpu": None, "source": "exporter"})
    cols = {f.name: [r.get(f.name) for r in samples] for f in schema.SAMPLE_SCHEMA}
    w = StoreWriter(root)
    try:
        step = 20000
        for k in range(0, jobs, step):
            mine = {str(i) for i in range(k, min(k + step, jobs))}
            w.commit(Batch(key=f"bench-rel-{k}", jobs=rows[k:k + step], allocations=[a for a in allocs if a["job_key"] in mine],
                           samples=pa.Table.from_pydict(cols, schema=schema.SAMPLE_SCHEMA) if k == 0 and samples else None))
        w.publish()
        compact(w, START + WEEK + timedelta(days=1), facts_hours=None)  # every hour closed, its facts built
    finally:
        w.close()


def run() -> list[Table]:
    gpus = int(os.environ.get("GPUFLEET_BENCH_REL_GPUS", "1024"))
    jobs = int(os.environ.get("GPUFLEET_BENCH_REL_JOBS", "50000"))
    cache = Path(os.environ.get("GPUFLEET_BENCH_CACHE") or ROOT / "bench" / "results" / "reliability")
    root = cache / f"store-{gpus}-{jobs}-facts"  # (-facts: stores cached before compaction built none)
    done = root / ".generated"  # (written last: a store whose generation or compaction was cut short is made again)
    if not done.exists():
        progress(f"generating {gpus} GPUs, {jobs} jobs under {root}")
        t = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        generate(root, gpus, jobs)
        done.touch()
        progress(f"generated in {time.monotonic() - t:.0f} s")
    out = subprocess.run([sys.executable, "-c", MEASURE, str(root), START.isoformat(), (START + WEEK).isoformat()],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    goal_s = 0.5 if gpus <= 1024 else 10.0
    t = Table(f"reliability: the week's report, {gpus:,} GPUs, {jobs:,} jobs ({got['attempts']:,} attempts, "
              f"{got['interruptions']:,} interruptions, {got['hardware']:,} hardware)")
    t.add("wall time", f"{got['wall_s']:.2f} s", f"<= {goal_s:g} s", got["wall_s"] <= goal_s)
    t.add("peak RSS", f"{got['rss_mib']:.0f} MiB", "<= 2048 MiB", got["rss_mib"] <= 2048)
    return [t]
