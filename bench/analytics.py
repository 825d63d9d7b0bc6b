"""Analytics: a synthetic week of 1,024 GPUs and 50,000 jobs; the full weekly analysis, and the per-GPU weekly mean vs PromQL.

1. A synthetic fleet (bench/_analytics_data.py) written into a real store through StoreWriter:
   1,024 H100s (128 hosts x 8) sampled every 15 s for 7 days (~41M GPU-samples), 50,000 Slurm
   jobs with their GPU allocations, compacted as the collector's upkeep would. Generated
   once per scale and kept under GPUFLEET_BENCH_CACHE.
2. The full weekly analysis in a process of its own (bench/_analytics_measure.py), so its wall
   time, CPU time and peak RSS (VmHWM) are the analysis' own: open_reader, Analysis for the week,
   totals(), utilization by fleet / host / account / user_name, top_wasteful_jobs(), per_gpu().
   Then the week off the hour (35 min after its start to 20 min before its end, as a window typed
   or shared to the minute meets it: its timeline's edges inside hours too), with its raw oracle
   when that runs. (A dashboard's relative window of 24 h or more starts on the hour: its
   timeline's edges are hours, as in the week on the hour, and its end is the open hour's.)
   Then a user's week with per-job detail, as the dashboards' window computes it (the heaviest
   user and a typical one): every GPU's line, and only the GPUs the user's jobs held (held_only),
   side by side.
3. The Health page's GPU table and events (from the store's facts, and from raw samples
   as the oracle, compared) and Fleet now's states at the window end, each in its own process
   (bench/_pages_measure.py).
4. The per-GPU weekly mean of GPU utilization from Prometheus - the same samples loaded with
   `promtool tsdb create-blocks-from openmetrics`, `avg_over_time(DCGM_FI_DEV_GPU_UTIL[7d])` as an
   instant query at the window end - against ours on the same GPUs, over the raw samples. Both sides are warm; the median of GPUFLEET_BENCH_QUERY_RUNS runs counts.

Knobs (environment):
  GPUFLEET_BENCH_GPUS=1024         GPUs in the fleet (a multiple of 8: hosts of 8 GPUs)
  GPUFLEET_BENCH_DAYS=7            days of samples; the analysed window is all of them
  GPUFLEET_BENCH_JOBS=50000        jobs over the window
  GPUFLEET_BENCH_LIVE=0            1: a live store (a store of its own): "now" is the window's end, so its last hour is
                                   open as the collector leaves it - its samples in the files the rounds wrote, its
                                   facts up to the last settled hour, raw after that
  GPUFLEET_BENCH_PROM_GPUS=all     GPUs loaded into Prometheus: the whole fleet, or fewer (whole hosts
                                   spread over the fleet, the whole window) for a quicker first run;
                                   0 skips the comparison
  GPUFLEET_BENCH_QUERY_RUNS=5      timed runs of each per-GPU-mean query
  GPUFLEET_BENCH_MEMORY_LIMIT=3GB  DuckDB memory_limit in the analysis process ("" = DuckDB's default,
                                   80 % of RAM); beyond it DuckDB spills to a temp directory
  GPUFLEET_BENCH_THREADS=0         DuckDB threads in the analysis process (0 = DuckDB's default: all cores)
  GPUFLEET_BENCH_USERS=user-000,user-100   users whose week is measured as the dashboards' window
  GPUFLEET_BENCH_CACHE=bench/results/analytics   generated stores and Prometheus TSDBs, reused
  GPUFLEET_BENCH_RAW=auto          run the raw-sample oracle beside the facts path: 1, 0, or auto
                                   (only when its peak RSS, estimated at RAW_BYTES_PER_SAMPLE, fits in
                                   80 % of MemAvailable: at 16,384 GPUs it does not fit 24 GiB)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from bench._analytics_data import HOSTS_PER_GROUP, STEP, ensure_facts, ensure_store, host_name, scale_from_env
from bench._common import ROOT, Table, _children, _stop, env_number, free_port, measure_child, progress, raw_side_fits

SCALE = scale_from_env()
WINDOW_DAYS = SCALE.days
PROM_GPUS = int(env_number("GPUFLEET_BENCH_PROM_GPUS", SCALE.gpus))
RUNS = max(1, int(env_number("GPUFLEET_BENCH_QUERY_RUNS", 5)))
MEMORY_LIMIT = os.environ.get("GPUFLEET_BENCH_MEMORY_LIMIT", "3GB")
THREADS = int(env_number("GPUFLEET_BENCH_THREADS", 0))
RAW_BYTES_PER_SAMPLE = 47  # the raw path's peak RSS per sample: 7.23 GiB at 165.2M samples (4,096 GPUs, 7 d)
CACHE = Path(os.environ.get("GPUFLEET_BENCH_CACHE") or ROOT / "bench" / "results" / "analytics")

# The weekly analysis' figures to reach (issue #16, a 2-core machine): fleet size -> wall time (s)
# and peak RSS (GiB); a fleet between two sizes is held to the larger one's, past the last to none;
# a window of other than 7 days to none (they are a week's)
ISSUE_GOALS = ((1024, 1.0, 0.5), (4096, 3.0, 1.0), (16384, 10.0, 2.0), (100_000, 60.0, 6.0))
WALL_GOAL_S, RSS_GOAL_GIB = next(((w, r) for g, w, r in ISSUE_GOALS if SCALE.gpus <= g and WINDOW_DAYS == 7), (None, None))
# what the tables call the analysed window: the issue's figures are a week's
WINDOW = "week" if WINDOW_DAYS == 7 else f"{WINDOW_DAYS}-day window"
SCALE_IDLE_MIN = "30 min"  # gpufleet.analytics.params default idle_min_duration
METRIC = "DCGM_FI_DEV_GPU_UTIL"
EPOCH = datetime(1970, 1, 1)  # the store's times are naive UTC


# --- 2: the full weekly analysis ---


def measure_analysis(store: Path, raw: bool = False, user: str | None = None, held_only: bool = False,
                     edges: tuple[timedelta, timedelta] = (timedelta(0), timedelta(0))) -> dict:
    """One analysis in a process of its own (bench._analytics_measure); `edges`: the window's start
    that much after the data's, its end that much before."""
    argv = [str(store), (SCALE.start + edges[0]).isoformat(), (SCALE.end - edges[1]).isoformat()]
    if raw:
        argv.append("--raw")
    if user:
        argv += ["--user", user] + (["--held-only"] if held_only else [])
    if MEMORY_LIMIT:
        argv += ["--memory-limit", MEMORY_LIMIT]
    if THREADS:
        argv += ["--threads", str(THREADS)]
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-spill-") as spill:
        argv += ["--temp-dir", spill]
        load0 = os.getloadavg()[0]
        out = measure_child("bench._analytics_measure", argv, timeout=3600)
        load1 = os.getloadavg()[0]
    out["load"] = (load0, load1)
    return out


