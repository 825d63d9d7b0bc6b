"""The measured part of bench/rebuild.py, in its own process so its peak RSS is its own.

    python -m bench._rebuild_measure STORE NOW THRESHOLD [--scheduler tcp://...]

Rebuilds the store's facts, every settled hour and closed day (gpufleet.collector.maintenance.rebuild_facts,
as `gpufleet collect --rebuild-facts` does; THRESHOLD their idle threshold), the hours here or on
the Dask scheduler. Prints one line, RESULT and a JSON document: wall and CPU seconds of this
process, its VmHWM, and the hours and days built.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from pathlib import Path

from gpufleet.collector.facts import FactParams
from gpufleet.collector.maintenance import rebuild_facts
from gpufleet.collector.store import StoreWriter
from gpufleet.collector.tasks import TaskRunner


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("now")
    p.add_argument("threshold", type=float)
    p.add_argument("--scheduler", default="")
    a = p.parse_args()
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
