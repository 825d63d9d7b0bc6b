"""`gpufleet policy --as-of T --format json`: one round of the idle-GPU policy on the analytics week.

The cached synthetic week of bench/analytics.py (GPUFLEET_BENCH_GPUS, _DAYS, _JOBS; its facts
built by the product's upkeep) at a moment inside it (GPUFLEET_BENCH_POLICY_AT hours before the
window's end, default 12): the command as the policy's service runs it each round, a dry run
(--as-of), in a process of its own per run (start-up and imports included): the plan over the
running jobs' GPUs, the efficiency notes of the jobs that ended in the round (GPUFLEET_BENCH_POLICY_
ACCOUNTS opted in, default acct-02; the round GPUFLEET_BENCH_POLICY_ROUND minutes, default 5) and
the drains. GPUFLEET_BENCH_ANALYZE_RUNS runs (default 3), the median shown. Issue #52's goal: a
round at 100,000 GPUs in 5 s. With GPUFLEET_BENCH_BEFORE=<a checkout of the code before> that code's round runs too,
alternating with this one's run by run, and the table gives both and their ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from datetime import timedelta
from pathlib import Path

from bench._common import BEFORE_ENV, GPUFLEET_COMMAND, Table, before_checkout, env_number, progress, run_python
from bench.analyze import RUNS, START_UP

AT_HOURS = env_number("GPUFLEET_BENCH_POLICY_AT", 12)
ROUND_MIN = env_number("GPUFLEET_BENCH_POLICY_ROUND", 5)
ACCOUNTS = [a for a in os.environ.get("GPUFLEET_BENCH_POLICY_ACCOUNTS", "acct-02").split(",") if a]


def run() -> list[Table]:
    from bench._analytics_data import ensure_facts, ensure_store
    from bench.analytics import CACHE, SCALE

    store, _ = ensure_store(SCALE, CACHE, progress)
    ensure_facts(SCALE, store, progress)
    at = SCALE.end - timedelta(hours=AT_HOURS)
    t = Table(f"policy: one round of `gpufleet policy --format json` (dry run), {SCALE.describe()}")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-policy-") as tmp:
        config = Path(tmp) / "gpufleet.toml"
        config.write_text(f"[policy]\nefficiency_note_accounts = {json.dumps(ACCOUNTS)}\n"
                          f'efficiency_note_lookback = "{ROUND_MIN:g}m"\n')
        args = ["policy", "--config", str(config), "--store", str(store), "--as-of", at.strftime("%Y-%m-%dT%H:%M:%SZ"), "--format", "json"]
        start_up = statistics.median(run_python(START_UP, [])[0] for _ in range(RUNS))
        before = before_checkout()
        progress(f"gpufleet policy at {at:%Y-%m-%d %H:%M}: {RUNS} runs" + ("" if before is None else " each, alternating with the code before"))
        runs, old = [], []
        for _ in range(RUNS):
            if before is not None:
                old.append(run_python(GPUFLEET_COMMAND, args, before))
            runs.append(run_python(GPUFLEET_COMMAND, args))
    wall, cpu, rss = (statistics.median(r[i] for r in runs) for i in range(3))
    doc = json.loads(runs[0][3])
    goal = SCALE.gpus >= 100_000
    t.add(f"start-up: the interpreter and the command's imports (median of {RUNS})", f"{start_up:.2f} s")
    t.add(f"a round at {at:%a %H:%M}: wall / CPU / peak RSS (median of {RUNS})", f"{wall:.2f} s / {cpu:.2f} s / {rss:.2f} GiB",
          "5 s at 100,000 GPUs (issue #52)" if goal else "", wall <= 5 if goal else None)
    if old:
        w0, c0, r0 = (statistics.median(r[i] for r in old) for i in range(3))
        t.add(f"  the code before ({before}): wall / CPU / peak RSS; this code's wall / before's",
              f"{w0:.2f} s / {c0:.2f} s / {r0:.2f} GiB; x{wall / w0:.2f}")
        t.notes += [f"{BEFORE_ENV}: the code before, run in the same way, alternating with this code's run by run"]
    t.add("the round's plan: actions / efficiency notes / drains",
          f"{len(doc.get('actions', []))} / {len(doc.get('efficiency_notes', []))} / {len(doc.get('drains', []))}")
    notes = len(doc.get("efficiency_notes", []))
    t.notes += [f"efficiency notes: the jobs of {', '.join(ACCOUNTS)} that ended in the {ROUND_MIN:g} minutes before the round "
                f"({notes}), their reports one analysis of the round's jobs (analytics/policy.py efficiency_notes)",
                "each run a process of its own, start-up and imports included; DuckDB and polars threads as the environment sets them"]
    return [t]
