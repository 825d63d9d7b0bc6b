"""The measured part of bench/analytics.py, run in its own process so its peak RSS is its own.

    python -m bench._analytics_measure STORE START END [--raw] [--user NAME [--held-only]] [--threads N] [--memory-limit X] [--profile DIR]

--raw: every sample read (tests/support/raw_analysis.py RawAnalysis, the oracle); else from the store's facts
(analytics/facts.py), raw samples only where a window edge cuts a bucket or a bucket has none.
--user NAME: one user's window as the dashboards compute it (a user filter, with per-job detail);
--held-only: (no longer an Analysis argument: a job filter is a WHERE clause on the facts' parts; kept for the bench's rows).

Prints one line, RESULT and a JSON document: per-step wall seconds, total wall and CPU seconds, VmHWM, and a few
figures of the analysis (a sanity check that it computed something real).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from datetime import datetime
from pathlib import Path

t_start = time.perf_counter()
c_start = time.process_time()

from gpufleet.analytics.core import Analysis  # noqa: E402 - import time is part of the measured run
from tests.support.raw_analysis import RawAnalysis  # noqa: E402
from gpufleet.analytics.params import Filters, Params  # noqa: E402
from gpufleet.collector.store import open_reader  # noqa: E402


def kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("start")
    p.add_argument("end")
    p.add_argument("--raw", action="store_true", help="the raw-sample path (no summaries)")
    p.add_argument("--user", default=None, help="a user's window (user filter, per-job detail), as the dashboards compute it")
    p.add_argument("--held-only", action="store_true", help="with --user: the GPUs that user's jobs held only")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--memory-limit", default="")
    p.add_argument("--temp-dir", default="", help="where DuckDB spills beyond the memory limit")
    p.add_argument("--profile", default="", help="write DuckDB query profiles (JSON) to this directory")
    a = p.parse_args()
    start, end = datetime.fromisoformat(a.start), datetime.fromisoformat(a.end)
    steps: dict[str, tuple[float, float]] = {}  # name -> (wall s, CPU s)
    t_imports = time.perf_counter() - t_start

    def step(name: str, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        steps[name] = (time.perf_counter() - t0, time.process_time() - c0)
        print(f"[measure] {name}: {steps[name][0]:.2f} s (CPU {steps[name][1]:.2f} s), VmRSS {kib('VmRSS') / 1024:.0f} MiB",
              file=sys.stderr, flush=True)
        return out

    t0 = time.perf_counter()
    con = step("open_reader", lambda: open_reader(a.store))
    if a.threads:
        con.execute(f"SET threads = {a.threads}")
    if a.memory_limit:
        con.execute(f"SET memory_limit = '{a.memory_limit}'")
    if a.temp_dir:
        con.execute(f"SET temp_directory = '{a.temp_dir}'")
    if a.profile:
        Path(a.profile).mkdir(parents=True, exist_ok=True)
        con.execute("SET enable_profiling = 'json'")
        con.execute(f"SET profiling_output = '{Path(a.profile) / 'last.json'}'")
    params = Params(start, end, filters=Filters(user_name=a.user))
    an = step("Analysis() (the window's parts, or every sample into GPU intervals; cap, ja)",
              lambda: RawAnalysis(con, params, now=end, detail=a.user is not None) if a.raw else Analysis(con, params, now=end, timeline=True))
    totals = step("totals()", an.totals)
    util = {}
    for by in ("fleet", "host", "account", "user_name"):
        util[by] = step(f"utilization({by!r})", lambda by=by: an.utilization(by))
    top = step("top_wasteful_jobs()", an.top_wasteful_jobs)
    per_gpu = step("per_gpu()", an.per_gpu)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # after the clock stops
    rows = {"al": an.q("SELECT count(*) AS n FROM al")["n"][0], "path": "raw" if a.raw else "facts"}
    if a.raw:  # (the oracle's arrays)
        rows.update(intervals=len(an.gt.t0), runs_idle=an.gt.runs("idle", an.p.idle_threshold, 0).height, line_gpus=an.gt.gpus.height)
    else:  # (the window's parts: how many, from which grains, how much of the window cut from raw samples)
        rows.update(parts=an.q("SELECT count(*) AS n FROM wpe")["n"][0], tiles={str(g): n for g, n in an.fw.tiles.items()},
                    raw_h=an.fw.raw_us / 3.6e9, line_gpus=an.q("SELECT count(*) AS n FROM wgpu")["n"][0])
    if util["fleet"].is_empty():  # a user filter matching no job of the window (GPUFLEET_BENCH_USERS at a small scale)
        raise SystemExit(f"{a.start} .. {a.end} of user {a.user!r} has no fleet row: nothing to measure; expected a user "
                         f"with jobs in the bench store {a.store} (set GPUFLEET_BENCH_USERS)")
    fleet = util["fleet"].row(0, named=True)
    print("RESULT " + json.dumps({
        "wall_s": wall,
        "wall_with_imports_s": time.perf_counter() - t_start,
        "imports_s": t_imports,
        "cpu_s": time.process_time() - c_start,
        "cpu_user_s": ru.ru_utime, "cpu_sys_s": ru.ru_stime,
        "vmhwm_kib": kib("VmHWM"), "maxrss_kib": ru.ru_maxrss,
        "steps": steps,
        "rows": rows,
        "threads": con.execute("SELECT current_setting('threads')").fetchone()[0],
        "memory_limit": con.execute("SELECT current_setting('memory_limit')").fetchone()[0],
        "figures": {
            "capacity_gpu_h": totals.capacity_gpu_h, "data_gpu_h": totals.data_gpu_h, "no_data_gpu_h": totals.no_data_gpu_h,
            "busy_gpu_h": totals.busy_gpu_h, "utilization_pct": totals.utilization_pct, "allocated_gpu_h": totals.allocated_gpu_h,
            "idle_allocated_gpu_h": totals.idle_allocated_gpu_h, "idle_allocated_cost": totals.idle_allocated_cost,
            "no_process_gpu_h": totals.no_process_gpu_h, "stranded_gpu_h": totals.stranded_gpu_h,
            "fleet_utilization_pct": fleet["utilization_pct"],
            "hosts": util["host"].height, "accounts": util["account"].height, "users": util["user_name"].height,
            "gpus": per_gpu.height, "top_job": top.row(0, named=True)["job_id"] if top.height else None,
            "top_job_idle_gpu_h": top.row(0, named=True)["idle_gpu_h"] if top.height else None,
        },
    }), flush=True)


if __name__ == "__main__":
    main()
