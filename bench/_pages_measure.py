"""The Health and Fleet now pages' queries over a bench store, one in its own process (its own peak RSS).

    python -m bench._pages_measure STORE START END WHAT OUT

WHAT: health (gpufleet.analytics.health.window_health, with the temperature map in the Health
page's buckets, from the store's facts), health-raw (the same
from every raw sample: the oracle), fleet-now (gpufleet.analytics.fleet_now.gpu_states at END,
from the store's facts and the newest minutes' raw samples). The answers go to OUT (Parquet, one file per frame) for the caller to compare; stdout gets one line, RESULT and a JSON document: wall and CPU
seconds, VmHWM and the answers' rows.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from datetime import datetime
from pathlib import Path

from bench._analytics_measure import kib
from gpufleet.analytics import fleet_now, health
from gpufleet.analytics.params import Params
from gpufleet.times import default_bucket
from gpufleet.collector.store import open_reader
from tests.support.raw_health import raw_health

WHATS = ("health", "health-raw", "fleet-now")


def main() -> None:
    store, start, end, what, out = sys.argv[1:6]
    if what not in WHATS:
        raise SystemExit(f"what to measure {what!r}: expected one of {', '.join(WHATS)}")
    start_t, end_t = datetime.fromisoformat(start), datetime.fromisoformat(end)
    t0, c0 = time.perf_counter(), time.process_time()
    con = open_reader(store)
    p = Params(start_t, end_t)
    if what == "fleet-now":
        frames = {"states": fleet_now.gpu_states(con, p, end_t)}
    else:
        bucket = default_bucket(end_t - start_t)
        frames = (health.window_health(con, p, temperature=bucket) if what == "health"
                  else raw_health(con, p, ("gpus", "events", "temperature"), bucket))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for name, df in frames.items():
        df.write_parquet(Path(out) / f"{name}.parquet")
    print("RESULT " + json.dumps({"wall_s": wall, "cpu_s": cpu, "vmhwm_kib": kib("VmHWM"),
                                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                  "rows": {name: df.height for name, df in frames.items()}}), flush=True)


if __name__ == "__main__":
    main()