def paths_table(raw: dict, summ: dict, build_s: float, built: bool) -> Table:
    """The raw oracle and the facts path side by side, and whether their figures agree."""
    t = Table(f"analytics: the {WINDOW}'s analysis, raw samples (oracle) vs facts, {SCALE.describe()}")
    gib = lambda m: m["vmhwm_kib"] / 1024 / 1024  # noqa: E731
    t.add("wall time, open_reader .. per_gpu: raw / facts", f"{raw['wall_s']:.2f} s / {summ['wall_s']:.2f} s "
          f"({raw['wall_s'] / summ['wall_s']:.1f}x)")
    t.add("CPU time of the process: raw / facts", f"{raw['cpu_s']:.2f} s / {summ['cpu_s']:.2f} s")
    t.add("peak RSS (VmHWM): raw / facts", f"{gib(raw):.2f} GiB / {gib(summ):.2f} GiB")
    for name in raw["steps"]:
        if name in summ["steps"]:
            t.add(f"    {name}", f"{raw['steps'][name][0]:.2f} s / {summ['steps'][name][0]:.2f} s")
    _same_figures(t, raw, summ)
    t.notes.append(f"facts built by the product's upkeep (gpufleet.collector.maintenance.compact) over the cached store: {build_s:.0f} s "
                   f"({'in this run' if built else 'cached'})")
    return t


