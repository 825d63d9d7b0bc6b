"""Facts: build time per settled hour, and a week's totals from facts vs the current path, side by side.

The cached synthetic week of bench/analytics.py (GPUFLEET_BENCH_GPUS, _DAYS, _JOBS; the same
cache, default 1,024 GPUs) is copied (sample files hard-linked) and its facts written by the
product's upkeep (gpufleet.collector.maintenance.build_facts: every settled hour's 5-minute facts, every
closed day's hour and day facts). Then the week's totals are computed three ways in this
process: from the facts (analytics.facts.FactWindow), by the current path (core.Analysis over
the facts) and by the raw oracle (tests/support/raw_analysis.py RawAnalysis), with whether their
figures agree to 1e-9. Wall and CPU time of this process; peak memory per path and the 16,384 and
100,000-GPU figures are for later (a process per path, as bench/analytics.py measures).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench._analytics_data import ensure_store
from bench._common import Table, progress
from bench.analytics import CACHE, SCALE
from bench.rebuild import _copy

FIGURES = ("capacity_gpu_h", "data_gpu_h", "no_data_gpu_h", "busy_gpu_h", "allocated_gpu_h", "idle_allocated_gpu_h",
           "no_process_gpu_h", "stranded_gpu_h")


def _timed(f):
    w0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - w0, time.process_time() - c0


def run() -> list[Table]:
    from gpufleet.analytics.core import Analysis
    from gpufleet.analytics.facts import FactWindow
    from gpufleet.analytics.mfu import job_mfu
    from gpufleet.analytics.params import Params
    from gpufleet.collector import facts as cf
    from gpufleet.collector.maintenance import build_facts
    from gpufleet.collector.store import StoreWriter, open_reader
    from gpufleet.times import epoch_us
    from tests.support.raw_analysis import RawAnalysis

    store, _ = ensure_store(SCALE, CACHE, progress)
    t = Table(f"facts: build per settled hour, and the week's totals from facts vs the current path, {SCALE.describe()}")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-facts-", dir=CACHE) as d:
        root = _copy(store, Path(d) / "store")
        w = StoreWriter(root)
        progress("writing the week's facts (upkeep)")
        # (force: the copied cache may hold current facts already, written by another bench)
        built, wall, cpu = _timed(lambda: build_facts(w, epoch_us(SCALE.now), cf.FactParams(), force=True))
        w.publish()
        again, wall2, _ = _timed(lambda: build_facts(w, epoch_us(SCALE.now), cf.FactParams()))
        w.close()
        hours = max(1, built["hours"])
        t.add("facts upkeep: wall / CPU", f"{wall:.1f} s / {cpu:.1f} s ({built['hours']} hours, {built['days']} days written)")
        t.add("    per settled hour (with its day's share)", f"{wall / hours:.2f} s wall, {cpu / hours:.2f} s CPU")
        t.add("    second pass (nothing changed)", f"{wall2:.2f} s, {again['hours']} hours / {again['days']} days written",
              "0 written", again["hours"] == again["days"] == 0)
        # the files the manifest lists for these parameters: the copied cache also holds files of
        # other parameters and formats, which the store no longer reads
        manifest = json.loads((root / "manifest.json").read_text())
        listed = [e for e in manifest["facts"] if e["tag"] == cf.FactParams().tag()]
        bytes_5m = sum((root / e["file"]).stat().st_size for e in listed if e["grain"] == "5m")
        bytes_day = sum((root / e["file"]).stat().st_size for e in listed if e["grain"] == "day")
        bytes_raw = sum((root / f).stat().st_size for f in manifest["samples"])
        gpu_days = SCALE.gpus * SCALE.days
        t.add("bytes per GPU-day: raw samples / 5-minute / hour+day facts",
              f"{bytes_raw / gpu_days:,.0f} / {bytes_5m / gpu_days:,.0f} / {bytes_day / gpu_days:,.0f}")
        con = open_reader(root)
        p = Params(SCALE.start, SCALE.end)
        progress("the week's totals from facts")
        fw, f_wall, f_cpu = _timed(lambda: FactWindow(con, p, now=SCALE.now))
        facts_totals, t_wall, t_cpu = _timed(fw.totals)
        progress("the week's totals by the current path (core.Analysis)")
        cur, c_wall, c_cpu = _timed(lambda: asdict(Analysis(con, p, now=SCALE.now, timeline=True).totals()))
        progress("the week's totals by the raw oracle")
        raw, r_wall, r_cpu = _timed(lambda: asdict(RawAnalysis(con, p, now=SCALE.now).totals()))
        t.add("week's totals: facts / current path / raw oracle, wall",
              f"{f_wall + t_wall:.2f} s / {c_wall:.2f} s / {r_wall:.2f} s")
        t.add("    CPU", f"{f_cpu + t_cpu:.2f} s / {c_cpu:.2f} s / {r_cpu:.2f} s")
        t.add("    facts: parts read / raw-cut GPU time", f"tiles {fw.tiles}, raw {fw.raw_us / 3.6e9:.2f} h of window")
        health, h_wall, h_cpu = _timed(fw.health)
        tensor, m_wall, m_cpu = _timed(lambda: job_mfu(Analysis(con, p, now=SCALE.now)))
        t.add("week's health per GPU / MFU per job (an analysis and mfu.job_mfu) from facts, wall (CPU)",
              f"{h_wall:.2f} s ({h_cpu:.2f} s), {health.height:,} GPUs / {m_wall:.2f} s ({m_cpu:.2f} s), {tensor.height:,} jobs")
        off = [k for k in FIGURES if abs((facts_totals[k] or 0) - (raw[k] or 0)) > 1e-9 * max(1.0, abs(raw[k] or 0))]
        t.add("facts' totals equal the raw oracle's (1e-9)", "yes" if not off else f"no: {', '.join(off)}", "yes", not off)
        for k in FIGURES:
            t.add(f"    {k}", f"{facts_totals[k]:,.6f} / {cur[k]:,.6f} / {raw[k]:,.6f}")
        con.close()
    t.notes.append("one process, this machine's load included; 16,384 and 100,000-GPU fleets and peak memory per path: a later step")
    return [t]
