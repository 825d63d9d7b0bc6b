"""Job states: one job's breakdown of its GPU time (`gpufleet analyze --job`), at two fleet sizes.

1. A synthetic day written into a real store through StoreWriter: GPUFLEET_BENCH_STATES_GPUS H100s
   (hosts of 8) sampled every 15 s with the profiling fields, and jobs of 16, 64 and 256 GPUs (those
   that fit the fleet) holding whole hosts all day (a startup, checkpoint dips every 30 min, one slow GPU) beside single-GPU jobs.
2. gpufleet.analytics.states.job_breakdown of each big job in a process of its own: wall time and
   peak RSS (VmHWM) are the breakdown's own, imports excluded. The CPU time beside the wall time
   (all the process' threads) tells a loaded machine's wait from the breakdown's own work.

Goal (issue #55): a job's breakdown <= 0.5 s at any fleet size - it reads only its own GPUs'
samples, so the two fleet sizes are measured side by side (the larger must not be slower in
proportion to its size).

3. The window's breakdown from facts (gpufleet.analytics.window_states) of the same day with its
   facts built as the upkeep builds them, at GPUFLEET_BENCH_STATES_WINDOW_GPUS: the Analysis and
   window_states on it, timed apart (median of 3), and the bench's jobs beside their own
   breakdown. Goal (#55): the 16,384-GPU week <= 2 s, 100,000 GPUs <= 5 s; its cost is GPUs x
   buckets, so two sizes give its growth.

4. The analytics bench's week (bench/analytics.py's store at GPUFLEET_BENCH_GPUS, _DAYS, _JOBS, with its facts, as
   `./scripts/bench analyze` reads it; generated first if missing): its job with the most GPU-hours in the window
   broken down first in a process of its own (#55: <= 0.5 s at any fleet size), then the Analysis of the week with its
   totals and window_states after them (median of 3; #55: <= 2 s at 16,384 GPUs, <= 5 s at 100,000). The one place the bench measures
   these goals at the fleet sizes they name: `GPUFLEET_BENCH_GPUS=16384 GPUFLEET_BENCH_JOBS=800000 ./scripts/bench states`.

Knobs (environment): GPUFLEET_BENCH_STATES_GPUS="256,1024" (the fleet sizes; "" skips them),
GPUFLEET_BENCH_STATES_WINDOW_GPUS="256,1024" (the window breakdown's; "" skips it; a day of 1,024 GPUs with its facts takes ~10 min to generate on a loaded 2-core machine),
GPUFLEET_BENCH_STATES_WEEK=1 (0 skips the analytics bench's week), GPUFLEET_BENCH_CACHE=bench/results/states
(generated stores, reused; the analytics week's: bench/analytics.py's own), GPUFLEET_BENCH_BEFORE=<a checkout of the code
before> (the window's breakdown measured with that code too, in a process before this code's, with the ratio).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench._common import ROOT, Table, before_checkout, in_checkout, progress

START = datetime(2026, 3, 2)
DAY = timedelta(days=1)
STEP_S = 15
JOBS = {"big16": 16, "big64": 64, "big256": 256}  # job key -> GPUs (whole hosts from host 0 on)
MEASURE = r"""
import json, sys, time
from datetime import datetime
from gpufleet.analytics import states
from gpufleet.analytics.params import Params
from gpufleet.cli import _without_pandas
from gpufleet.collector.store import open_reader
p = Params(datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3]))
con = open_reader(sys.argv[1])
t = states.Thresholds.of(p, {})
got = {}
for job in sys.argv[4:]:
    with _without_pandas("analyze"):  # as `gpufleet analyze --job` runs it (pyarrow's conversions would import pandas)
        t0, c0 = time.perf_counter(), time.process_time()
        js = states.job_breakdown(con, p, job, t)
    got[job] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "gpus": len(js.gpus), "data_h": js.data_s / 3600}
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"jobs": got, "rss_mib": hwm}))
"""


def _utilization(n: int, gpu: int, big: bool):
    """A day of one GPU's utilization (percent), as numpy: big jobs start up for 10 min, dip every
    30 min for 90 s (checkpoints); GPU 3 of a big job runs 20 % behind; small jobs alternate."""
    import numpy as np

    t = np.arange(n) * STEP_S
    if big:
        util = np.full(n, 95.0 if gpu % 8 != 3 else 76.0)
        util[t < 600] = 1.0
        util[(t % 1800) < 90] = 2.0
    else:
        util = np.where((t // 3600) % 3 == 0, 0.0, 60.0)
    return util


def generate(root: Path, gpus: int) -> None:
    import numpy as np
    import pyarrow as pa

    from gpufleet.collector import schema
    from gpufleet.collector.schema import Batch
    from gpufleet.collector.store import StoreWriter

    n = int(DAY.total_seconds()) // STEP_S
    ts = np.array([START + timedelta(seconds=STEP_S * i) for i in range(n)], dtype="datetime64[ms]")
    owner, first = {}, 0
    for key, size in _jobs(gpus).items():
        owner.update({g: key for g in range(first, first + size)})
        first += size
    w = StoreWriter(root)
    try:
        jobs, allocs = [], []
        for key, size in _jobs(gpus).items():
            jobs.append(_job(schema, key, size))
        for g in range(first, gpus):
            jobs.append(_job(schema, f"small{g}", 1))
            owner[g] = f"small{g}"
        for g in range(gpus):
            host, uuid = f"h{g // 8:05d}", f"GPU-{g // 8:05d}-{g % 8}"
            for t in (START, START + DAY - timedelta(seconds=STEP_S)):
                allocs.append({"ts": t, "cluster": "c1", "scheduler": "slurm", "job_key": owner[g], "host": host, "gpu_uuid": uuid,
                               "gpu_instance": -1, "gpu": g % 8, "source": "exporter"})
        w.commit(Batch(key="bench-states-jobs", jobs=jobs, allocations=allocs))
        for h0 in range(0, gpus // 8, 16):  # 16 hosts a batch: memory stays flat as the fleet grows
            tables = []
            for g in range(h0 * 8, min(gpus, (h0 + 16) * 8)):
                big = not owner[g].startswith("small")
                util = _utilization(n, g, big)
                busy = util > 5
                tables.append(pa.table({
                    "ts": pa.array(ts), "cluster": pa.array(["c1"] * n), "host": pa.array([f"h{g // 8:05d}"] * n),
                    "gpu": pa.array(np.full(n, g % 8, dtype=np.int16)), "gpu_uuid": pa.array([f"GPU-{g // 8:05d}-{g % 8}"] * n),
                    "model": pa.array(["NVIDIA H100 80GB HBM3"] * n), "source": pa.array(["scrape"] * n),
                    "gpu_util": pa.array(util), "compute_processes": pa.array(np.ones(n)), "gpu_up": pa.array(np.ones(n)),
                    "sm_active": pa.array(np.where(busy, 0.8, 0.0)), "tensor_active": pa.array(np.where(busy, 0.5, 0.0)),
                    "pcie_rx_bytes_per_s": pa.array(np.full(n, 1e8)),
                    "nvlink_tx_bytes_per_s": pa.array(np.full(n, 1e9 if big else 0.0)),
                    "nvlink_rx_bytes_per_s": pa.array(np.full(n, 1e9 if big else 0.0)),
                }))
            w.commit(Batch(key=f"bench-states-{h0}", samples=schema.conform_samples(pa.concat_tables(tables))))
        w.publish()
    finally:
        w.close()


def _jobs(gpus: int) -> dict[str, int]:
    """The big jobs a fleet of `gpus` holds: JOBS in order, while they fit."""
    fit, used = {}, 0
    for key, size in JOBS.items():
        if used + size <= gpus:
            fit[key] = size
            used += size
    return fit


def _job(schema, key: str, size: int) -> dict:
    row = {c: None for c in schema.JOB_COLUMNS}
    row.update(cluster="c1", scheduler="slurm", job_key=key, job_id=key, name=key, user_name="u1", account="a1", partition="gpu",
               submit=START, start=START, end=START + DAY, state="COMPLETED", state_raw="COMPLETED", exit_code="0:0", gpus=size,
               source="bench", updated_at=START + DAY)
    return row


# The window's breakdown from facts (gpufleet.analytics.window_states) of the same day, its facts
# built as the collector's upkeep builds them: the Analysis (the pages' and the report's, which
# reads the window's parts) and then window_states on it, each timed, with the idle figure's stretches
# (the same chaining pass over the parts) as a yardstick on a loaded machine; the bench's jobs beside their
# own breakdown (states.job_breakdown) for the docstring's comparison.
MEASURE_WINDOW = r"""
import json, sys, time
from datetime import datetime
from gpufleet.analytics import states
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.analytics.window_states import STATES, window_states
from gpufleet.collector.store import open_reader
p = Params(datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3]))
con = open_reader(sys.argv[1])
t = states.Thresholds.of(p, {})
runs = []
for _ in range(3):
    t0 = time.perf_counter()
    a = Analysis(con, p, now=p.end, timeline=True)
    t1 = time.perf_counter()
    ws = window_states(a, t)
    t2 = time.perf_counter()
    a.idle_stretches("idle")
    runs.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    a.con.close()