def _same_figures(t: Table, raw: dict, summ: dict) -> None:
    """A row: the largest relative difference between two runs' figures (an inexact one: inf)."""
    worst, which = 0.0, ""
    for k, v in raw["figures"].items():
        w = summ["figures"].get(k)
        if isinstance(v, float) and isinstance(w, float):
            rel = abs(v - w) / max(abs(v), 1e-300) if v else abs(w)
            if rel > worst:
                worst, which = rel, k
        elif v != w:
            worst, which = float("inf"), k
    t.add("same figures? largest relative difference (totals, rows, top job)", f"{worst:.1g}{f' ({which})' if which else ''}",
          "<= 1e-9", worst <= 1e-9)


def off_hour_table(store: Path, aligned: dict, run_raw: bool) -> Table:
    """The week as a window typed to the minute meets it: its edges inside an hour (HEALTH_EDGES,
    the 5-minute grain), so its timeline's bucket edges fall inside hours too and the reader tiles
    them with 5-minute facts and cuts the edge minutes raw - beside the week on the hour (the run
    above), and the raw oracle of the same window when it runs."""
    t = Table(f"analytics: the {WINDOW} off the hour (from {HEALTH_EDGES[0].seconds // 60} min after its start to "
              f"{HEALTH_EDGES[1].seconds // 60} min before its end, as a window typed to the minute), {SCALE.describe()}")
    progress(f"the {WINDOW} off the hour: " + ("the raw oracle, then " if run_raw else "") + "the facts path")
    raw = measure_analysis(store, raw=True, edges=HEALTH_EDGES) if run_raw else None
    m = measure_analysis(store, edges=HEALTH_EDGES)
    t.add("wall time, open_reader .. per_gpu: off the hour / on the hour", f"{m['wall_s']:.2f} s / {aligned['wall_s']:.2f} s")
    t.add("    CPU time / peak RSS (VmHWM), off the hour", f"{m['cpu_s']:.2f} s, {m['vmhwm_kib'] / 1024 / 1024:.2f} GiB")
    if raw:
        t.add("raw oracle of the window off the hour", f"{raw['wall_s']:.2f} s, {raw['vmhwm_kib'] / 1024 / 1024:.2f} GiB")
        _same_figures(t, raw, m)
    else:
        t.notes.append("raw oracle not run (GPUFLEET_BENCH_RAW)")
    t.notes.append("a window is tiled with the coarsest facts that fit (day, hour, 5 minutes); the minutes a window edge cuts out of "
                   "a 5-minute bucket are read raw")
    return t


