"""Dashboards: time for each page to render over the 1,024-GPU week, first load and warm cache.

The store is the analytics benchmark's synthetic fleet (bench/_analytics_data.py: 1,024 H100s
sampled every 15 s for 7 days, 50,000 jobs), generated once and shared with bench/analytics.py.
Each page of dashboards/app.py is run by Streamlit's own script runner (streamlit.testing
AppTest: the router, the sidebar filters, the cached loaders, the page) in a process of its own,
with the window set to the whole week in the URL's query parameters, as a user would share it:

- server start: what a dashboard process pays once, at its first script runs, whatever the store
  (imports, Streamlit's and Altair's own set-up): every page visited once over a 16-GPU day,
  timed and shown on its own row, so that a first load below counts what grows with the data.
- first load: the pages visited once each in menu order, back to back, caches empty at the
  start. Each page computes the window's figures it shows (dashboards/data.py window_bundle:
  core.Analysis, as `gpufleet analyze`; PAGE_FIGURES); Waste adds the previous week's totals,
  Health its own queries, Jobs one job's report (the most wasteful job, by the job-id box:
  computed on the job's own run).
- warm: each page again, GPUFLEET_BENCH_DASH_RUNS times; the median counts. Goal: < 2 s.
Over the store's facts, built once by the product's upkeep (as bench/analytics.py builds them).
What is timed is the page's script run on the server (what grows with the data); the browser's
drawing of the elements is not (tests/test_dashboard_browser.py loads every page in Chromium).

Knobs (environment):
  GPUFLEET_BENCH_GPUS / _DAYS / _JOBS / _LIVE / _CACHE   the fleet, as bench/analytics.py (1024 / 7 / 50000 / 0;
                                   _LIVE=1: its last hour open, as the dashboards meet a store at "now")
  GPUFLEET_BENCH_DASH_DAYS=0       analyse only the last N days of the data (0: the whole window)
  GPUFLEET_BENCH_DASH_RUNS=5       warm runs per page
  GPUFLEET_BENCH_MEMORY_LIMIT=3GB  the dashboard's DuckDB memory_limit ([dashboard] memory_limit)
  GPUFLEET_BENCH_THREADS=0         the dashboard's DuckDB threads ([dashboard] threads; 0: all cores)
  GPUFLEET_BENCH_BEFORE=<checkout> the code before (a git worktree): its pages measured the same way in a process of its
                                   own, before this code's, and each first load's ratio shown beside
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench._common import BEFORE_ENV, ROOT, Table, before_checkout, env_number, in_checkout, progress

GOAL_S = 2.0
RUNS = max(1, int(env_number("GPUFLEET_BENCH_DASH_RUNS", 5)))
DASH_DAYS = int(env_number("GPUFLEET_BENCH_DASH_DAYS", 0))
MEMORY_LIMIT = os.environ.get("GPUFLEET_BENCH_MEMORY_LIMIT", "3GB")
THREADS = int(env_number("GPUFLEET_BENCH_THREADS", 0))
PAGES = (("fleet_now", "Fleet now"), ("utilization", "Utilization"), ("jobs", "Jobs"), ("teams", "Teams and fairness"),
         ("waste", "Waste and cost"), ("health", "Health"), ("mfu", "MFU"), ("reliability", "Reliability"))


def _vmhwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _app_test(store: str, start: str, end: str, config: str):
    from streamlit.testing.v1 import AppTest

    os.environ["GPUFLEET_DASHBOARD_STORE"] = store
    os.environ["GPUFLEET_CONFIG"] = config
    app = Path(importlib.import_module("gpufleet.dashboards").__file__).parent / "app.py"  # (the measured checkout's)
    at = AppTest.from_file(str(app), default_timeout=6 * 3600)
    at.query_params.update({"from": start, "to": end})
    return at


def measure(store: str, start: str, end: str, config: str, start_store: str, start_from: str, start_to: str) -> dict:
    """In the child: the server's start on a small store (start_store), then every page cold, then
    warm; one JSON object."""
    t0 = time.perf_counter()
    importlib.import_module("streamlit.testing.v1")
    import_s = time.perf_counter() - t0
    out: dict = {"import_s": import_s, "first": {}, "warm": {}, "problems": [], "job": None}
    t0 = time.perf_counter()
    warm_up = _app_test(start_store, start_from, start_to, config)
    for i, (page, _) in enumerate(PAGES):
        if i:
            warm_up.switch_page(f"views/{page}.py")
        warm_up.run()
        if warm_up.exception or warm_up.error:
            out["problems"].append(f"server start, {page}: " + "; ".join(str(e.value)[:200] for e in [*warm_up.exception, *warm_up.error]))
    out["start_s"] = time.perf_counter() - t0
    progress(f"  server start (every page once over {start_store}): {out['start_s']:.1f} s")
    at = _app_test(store, start, end, config)

    def visit(page: str) -> float:
        if page != "fleet_now" or out["first"]:
            at.switch_page(f"views/{page}.py")
        return _timed_run(at, page, out["problems"])

    for page, _ in PAGES:
        out["first"][page] = visit(page)
        progress(f"  first load: {page} {out['first'][page]:.1f} s, peak RSS so far {_vmhwm_mib():,.0f} MiB")
        if page == "jobs":  # a job's report too: the most wasteful job of the week
            jobs = at.container("jobs_list").dataframe
            if jobs:
                job = str(jobs[0].value["job_id"].iloc[0])
                out["job"] = job
                t = time.perf_counter()
                at.text_input(key="job").set_value(job).run()
                out["first"]["jobs+report"] = time.perf_counter() - t
                progress(f"  first load: job {job}'s report {out['first']['jobs+report']:.1f} s, peak RSS so far {_vmhwm_mib():,.0f} MiB")
    for page, _ in PAGES:
        runs = [visit(page) for _ in range(RUNS)]
        out["warm"][page] = runs
        progress(f"  warm: {page} median {statistics.median(runs):.3f} s")
    out["vmhwm_mib"] = _vmhwm_mib()
    return out


def _timed_run(at, page: str, problems: list[str]) -> float:
    """One script run of `page` (already switched to), timed; an error, exception or missing title noted in `problems`."""
    t = time.perf_counter()
    at.run()
    dt = time.perf_counter() - t
    if at.exception or at.error:
        problems.append(f"{page}: " + "; ".join(str(e.value)[:200] for e in [*at.exception, *at.error]))
    if not at.title:
        problems.append(f"{page}: no title rendered")
    return dt


# the child: measure() of this bench, over the gpufleet of the checkout measured (bench._common.in_checkout)
MEASURE = "import json, sys; from bench.dashboards import measure; print(json.dumps(measure(*sys.argv[1:])), flush=True)"


def _child(store: Path, start, end, tmp: str, start_store: Path, start_scale, checkout: Path | None = None) -> dict:
    """measure() in a process of its own (its peak RSS is its own), of this checkout's code or `checkout`'s."""
    cfg = Path(tmp) / "gpufleet.toml"
    cfg.write_text(f'[dashboard]\nmemory_limit = "{MEMORY_LIMIT}"\nthreads = {THREADS}\nrefresh_seconds = 0\n')
    progress(f"pages over {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M}, "
             f"in a child process (first load, then {RUNS} warm runs each)" + ("" if checkout is None else f", the code in {checkout}"))
    argv = [sys.executable, "-c", MEASURE if checkout is None else in_checkout(MEASURE, checkout), str(store), start.isoformat(),
            end.isoformat(), str(cfg), str(start_store), start_scale.start.isoformat(), start_scale.end.isoformat()]
    with tempfile.TemporaryFile("w+") as out, subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.PIPE, text=True) as proc:
        tail: list[str] = []
        for line in proc.stderr or ():  # each page's timing as it comes: a child killed for memory keeps them
            if line.startswith("[bench]"):
                sys.stderr.write(line)
            tail = (tail + [line.rstrip("\n")])[-30:]
        code = proc.wait()
        out.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"the measuring process failed (exit {code}" + (", killed for memory?" if code == -9 else "") + "):\n" + "\n".join(tail))
    return json.loads(lines[-1])


def run() -> list[Table]:
    from bench._analytics_data import Scale, ensure_facts, ensure_store
    from bench.analytics import CACHE as cache, SCALE as scale
    progress(f"store: {scale.describe()} (generated once under {cache})")
    t0 = time.monotonic()
    store, generated = ensure_store(scale, cache, progress)
    gen_s = time.monotonic() - t0
    build_s, built = ensure_facts(scale, store, progress)
    start_scale = Scale(16, 1, 200)  # the server's start (see the module's docstring)
    start_store, _ = ensure_store(start_scale, cache, progress)
    ensure_facts(start_scale, start_store, progress)
    start = scale.start if not DASH_DAYS else scale.end - timedelta(days=DASH_DAYS)
    end = scale.end
    before = before_checkout()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-dash-") as tmp:
        old = None if before is None else _child(store, start, end, tmp, start_store=start_store, start_scale=start_scale,
                                                 checkout=before)
        m = _child(store, start, end, tmp, start_store=start_store, start_scale=start_scale)

    days = (end - start).days
    t = Table(f"dashboards: page render, {scale.gpus:,} GPUs x {days} d window ({scale.describe()})")
    for page, title in PAGES:
        warm = statistics.median(m["warm"][page])
        label = f"{title} (list + job {m['job']}'s report)" if page == "jobs" and m.get("job") else title
        t.add(f"{label}: warm cache (median of {RUNS})", f"{warm:.3f} s", f"< {GOAL_S:g} s", warm < GOAL_S)
    t.add("server start: every page once over a 16-GPU day (imports, Streamlit's and Altair's set-up; once per process)",
          f"{m['start_s']:.1f} s")
    for page, title in PAGES:  # the goal (issue #16): every first load under 2 s too, at 16,384 GPUs
        first = m["first"][page]
        t.add(f"{title}: first load", f"{first:.1f} s" + _beside(old, "first", page, first), f"< {GOAL_S:g} s", first < GOAL_S)
        if page == "jobs" and "jobs+report" in m["first"]:
            report = m["first"]["jobs+report"]
            t.add(f"    + job {m['job']}'s report, first load", f"{report:.1f} s" + _beside(old, "first", "jobs+report", report),
                  f"< {GOAL_S:g} s", report < GOAL_S)
    t.add("peak RSS of the dashboard process (VmHWM)", f"{m['vmhwm_mib']:,.0f} MiB"
          + ("" if old is None else f"; the code before {old['vmhwm_mib']:,.0f} MiB"))
    problems = list(m["problems"]) + [f"the code before: {p}" for p in (old or {}).get("problems", [])]
    if problems:
        t.add("pages with an error or exception", "; ".join(problems)[:300], "none", False)
    t.notes += [
        "first load in menu order from empty caches, after the server's start, back to back: each page computes the "
        "window's figures it shows (dashboards/data.py window_bundle: core.Analysis, as `gpufleet analyze`; PAGE_FIGURES), "
        "the later pages none of the earlier ones' but the attempts' read; a job's report computes the job on its own run, its MFU too; Waste adds the previous "
        "window's totals; Fleet now computes the GPU states at the window's end, which Health reuses beside its own queries",
        "the synthetic store holds no data before its first day, so Waste's previous-window totals are cheap here; on a real "
        "store they are one more window analysis",
        f"a relative window is recomputed once per period (dashboards/data.py step_for: 30 min for 7 days), warm in between; "
        f"DuckDB memory_limit {MEMORY_LIMIT or 'default'}, threads {THREADS or 'all cores'}; "
        f"store {'generated now' if generated else 'reused'} ({gen_s:.0f} s); facts {'built now' if built else 'cached'} "
        f"({build_s:.0f} s, the product's upkeep)",
        "a job's report reads its run's samples raw either way (its GPU timeline needs them: GpuTime.bucket_detail), of the "
        "job's own GPUs only (a job filter with Analysis held_only)",
        "server-side script run via streamlit.testing AppTest (router + sidebar + page + cached loaders), not the browser's drawing",
    ]
    if old is not None:
        t.notes += [f"{BEFORE_ENV}={before}: the code before, measured the same way in a process of its own just before this "
                    "code's; beside each first load its figure and this code's / its (\"before\"), on the same store"]
    return [t]


def _beside(old: dict | None, kind: str, page: str, now: float) -> str:
    """`old`'s figure of `page` (the code before's measure()) and the ratio, for a row; nothing without one."""
    then = None if old is None else old[kind].get(page)
    return "" if then is None else f" (before {then:.1f} s, x{now / then:.2f})" if then > 0 else f" (before {then:.1f} s)"


if __name__ == "__main__":
    for table in run():
        print(table.render())
