"""`gpufleet analyze --format json`: the command's wall time, CPU and peak memory on the analytics week.

The cached synthetic week of bench/analytics.py (GPUFLEET_BENCH_GPUS, _DAYS, _JOBS; default 1,024
GPUs, 50,000 jobs) with its facts built by the product's upkeep (bench._analytics_data.ensure_facts)
is analysed by the command itself, in a process of its own per run (start-up, imports and the
JSON's writing included), as a user runs it: the whole week, the week typed off the hour (its
edges inside hours), the week under a team filter, and the week in a store that also holds
GPUFLEET_BENCH_HISTORY_WEEKS earlier weeks of jobs and allocations (default 12; 0: not run): an
analysis' cost should grow with its window, not the store's history. GPUFLEET_BENCH_ANALYZE_RUNS
runs each (default 3), the median shown. Issue #52's goals (GOALS): 1,024 GPUs 0.5 s + start-up and 0.3 GiB,
16,384 GPUs 1.5 s and 1 GiB, 100,000 GPUs 5 s and 2 GiB.
With GPUFLEET_BENCH_BEFORE=<a checkout of the code before> each case runs that code too, alternating
with this one's run by run, and the table gives both and their ratio.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import timedelta

from bench._common import BEFORE_ENV, GPUFLEET_COMMAND, Table, before_checkout, env_number, progress, run_python

RUNS = max(1, int(env_number("GPUFLEET_BENCH_ANALYZE_RUNS", 3)))
HISTORY_WEEKS = int(env_number("GPUFLEET_BENCH_HISTORY_WEEKS", 12))
@dataclass(frozen=True)
class Goal:
    """Issue #52's goal for `gpufleet analyze` of a week at one fleet size: seconds (beyond start-up, or in all) and GiB."""

    seconds: float
    gib: float
    beyond_start_up: bool = False

    @property
    def text(self) -> str:
        return f"{self.seconds:g} s{' + start-up' if self.beyond_start_up else ''}, {self.gib:g} GiB (issue #52)"

    def met(self, wall: float, start_up: float, gib: float) -> bool:
        return wall - (start_up if self.beyond_start_up else 0.0) <= self.seconds and gib <= self.gib


GOALS = {1024: Goal(0.5, 0.3, beyond_start_up=True), 16384: Goal(1.5, 1.0), 100_000: Goal(5.0, 2.0)}  # GPUs -> goal
# the command's start-up: the interpreter and the modules an analysis imports, before it reads anything
START_UP = "import gpufleet.cli, gpufleet.analytics.cli, gpufleet.analytics.core, gpufleet.collector.store"


def run() -> list[Table]:
    from bench._analytics_data import ensure_facts, ensure_history, ensure_store
    from bench.analytics import CACHE, SCALE

    store, _ = ensure_store(SCALE, CACHE, progress)
    ensure_facts(SCALE, store, progress)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    week = ["--store", str(store), "--from", SCALE.start.strftime(fmt), "--to", SCALE.end.strftime(fmt)]
    typed = ["--store", str(store), "--from", (SCALE.start + timedelta(minutes=35)).strftime(fmt),
             "--to", (SCALE.end - timedelta(minutes=20)).strftime(fmt)]
    cases = [("the whole window", week), ("typed off the hour (+35 min, -20 min)", typed), ("the window, --team acct-02", [*week, "--team", "acct-02"])]
    if HISTORY_WEEKS > 0:  # the same window in a store that also holds earlier weeks' accounting: what history costs
        cases.append((f"the whole window, {HISTORY_WEEKS} earlier weeks of jobs in the store",
                      ["--store", str(ensure_history(store, HISTORY_WEEKS, progress)), *week[2:]]))
    t = Table(f"analyze: `gpufleet analyze --format json`, {SCALE.describe()}")
    start_up = statistics.median(run_python(START_UP, [])[0] for _ in range(RUNS))
    t.add(f"start-up: the interpreter and the command's imports (median of {RUNS})", f"{start_up:.2f} s")
    goal = GOALS.get(SCALE.gpus)
    before = before_checkout()
    for label, args in cases:
        progress(f"gpufleet analyze, {label}: {RUNS} runs" + ("" if before is None else " each, alternating with the code before"))
        command = ["analyze", *args, "--format", "json"]
        runs, old = [], []
        for _ in range(RUNS):
            if before is not None:
                old.append(run_python(GPUFLEET_COMMAND, command, before))
            runs.append(run_python(GPUFLEET_COMMAND, command))
        wall, cpu, rss = (statistics.median(r[i] for r in runs) for i in range(3))
        t.add(f"{label}: wall / CPU / peak RSS (median of {RUNS})", f"{wall:.2f} s / {cpu:.2f} s / {rss:.2f} GiB, {len(runs[0][3]) / 1e6:.1f} MB of JSON",
              goal.text if goal else "", goal.met(wall, start_up, rss) if goal else None)
        if old:
            w0, c0, r0 = (statistics.median(r[i] for r in old) for i in range(3))
            t.add(f"  the code before ({before}): wall / CPU / peak RSS; this code's wall / before's",
                  f"{w0:.2f} s / {c0:.2f} s / {r0:.2f} GiB; x{wall / w0:.2f}")
    if before is not None:
        t.notes += [f"{BEFORE_ENV}: the code before, run in the same way, alternating with this code's run by run"]
    t.notes += ["each run a process of its own (python -c gpufleet.cli main, as the console script), start-up, imports and the "
                "JSON's writing included; DuckDB and polars threads as the environment sets them (GPUFLEET_DUCKDB_THREADS)"]
    return [t]