def analysis_table(m: dict, store: Path, generated: bool, gen_s: float) -> Table:
    t = Table(f"analytics: full analysis of the {WINDOW} (facts), {SCALE.describe()}")
    wall, cpu, hwm = m["wall_s"], m["cpu_s"], m["vmhwm_kib"] / 1024 / 1024
    t.add("wall time: open_reader .. per_gpu (imports excluded)", f"{wall:.1f} s", *((f"<= {WALL_GOAL_S:g} s", wall <= WALL_GOAL_S)
                                                                                      if WALL_GOAL_S else ()))
    t.add("    CPU time of the process (user + sys)", f"{cpu:.1f} s  ({m['cpu_user_s']:.1f} user + {m['cpu_sys_s']:.1f} sys; {cpu / wall:.2f} cores busy on average)")
    t.add("    python imports before it (analytics, duckdb, polars)", f"{m['imports_s']:.2f} s")
    t.add("peak RSS of the analysis process (VmHWM)", f"{hwm:.2f} GiB", *((f"<= {RSS_GOAL_GIB:g} GiB", hwm <= RSS_GOAL_GIB)
                                                                         if RSS_GOAL_GIB else ()))
    for name, (wall_s, cpu_s) in m["steps"].items():
        t.add(f"    {name}", f"{wall_s:.2f} s (CPU {cpu_s:.2f} s)")
    f = m["figures"]
    money = lambda v: "unknown" if v is None else f"${v:,.0f}"  # noqa: E731
    t.add("figures: capacity / data / no data", f"{f['capacity_gpu_h']:,.0f} / {f['data_gpu_h']:,.0f} / {f['no_data_gpu_h']:,.0f} GPU-h")
    t.add("figures: fleet utilization / allocated (sacct)", f"{f['utilization_pct']:.1f} % / {f['allocated_gpu_h']:,.0f} GPU-h")
    t.add("figures: idle allocated / no process / stranded",
          f"{f['idle_allocated_gpu_h']:,.0f} GPU-h ({money(f['idle_allocated_cost'])}) / {f['no_process_gpu_h']:,.0f} / {f['stranded_gpu_h']:,.0f} GPU-h")
    t.add("figures: rows (GPUs / hosts / accounts / users)", f"{f['gpus']} / {f['hosts']} / {f['accounts']} / {f['users']}; "
          + (f"top wasteful job {f['top_job']} ({f['top_job_idle_gpu_h']:.0f} idle GPU-h)" if f['top_job_idle_gpu_h'] is not None
             else "no job left an idle stretch"))
    r = m["rows"]
    t.notes += [
        f"the analysis reads the window's facts once: {r['parts']:,} parts of {r['line_gpus']:,} GPUs (buckets by grain in seconds: "
        f"{r['tiles']}; {r['raw_h']:.2f} h of the window cut from raw samples) and {r['al']:,} job-GPU allocations; "
        "totals() computes per_gpu() and both kinds of idle stretches, which the later calls reuse",
        f"one process (python -m bench._analytics_measure), DuckDB threads = {m['threads']}, memory_limit = {m['memory_limit']} "
        f"(spills to a temp directory beyond it); machine: {os.cpu_count()} cores, load average {m['load'][0]:.1f} before / {m['load'][1]:.1f} after",
        "wall time is what a user waits on a shared machine; CPU time is the steadier figure when other work competes for the cores",
        f"store: {'generated in this run' if generated else 'reused'} ({gen_s:.0f} s), {store.relative_to(ROOT) if store.is_relative_to(ROOT) else store} "
        "(each hour's samples in one file, as the collector's compaction leaves them"
        f"{f'; the open last hour in the files its rounds wrote, one per {HOSTS_PER_GROUP} hosts' if SCALE.live else ''}); "
        "set GPUFLEET_BENCH_GPUS / _DAYS / _JOBS for another scale",
    ]
    return t


# --- 2b: a user's window, as the dashboards compute it ---

# the bench's heaviest user and one of the middle of the 240 (users are drawn with weights
# 1/(u+1)^0.8): the most GPUs held, and a typical footprint
USERS = [u for u in os.environ.get("GPUFLEET_BENCH_USERS", "user-000,user-100").split(",") if u]
TOTALS = ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_gpu_h", "idle_allocated_gpu_h",
          "no_process_gpu_h", "stranded_gpu_h")


