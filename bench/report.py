"""Weekly report: `gpufleet report` (HTML and text, no PDF) of the analytics bench's synthetic week.

The cached synthetic fleet of bench/analytics.py (GPUFLEET_BENCH_GPUS, _DAYS, _JOBS; the same
cache, default 1,024 GPUs, a week) with its facts built by the product's upkeep, as the collector
leaves a store. `gpufleet report --from --to --no-pdf` of its last 7 days runs in a process of its
own, three times: the week from midnight to midnight, the same week moved 10 h 47 min 13 s earlier
(as `--last 7d` gives: the window and its days start off the local midnights, the first and last
day clipped), and the first week with TEAMS teams' own reports too (`--team`, as for
[report.team_recipients]: each team's rows of the fleet's figures). Wall time with the process' start-up, CPU time and peak RSS are the command's own.
The report reads the week and the week before it (empty unless GPUFLEET_BENCH_DAYS >= 14).

Goal (issue #52): the 100,000-GPU week's report, two weeks read, <= 30 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench._analytics_data import ensure_facts, ensure_store
from bench._common import ROOT, Table, progress
from bench.analytics import CACHE, SCALE

# the week's report of 100,000 GPUs (a fleet past 16,384, up to it) in 30 s (issue #52); smaller fleets: none named
GOAL_S = 30.0 if 16_384 < SCALE.gpus <= 100_000 else None
OFF_MIDNIGHT = timedelta(hours=10, minutes=47, seconds=13)
TEAMS = tuple(f"acct-{i:02d}" for i in range(8))  # the bench's eight busiest accounts (bench._analytics_data)


def measure(store: Path, start, end, teams: tuple[str, ...] = ()) -> dict:
    """One `gpufleet report` (and `teams`' own) in a process of its own: wall, CPU (user + system) and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-report-") as out:
        argv = [sys.executable, "-m", "gpufleet.cli", "report", "--store", str(store), "--from", start.isoformat(),
                "--to", end.isoformat(), "--no-pdf", "--quiet", "--out", out, "--log-level", "WARNING", *(a for t in teams for a in ("--team", t))]
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        err = proc.stderr.read() if proc.stderr else ""
        if status != 0:
            raise RuntimeError(f"gpufleet report exited with status {status}: {err.strip()[-2000:]}")
        files = sorted(p.name for p in Path(out).iterdir())
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_gib": usage.ru_maxrss / 2**20, "files": files}


def run() -> list[Table]:
    store, _ = ensure_store(SCALE, CACHE, progress)
    ensure_facts(SCALE, store, progress)
    end = SCALE.end
    start = end - timedelta(days=7)
    goal = GOAL_S
    t = Table(f"report: `gpufleet report --no-pdf` of the last 7 days, {SCALE.describe()}")
    for label, (a, b), teams in (("the week, midnight to midnight", (start, end), ()),
                                 ("the week off the midnights (as --last 7d)", (start - OFF_MIDNIGHT, end - OFF_MIDNIGHT), ()),
                                 (f"the week and {len(TEAMS)} teams' own reports", (start, end), TEAMS)):
        progress(f"report: {label}")
        m = measure(store, a, b, teams)
        t.add(f"{label}: wall (with start-up) / CPU", f"{m['wall_s']:.2f} s / {m['cpu_s']:.2f} s",
              f"<= {goal:g} s" if goal else "", m["wall_s"] <= goal if goal else None)
        t.add(f"{label}: peak RSS", f"{m['rss_gib']:.2f} GiB")
    files = m["files"]
    t.notes.append(f"files written by the last: {', '.join(files[:4])}" + (f" and {len(files) - 4} more" if len(files) > 4 else ""))
    t.notes.append("the week before the window is read too (the report's comparison): empty unless GPUFLEET_BENCH_DAYS >= 14")
    return [t]
