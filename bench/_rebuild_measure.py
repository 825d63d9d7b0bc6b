"""The measured part of bench/rebuild.py, in its own process so its peak RSS is its own.

    python -m bench._rebuild_measure STORE NOW THRESHOLD [--scheduler tcp://...] [--shards N] [--facts]

Rebuilds every summary of STORE for the idle THRESHOLD (gpufleet.collector.maintenance.summarize,
as `gpufleet collect --rebuild-summaries` does), their hours' joined segments (add_coarse), then their health summaries (summarize_health:
the rebuilt hours lost theirs), here or on the Dask scheduler. Prints one line, RESULT and a JSON
document: wall and CPU seconds of this process, its VmHWM, the hours built, and the health
summaries' wall seconds and hours. With --facts: the store's facts instead, every settled hour and
closed day (gpufleet.collector.maintenance.rebuild_facts, as `gpufleet collect --rebuild-facts`
does; THRESHOLD their idle threshold), the hours here or on the Dask scheduler.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from pathlib import Path

from gpufleet.collector.facts import FactParams
from gpufleet.collector.maintenance import add_coarse, rebuild_facts, summarize, summarize_health
from gpufleet.collector.store import StoreWriter
from gpufleet.collector.summaries import SummaryParams
from gpufleet.collector.tasks import TaskRunner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("now")
    p.add_argument("threshold", type=float)
    p.add_argument("--scheduler", default="")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--facts", action="store_true")
    a = p.parse_args()
    if a.facts:
        return facts(a)
    now = datetime.fromisoformat(a.now)
    t0, c0 = time.perf_counter(), time.process_time()
    w = StoreWriter(a.store, clock=lambda: now)
    try:
        tasks = TaskRunner(scheduler=a.scheduler, name="summaries")
        built = summarize(w, now, SummaryParams(idle_threshold=a.threshold), tasks, a.shards)
        coarse = add_coarse(w)  # the hours' joined segments, from their rows (here, as upkeep writes them)
        t1 = time.perf_counter()
        health = summarize_health(w, None, tasks)
        health_s = time.perf_counter() - t1
        w.publish()
    finally:
        w.close()
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    print("RESULT " + json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "vmhwm_kib": hwm, "built": built,
                                    "coarse": coarse, "health_s": health_s, "health": health}),
          flush=True)


def facts(a: argparse.Namespace) -> None:
    now = datetime.fromisoformat(a.now)
    t0, c0 = time.perf_counter(), time.process_time()
    w = StoreWriter(a.store, clock=lambda: now)
    try:
        built = rebuild_facts(w, now, FactParams(idle_threshold=a.threshold), tasks=TaskRunner(scheduler=a.scheduler, name="facts"))
    finally:
        w.close()
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    print("RESULT " + json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "vmhwm_kib": hwm, **built}), flush=True)


if __name__ == "__main__":
    main()