def _relative(a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return abs(a - b) / abs(a) if a else abs(b)


def user_window_table(store: Path) -> Table:
    """A user's week with per-job detail (the dashboards' window under a user filter): every GPU's
    line read, then only the GPUs the user's jobs held (held_only), side by side in one run."""
    t = Table(f"analytics: a user's {WINDOW} (per-job detail, as the dashboards' window): every GPU's line / the GPUs its jobs held only, "
              f"{SCALE.describe()}")
    gib = lambda m: m["vmhwm_kib"] / 1024 / 1024  # noqa: E731
    for user in USERS:
        progress(f"a user's window ({user}): every GPU's line, then the GPUs its jobs held only")
        every = measure_analysis(store, user=user)
        held = measure_analysis(store, user=user, held_only=True)
        e, h = every["figures"], held["figures"]
        t.add(f"{user}: wall time, open_reader .. per_gpu", f"{every['wall_s']:.2f} s / {held['wall_s']:.2f} s "
              f"({every['wall_s'] / held['wall_s']:.1f}x)")
        t.add("    CPU time of the process", f"{every['cpu_s']:.2f} s / {held['cpu_s']:.2f} s")
        t.add("    peak RSS (VmHWM)", f"{gib(every):.2f} GiB / {gib(held):.2f} GiB")
        t.add("    GPUs in the line (variants read)", f"{every['rows']['line_gpus']:,} / {held['rows']['line_gpus']:,} "
              f"({h['allocated_gpu_h']:,.0f} allocated GPU-hours)")
        worst = max(_relative(e[k], h[k]) for k in TOTALS)
        t.add("    same totals? largest relative difference", f"{worst:.1g}", "<= 1e-9", worst <= 1e-9)
    t.notes.append("set GPUFLEET_BENCH_USERS (comma-separated) for other users")
    return t


# --- 3: the Health and Fleet now pages' queries ---

# a week on the dashboards' 5-minute grain: both edges inside a 5-minute bucket, so the minutes
# they cut are read raw and the rest from the facts (buckets without facts are cut raw too)
HEALTH_EDGES = (timedelta(minutes=35), timedelta(minutes=20))


def measure_page_query(store: Path, start: datetime, end: datetime, what: str, out: Path) -> dict:
    """One query of bench._pages_measure in its own process; its answers land in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    return measure_child("bench._pages_measure", [str(store), start.isoformat(), end.isoformat(), what, str(out)], timeout=3600)


def largest_difference(a: pl.DataFrame, b: pl.DataFrame) -> float:
    """Largest relative difference of two answers' float columns, row by row (both are sorted the
    same way); inf when their shape, columns or any other value differ."""
    if a.columns != b.columns or a.height != b.height:
        return float("inf")
    worst = 0.0
    for c in a.columns:
        x, y = a[c], b[c]
        if x.dtype.is_float():
            if not (x.is_null() == y.is_null()).all():
                return float("inf")
            d = ((x - y).abs() / x.abs().clip(lower_bound=1e-300)).fill_null(0.0).fill_nan(0.0)
            worst = max(worst, float(d.max() or 0.0))
        elif not x.equals(y):
            return float("inf")
    return worst


def pages_table(store: Path) -> Table:
    """The Health page's GPU table and events (from the facts vs raw) and Fleet now's states."""
    start, end = SCALE.start + HEALTH_EDGES[0], SCALE.end - HEALTH_EDGES[1]
    t = Table(f"analytics: the Health and Fleet now pages' queries, {SCALE.describe()}")
    gib = lambda m: m["vmhwm_kib"] / 1024 / 1024  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-pages-") as tmp:
        progress("the Health page's GPU table and events: from the facts, then from raw samples (the oracle)")
        summ = measure_page_query(store, start, end, "health", Path(tmp) / "health")
        raw = measure_page_query(store, start, end, "health-raw", Path(tmp) / "raw")
        t.add(f"Health: GPU table + events + temperature map (window_health), {start:%m-%d %H:%M} - {end:%m-%d %H:%M}: raw / facts",
              f"{raw['wall_s']:.2f} s / {summ['wall_s']:.2f} s ({raw['wall_s'] / summ['wall_s']:.1f}x)")
        t.add("    CPU time / peak RSS (VmHWM): raw; facts",
              f"{raw['cpu_s']:.1f} s, {gib(raw):.2f} GiB; {summ['cpu_s']:.1f} s, {gib(summ):.2f} GiB")
        worst = max(largest_difference(pl.read_parquet(Path(tmp) / "raw" / f.name), pl.read_parquet(f))
                    for f in sorted((Path(tmp) / "health").glob("*.parquet")))
        t.add(f"    same answers? largest relative difference ({summ['rows']['gpus']:,} GPU rows, {summ['rows']['events']:,} events)",
              f"{worst:.1g}", "<= 1e-9", worst <= 1e-9)
        progress("Fleet now's states 10 s before the store's end, from the facts and the newest minutes' raw samples")
        as_of = SCALE.end - timedelta(seconds=10)
        now = measure_page_query(store, start, as_of, "fleet-now", Path(tmp) / "now")
    t.add(f"Fleet now: every GPU's state at {as_of:%m-%d %H:%M:%S} (gpu_states, a look-back from the hour 6 h before, from facts)",
          f"{now['wall_s']:.2f} s, CPU {now['cpu_s']:.1f} s, peak RSS {gib(now):.2f} GiB ({now['rows']['states']:,} GPUs)")
    t.notes += [
        "each query in its own process (python -m bench._pages_measure), open_reader included; the health window's edges fall "
        f"inside an hour ({HEALTH_EDGES[0].seconds // 60} and {HEALTH_EDGES[1].seconds // 60} min), as the dashboards' 5-minute "
        "grain leaves them: the minutes they cut are read raw, the rest from the store's facts (a store without facts: every bucket "
        "cut raw by the facts' own rule)",
        "Fleet now reads its look-back (6 to 7 hours: it starts on the hour) from the store's facts (their parts' run marks) "
        "and only its newest minutes raw (at least stale_after, from a 5-minute edge); the dashboards ask it again every 10 s",
        "the bench fleet reports no temperatures, XIDs or ECC errors (hence no events): real data also pays for reading those columns",
    ]
    return t


# --- 4: per-GPU weekly mean, Prometheus vs ours ---


def prom_hosts() -> list[int]:
    """Whole hosts spread over the fleet: every pool (host % 8) and every sample file is represented."""
    n = min(SCALE.hosts, max(1, PROM_GPUS // 8))
    if n >= SCALE.hosts:
        return list(range(SCALE.hosts))
    stride = SCALE.hosts / n
    m = max(1, min(8, int(stride)))
    return [int(i * stride) + i % m for i in range(n)]


def _openmetrics(df: pl.DataFrame) -> pl.DataFrame:
    return df.select(pl.format(
        METRIC + '{{gpu="{}",UUID="{}",device="nvidia{}",modelName="{}",Hostname="{}",instance="{}:9400",job="dcgm"}} {} {}.{}',
        "gpu", "gpu_uuid", "gpu", "model", "host", "host", "v", pl.col("ms") // 1000, (pl.col("ms") % 1000).cast(pl.String).str.zfill(3),
    ))


def build_tsdb(store: Path, hosts: list[int], root: Path) -> None:
    """The same samples as OpenMetrics, one file per 2 h block (promtool reads its whole input once per block)."""
    from gpufleet.collector.store import open_reader

    promtool = shutil.which("promtool")
    if not promtool:
        raise FileNotFoundError("promtool")
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    con = open_reader(store)
    names = [host_name(h) for h in hosts]
    om = tmp / "window.om"
    for day in range(SCALE.days):
        d0 = SCALE.start + timedelta(days=day)
        df = pl.from_arrow(con.sql(
            "SELECT host, gpu, gpu_uuid, model, epoch_ms(ts) AS ms, gpu_util AS v FROM gpu_samples "
            "WHERE ts >= $d0 AND ts < $d1 AND host IN (SELECT unnest($hosts::VARCHAR[])) AND gpu_util IS NOT NULL ORDER BY host, gpu, ts",
            params={"d0": d0, "d1": d0 + timedelta(days=1), "hosts": names}).to_arrow_table())
        start_ms = int((d0 - EPOCH).total_seconds() * 1000)
        for w in range(12):
            part = df.filter((pl.col("ms") >= start_ms + w * 7_200_000) & (pl.col("ms") < start_ms + (w + 1) * 7_200_000))
            if part.is_empty():
                continue
            with open(om, "w") as f:
                f.write(f"# TYPE {METRIC} gauge\n")
                _openmetrics(part).write_csv(f, include_header=False, quote_style="never")
                f.write("# EOF\n")
            r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(om), str(tmp / "data")],
                               capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise RuntimeError(f"promtool failed on {d0:%Y-%m-%d} window {w}: {r.stderr[-2000:]}")
        progress(f"  TSDB: day {day + 1}/{SCALE.days} loaded")
    om.unlink(missing_ok=True)
    # let Prometheus compact the 2 h blocks as it would a week it had scraped, so the timed
    # queries read compacted blocks and no compaction runs while they are timed
    with Prometheus(tmp / "data", tmp) as p:
        before = p.blocks()
        p.wait_compacted(before)
        progress(f"  TSDB: {before} blocks compacted into {p.blocks()}")
    tmp.rename(root)


class Prometheus:
    """A Prometheus of our own on 127.0.0.1 over a TSDB directory, no scrape jobs."""

    def __init__(self, data: Path, workdir: Path):
        self.data, self.workdir = data, workdir
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Prometheus:
        exe = shutil.which("prometheus")
        if not exe:
            raise FileNotFoundError("prometheus")
        port = free_port()
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1h\n")
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(self.workdir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [exe, f"--config.file={cfg}", f"--storage.tsdb.path={self.data}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=10y", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        _children.append(self.proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"prometheus did not get ready; see {self.workdir / 'prometheus.log'}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _stop(self.proc)
            if self.proc in _children:
                _children.remove(self.proc)
            self.proc = None
        self.log.close()

    def blocks(self) -> int:
        return sum(1 for d in self.data.iterdir() if (d / "meta.json").exists())

    def wait_compacted(self, before: int, timeout: float = 600) -> None:
        """Prometheus compacts a minute after start; wait until the block count has dropped and settled."""
        t0 = time.monotonic()
        last, since = self.blocks(), time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(2)
            n = self.blocks()
            if n != last:
                last, since = n, time.monotonic()
            elif (n < before or time.monotonic() - t0 > 150) and time.monotonic() - since > 20:
                return

    def query(self, promql: str, at: float) -> tuple[float, dict]:
        """Client-side wall seconds of one instant query (HTTP + JSON), and the response document."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}", "stats": "all"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=300) as r:
            doc = json.loads(r.read())
        dt = time.perf_counter() - t0
        if doc.get("status") != "success":
            raise RuntimeError(f"{promql}: {doc}")
        return dt, doc


