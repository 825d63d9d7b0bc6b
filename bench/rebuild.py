"""Rebuild: a week's facts rebuilt from raw samples, in-process vs local Dask clusters of 1 and 2 workers.

The cached synthetic week of bench/analytics.py (GPUFLEET_BENCH_GPUS, _DAYS, _JOBS; the same
cache) is copied (sample files hard-linked) and each copy's facts rebuilt for another idle
threshold, as `gpufleet collect --rebuild-facts` does after the threshold changed: every settled
hour (a task an hour) and closed day, in-process (bench/_rebuild_measure.py) and on a `dask
scheduler` with one and with two `dask worker` processes (one thread each) on loopback. Prints
wall, CPU and peak RSS of the driver and of each worker, the speed-up, and whether every copy
holds the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from bench._analytics_data import ensure_store
from bench._common import Table, local_dask, measure_child, proc_cpu_seconds, proc_kib, progress
from bench.analytics import CACHE, SCALE

THRESHOLD = 7.5  # not the default 5 %: every hour is rebuilt


def _copy(store: Path, dst: Path) -> Path:
    """A copy to rebuild: immutable files hard-linked, the ledger and manifest copied."""
    dst.mkdir(parents=True)
    for top in ("samples", "tables", "facts"):
        if (store / top).exists():
            shutil.copytree(store / top, dst / top, copy_function=os.link)
    for f in ("state.duckdb", "manifest.json"):
        shutil.copy2(store / f, dst / f)
    return dst


def _measure(store: Path, scheduler: str = "") -> dict:
    argv = [str(store), SCALE.now.isoformat(), str(THRESHOLD)] + (["--scheduler", scheduler] if scheduler else [])
    return measure_child("bench._rebuild_measure", argv, timeout=7200)


def _dask_run(store: Path, tmp: Path, workers: int) -> tuple[dict, list[dict]]:
    with local_dask(tmp, workers) as (address, procs):
        cpu0 = [proc_cpu_seconds(p.pid) for p in procs]
        driver = _measure(store, address)
        workers = [{"vmhwm_kib": proc_kib(p.pid, "VmHWM"), "cpu_s": proc_cpu_seconds(p.pid) - c0} for p, c0 in zip(procs, cpu0)]
    return driver, workers


def _facts_bytes(root: Path) -> dict[str, bytes]:
    return {e["file"]: (root / e["file"]).read_bytes() for e in json.loads((root / "manifest.json").read_text())["facts"]}


def run() -> list[Table]:
    """The store's facts rebuilt (`gpufleet collect --rebuild-facts`): in-process, then on Dask with 1 and with 2 workers."""
    store, _ = ensure_store(SCALE, CACHE, progress)
    t = Table(f"rebuild: the facts of every settled hour and closed day, in-process vs Dask with 1 and 2 workers, {SCALE.describe()}")
    gib = lambda kib: f"{kib / 1024 / 1024:.2f} GiB"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-rebuild-facts-", dir=CACHE) as d:
        tmp = Path(d)
        progress("rebuilding the facts in-process")
        local = _measure(_copy(store, tmp / "in-process"))
        runs = {}
        for n in (1, 2):
            progress(f"rebuilding the facts on a {n}-worker Dask cluster")
            (tmp / f"cluster-{n}").mkdir()
            runs[n] = _dask_run(_copy(store, tmp / f"dask-{n}"), tmp / f"cluster-{n}", n)
        same = all(_facts_bytes(tmp / "in-process") == _facts_bytes(tmp / f"dask-{n}") for n in runs)
    t.add("in-process: wall / CPU / peak RSS", f"{local['wall_s']:.1f} s / {local['cpu_s']:.1f} s / {gib(local['vmhwm_kib'])}  "
          f"({local['hours']} hours, {local['days']} days)")
    for n, (driver, workers) in runs.items():
        t.add(f"Dask, {n} worker{'s' if n > 1 else ''}: wall", f"{driver['wall_s']:.1f} s  ({local['wall_s'] / driver['wall_s']:.2f}x in-process)")
        t.add("    driver (the collector; it joins the days): CPU / peak RSS", f"{driver['cpu_s']:.1f} s / {gib(driver['vmhwm_kib'])}")
        for i, w in enumerate(workers):
            t.add(f"    worker {i + 1}: CPU / peak RSS", f"{w['cpu_s']:.1f} s / {gib(w['vmhwm_kib'])}")
    t.add("speed-up, 2 workers over 1", f"{runs[1][0]['wall_s'] / runs[2][0]['wall_s']:.2f}x")
    t.add("same facts files, byte for byte", "yes" if same else "NO", "yes", same)
    t.notes += [
        f"{os.cpu_count()} CPUs here, shared by the driver and the workers (each worker one thread): a task an hour, a day's hours "
        "at a time (each task carries its hour's allocations); the driver then joins each closed day's hour and day facts itself",
    ]
    return [t]