runs.sort(key=lambda r: r[1])
jobs = {}
for job in sys.argv[4:]:
    js = states.job_breakdown(con, p, job, t)
    row = ws.jobs.filter(ws.jobs["job_key"] == job).row(0, named=True)
    jobs[job] = {"job": {k: v / js.data_s for k, v in js.seconds.items() if v > 0},
                 "window": {s: row[f"{s}_gpu_h"] / row["data_gpu_h"] for s in STATES if row[f"{s}_gpu_h"]}}
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"analysis_s": runs[1][0], "states_s": runs[1][1], "idle_s": runs[1][2], "jobs_n": ws.jobs.height, "tiles": a.fw.tiles, "rss_mib": hwm, "jobs": jobs}))
"""


# The analytics bench's week: one job's breakdown first in the process (as `gpufleet analyze --job` meets it), then the
# Analysis of the week with its totals (which every surface shows beside the breakdown: they build the held parts and
# idle chains the breakdown reads too) and window_states on it, timed apart (median of 3). No timeline: as `gpufleet
# analyze --by` and the weekly report read the week.
MEASURE_WEEK = r"""
import json, sys, time
from datetime import datetime
from gpufleet.analytics import states
from gpufleet.analytics.core import Analysis
from gpufleet.analytics.params import Params
from gpufleet.analytics.window_states import window_states
from gpufleet.cli import _without_pandas
from gpufleet.collector.store import open_reader
p = Params(datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3]))
con = open_reader(sys.argv[1])
t = states.Thresholds.of(p, {})
with _without_pandas("analyze"):  # as `gpufleet analyze --job` runs it (pyarrow's conversions would import pandas)
    t0, c0 = time.perf_counter(), time.process_time()
    js = states.job_breakdown(con, p, sys.argv[4], t)
job = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "gpus": len(js.gpus), "data_h": js.data_s / 3600}
runs = []
for _ in range(3):
    t0 = time.perf_counter()
    a = Analysis(con, p)
    a.totals()
    t1 = time.perf_counter()
    ws = window_states(a, t)
    runs.append((t1 - t0, time.perf_counter() - t1))
    a.con.close()
runs.sort(key=lambda r: r[1])
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"job": job, "analysis_s": runs[1][0], "states_s": runs[1][1], "jobs_n": ws.jobs.height, "rss_mib": hwm}))
"""
WEEK_GOALS = {16384: 2.0, 100_000: 5.0}  # GPUs -> #55's seconds for the window's breakdown of a week
# the job whose breakdown is timed: the most GPU-hours inside the window (ties: the first key)
BIGGEST_JOB = """
SELECT job_key FROM jobs WHERE start < $end AND "end" > $start
ORDER BY gpus * (epoch(least("end", $end)) - epoch(greatest(start, $start))) DESC, job_key LIMIT 1
"""


def week_table() -> Table:
    from bench._analytics_data import ensure_facts, ensure_store
    from bench.analytics import CACHE, SCALE
    from gpufleet.collector.store import open_reader

    store, _ = ensure_store(SCALE, CACHE, progress)
    ensure_facts(SCALE, store, progress)
    con = open_reader(store)
    try:
        [(job,)] = con.execute(BIGGEST_JOB, {"start": SCALE.start, "end": SCALE.end}).fetchall()
    finally:
        con.close()
    progress(f"the analytics week ({SCALE.gpus:,} GPUs): job {job}'s breakdown, then the window's (3 runs)")
    out = subprocess.run([sys.executable, "-c", MEASURE_WEEK, str(store), SCALE.start.isoformat(), SCALE.end.isoformat(), job],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    t = Table(f"job states on the analytics bench's week: {SCALE.describe()}")
    m = got["job"]
    t.add(f"job {job}, the most GPU-hours in the window ({m['gpus']} GPUs, {m['data_h']:.0f} GPU-h with data): its breakdown, "
          "first in the process", f"{m['wall_s']:.2f} s (CPU {m['cpu_s']:.2f} s)", "<= 0.5 s", m["wall_s"] <= 0.5)
    t.add(f"Analysis of the week and its totals ({got['jobs_n']:,} jobs with time in it)", f"{got['analysis_s']:.2f} s")
    goal = WEEK_GOALS.get(SCALE.gpus)
    t.add("window_states after them: every job's and team's breakdown (median of 3)", f"{got['states_s']:.2f} s",
          f"<= {goal:g} s" if goal else "", got["states_s"] <= goal if goal else None)
    t.add("peak RSS", f"{got['rss_mib']:.0f} MiB")
    if goal is None:
        t.notes.append(f"#55 names goals for the window's breakdown at {', '.join(f'{g:,}' for g in WEEK_GOALS)} GPUs; "
                       "set GPUFLEET_BENCH_GPUS and GPUFLEET_BENCH_JOBS for those")
    return t


def with_facts(root: Path) -> None:
    """The store's facts, as the collector's upkeep builds them, for every closed hour."""
    from gpufleet.collector.maintenance import compact
    from gpufleet.collector.store import StoreWriter

    w = StoreWriter(root)
    try:
        compact(w, START + 2 * DAY, facts_hours=None)
        w.publish()
    finally:
        w.close()


def window_table(sizes: list[int], cache: Path) -> Table:
    t = Table("job states: the window's breakdown per job and team from facts (window_states; a day of 15 s samples), by fleet size")
    for gpus in sizes:
        root = cache / f"facts-{gpus}-{len(_jobs(gpus))}"
        if not (root / "manifest.json").exists():
            progress(f"generating a day of {gpus} GPUs with facts under {root}")
            started = time.monotonic()
            generate(root, gpus)
            with_facts(root)
            progress(f"generated in {time.monotonic() - started:.0f} s")
        args = [str(root), START.isoformat(), (START + DAY).isoformat(), *_jobs(gpus)]
        before = before_checkout()
        old = None
        if before is not None:  # the code before first, in its own checkout (bench._common.in_checkout), then this code
            r = subprocess.run([sys.executable, "-c", in_checkout(MEASURE_WINDOW, before), *args], capture_output=True, text=True, cwd=before)
            old = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
            if old is None:
                t.add(f"{gpus:,} GPUs: the code before ({before})", f"did not run this measure: {(r.stderr.strip().splitlines() or ['?'])[-1][:200]}")
        out = subprocess.run([sys.executable, "-c", MEASURE_WINDOW, *args], capture_output=True, text=True, check=True, cwd=ROOT)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        t.add(f"{gpus:,} GPUs, {got['jobs_n']:,} jobs: Analysis of the day (its parts: {got['tiles']})", f"{got['analysis_s']:.2f} s")
        t.add(f"{gpus:,} GPUs: window_states on it (median of 3; beside it the idle figure's stretches, the same chaining pass)",
              f"{got['states_s']:.2f} s (idle stretches {got['idle_s']:.2f} s)")
        if old is not None:
            t.add(f"{gpus:,} GPUs: the code before ({before}): Analysis / window_states; this code's / before's",
                  f"{old['analysis_s']:.2f} s / {old['states_s']:.2f} s; x{got['analysis_s'] / old['analysis_s']:.2f} / x{got['states_s'] / old['states_s']:.2f}")
        t.add(f"{gpus:,} GPUs: peak RSS", f"{got['rss_mib']:.0f} MiB")
        for job, m in got["jobs"].items():
            share = lambda d: ", ".join(f"{k} {v:.1%}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
            t.add(f"{gpus:,} GPUs: {job} per job / from facts", f"{share(m['job'])} / {share(m['window'])}")
    return t


def run() -> list[Table]:
    sizes = [int(s) for s in os.environ.get("GPUFLEET_BENCH_STATES_GPUS", "256,1024").split(",") if s.strip()]
    cache = Path(os.environ.get("GPUFLEET_BENCH_CACHE") or ROOT / "bench" / "results" / "states")
    t = Table("job states: one job's breakdown of its GPU time (a day of 15 s samples), by fleet size")
    for gpus in sizes:
        root = cache / f"store-{gpus}-{len(_jobs(gpus))}"  # (a store written before a job was added lacks it)
        if not (root / "manifest.json").exists():
            progress(f"generating a day of {gpus} GPUs under {root}")
            started = time.monotonic()
            generate(root, gpus)
            progress(f"generated in {time.monotonic() - started:.0f} s")
        out = subprocess.run([sys.executable, "-c", MEASURE, str(root), START.isoformat(), (START + DAY).isoformat(), *_jobs(gpus)],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        for job, m in got["jobs"].items():
            t.add(f"{gpus:,}-GPU fleet: {m['gpus']}-GPU job ({m['data_h']:.0f} GPU-h with data)", f"{m['wall_s']:.2f} s (CPU {m['cpu_s']:.2f} s)", "<= 0.5 s",
                  m["wall_s"] <= 0.5)
        t.add(f"{gpus:,}-GPU fleet: peak RSS", f"{got['rss_mib']:.0f} MiB")
    window = [int(s) for s in os.environ.get("GPUFLEET_BENCH_STATES_WINDOW_GPUS", "256,1024").split(",") if s.strip()]
    tables = [t] if sizes else []  # (a table left out where its knob is empty, not printed empty)
    if window:
        tables.append(window_table(window, cache))
    if os.environ.get("GPUFLEET_BENCH_STATES_WEEK", "1") != "0":
        tables.append(week_table())
    if not tables:
        raise SystemExit("bench states: nothing to measure (GPUFLEET_BENCH_STATES_GPUS and _WINDOW_GPUS empty, _WEEK=0)")
    return tables