# per GPU (a UUID names one GPU fleet-wide; gpu_instance separates MIG instances)
RAW_MEAN = """
SELECT any_value(cluster) AS cluster, any_value(host) AS host, gpu_uuid, gpu_instance, avg(gpu_util) AS mean_util
FROM gpu_samples
WHERE ts >= $start AND ts < $end {hosts}
GROUP BY gpu_uuid, gpu_instance
"""
def compare_prometheus(store: Path) -> Table:
    from gpufleet.collector.store import open_reader

    hosts = prom_hosts()
    gpus = len(hosts) * 8
    samples = gpus * SCALE.seconds // STEP
    t = Table(f"analytics: per-GPU mean utilization over {SCALE.days} d, {gpus} GPUs ({samples / 1e6:.1f}M samples): PromQL vs gpufleet")
    if PROM_GPUS <= 0:
        t.notes.append("skipped: GPUFLEET_BENCH_PROM_GPUS=0")
        return t
    if SCALE.live:
        t.notes.append("skipped: a live store (GPUFLEET_BENCH_LIVE=1); compared on the closed store")
        return t
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        t.add("Prometheus comparison", "not run: prometheus/promtool not installed (apt-get install prometheus)")
        return t
    root = CACHE / f"prom-{SCALE.key}-{len(hosts)}hosts"
    built = 0.0
    if not (root / "data").exists():
        progress(f"building a Prometheus TSDB of {gpus} GPUs x {SCALE.days} d with promtool (once; kept in {root})")
        t0 = time.monotonic()
        build_tsdb(store, hosts, root)
        built = time.monotonic() - t0

    names = [host_name(h) for h in hosts]
    promql = f"avg_over_time({METRIC}[{SCALE.days}d])"
    at = (SCALE.end - EPOCH).total_seconds() - 1  # range [start - 1 s, end - 1 s]: the window's samples
    con = open_reader(store)
    con.execute("SET enable_progress_bar = false")
    subset = len(hosts) < SCALE.hosts
    bind = {"start": SCALE.start, "end": SCALE.end} | ({"hosts": names} if subset else {})
    where = "AND host IN (SELECT unnest($hosts::VARCHAR[]))" if subset else ""

    def ours(query: str) -> tuple[float, pl.DataFrame]:
        query = query.format(hosts=where)
        t0 = time.perf_counter()
        df = pl.from_arrow(con.sql(query, params=bind).to_arrow_table())
        return time.perf_counter() - t0, df

    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-prom-") as work, Prometheus(root / "data", Path(work)) as prom:
        blocks = prom.blocks()
        progress(f"per-GPU mean: PromQL vs DuckDB raw samples, {RUNS} runs each (after a warm-up)")
        _, doc = prom.query(promql, at)  # warm-up: pages the blocks in, as they would be on a Prometheus in use
        ours(RAW_MEAN)
        times: dict[str, list[float]] = {"prom": [], "prom_exec": [], "raw": []}
        for _ in range(RUNS):  # interleaved, so machine noise hits both alike
            dt, doc = prom.query(promql, at)
            times["prom"].append(dt)
            times["prom_exec"].append(doc["data"].get("stats", {}).get("timings", {}).get("execTotalTime", float("nan")))
            dt, raw = ours(RAW_MEAN)
            times["raw"].append(dt)
        loaded = doc["data"].get("stats", {}).get("samples", {}).get("totalQueryableSamples")

    med = {k: statistics.median(v) for k, v in times.items()}
    prom_means = {r["metric"]["UUID"]: float(r["value"][1]) for r in doc["data"]["result"]}
    diff = lambda df: max((abs(prom_means[u] - m) for u, m in zip(df["gpu_uuid"], df["mean_util"])), default=float("nan"))  # noqa: E731
    ms = lambda s: f"{s * 1000:.0f} ms" if s >= 0.1 else f"{s * 1000:.1f} ms"  # noqa: E731
    spread = lambda k: f"{ms(min(times[k]))} .. {ms(max(times[k]))}"  # noqa: E731
    t.add(f"Prometheus: {promql} @ window end", f"{ms(med['prom'])} (runs {spread('prom')}; server execTotalTime {ms(med['prom_exec'])})")
    t.add("gpufleet: raw samples, avg(gpu_util) per GPU (DuckDB)", f"{ms(med['raw'])} (runs {spread('raw')})")
    t.add("    speed-up over PromQL, raw samples (every sample read, as PromQL does)", f"{med['prom'] / med['raw']:.1f}x")
    t.add("same answer? GPUs answered; largest difference from PromQL",
          f"{len(prom_means)} PromQL, {raw.height} raw; {diff(raw):.1g} percentage points")
    t.notes += [
        f"Prometheus {_version('prometheus')}: TSDB from `promtool tsdb create-blocks-from openmetrics` (one file per 2 h block), "
        f"then compacted by Prometheus itself ({blocks} blocks{'; built in this run in %.0f s' % built if built else '; reused'}); "
        f"{loaded if loaded is not None else '?'} samples read by the query",
        f"times are client-side: HTTP request to parsed JSON for Prometheus, execute to Arrow to polars for DuckDB (a fresh open_reader "
        f"over the whole {SCALE.gpus}-GPU store{f', filtered to the same {len(hosts)} hosts' if subset else ''}); "
        f"median of {RUNS} interleaved warm runs",
        "the raw row reads every sample like PromQL does; the 5-minute rollups this table also timed (the goal of issue #16) were "
        "retired with issue #52: the store's one derived tier is the facts, whose per-GPU utilization is time-weighted (contract 4), "
        "not PromQL's mean of samples - bench/facts.py times the facts' figures against the raw path's",
    ]
    return t


def _version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout or ""
        return out.split()[2] if len(out.split()) > 2 else "?"
    except OSError:
        return "?"


def run() -> list[Table]:
    progress(f"scale: {SCALE.describe()}")
    t0 = time.monotonic()
    store, generated = ensure_store(SCALE, CACHE, progress)
    gen_s = time.monotonic() - t0
    progress(f"store {'generated' if generated else 'reused'}: {store} ({gen_s:.0f} s)")
    build_s, built = ensure_facts(SCALE, store, progress)
    run_raw, why = raw_side_fits("GPUFLEET_BENCH_RAW", SCALE.samples, RAW_BYTES_PER_SAMPLE)
    progress(f"full analysis of the {WINDOW} in its own process: {'the raw oracle, then ' if run_raw else ''}the facts path")
    m_raw = measure_analysis(store, raw=True) if run_raw else None
    m = measure_analysis(store)
    tables = [paths_table(m_raw, m, build_s, built)] if m_raw else []
    tables.append(analysis_table(m, store, generated, gen_s))
    if not run_raw:
        tables[-1].notes.append(f"raw oracle not run: {why}; facts built {'in this run' if built else 'earlier'} in {build_s:.0f} s "
                                "(the product's upkeep)")
    tables.append(off_hour_table(store, m, run_raw))
    tables.append(user_window_table(store))
    tables.append(pages_table(store))
    tables.append(compare_prometheus(store))
    return tables
