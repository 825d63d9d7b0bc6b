"""Rebuild: a week's per-GPU summaries and health summaries rebuilt from raw samples, in-process vs a 2-worker local Dask cluster.

The cached synthetic week of bench/analytics.py (GPUFLEET_BENCH_GPUS, _DAYS, _JOBS; the same
cache) is copied twice (sample files hard-linked) and each copy's summaries rebuilt for another
idle threshold, as `gpufleet collect --rebuild-summaries` does after the threshold changed:
  - in-process: one process, one task per day (bench/_rebuild_measure.py);
  - Dask: a `dask scheduler` and two `dask worker` processes (one thread each) on loopback,
    tasks per (day, shard of the GPUs), the driver turning the parts into the hours' files;
then the hours' health summaries, a task an hour (here, or on the same cluster).
Prints wall, CPU and peak RSS of the driver and of each worker, and whether both copies hold the
same bytes. Then the facts (`gpufleet collect --rebuild-facts`): every settled hour and closed day
built in-process, and on Dask with 1 and with 2 workers (a task an hour), with the speed-up. Knobs: GPUFLEET_BENCH_REBUILD_SHARDS=2 (tasks per day on Dask).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from bench._analytics_data import ensure_store
from bench._common import Table, env_number, local_dask, measure_child, proc_cpu_seconds, proc_kib, progress
from bench.analytics import CACHE, SCALE

SHARDS = int(env_number("GPUFLEET_BENCH_REBUILD_SHARDS", 2))
WORKERS = 2
THRESHOLD = 7.5  # not the default 5 %: every hour is rebuilt


def _copy(store: Path, dst: Path) -> Path:
    """A copy to rebuild: immutable files hard-linked, the ledger and manifest copied."""
    dst.mkdir(parents=True)
    for top in ("samples", "tables", "summaries", "facts"):
        if (store / top).exists():
            shutil.copytree(store / top, dst / top, copy_function=os.link)
    for f in ("state.duckdb", "manifest.json"):
        shutil.copy2(store / f, dst / f)
    return dst


def _measure(store: Path, scheduler: str = "", facts: bool = False) -> dict:
    argv = [str(store), SCALE.now.isoformat(), str(THRESHOLD)] + (["--facts"] if facts else [])
    if scheduler:
        argv += ["--scheduler", scheduler, "--shards", str(SHARDS)]
    return measure_child("bench._rebuild_measure", argv, timeout=7200)


def _dask_run(store: Path, tmp: Path, workers: int = WORKERS, facts: bool = False) -> tuple[dict, list[dict]]:
    with local_dask(tmp, workers) as (address, procs):
        cpu0 = [proc_cpu_seconds(p.pid) for p in procs]
        driver = _measure(store, address, facts)
        workers = [{"vmhwm_kib": proc_kib(p.pid, "VmHWM"), "cpu_s": proc_cpu_seconds(p.pid) - c0} for p, c0 in zip(procs, cpu0)]
    return driver, workers


def _summary_bytes(root: Path, key: str = "file") -> dict[str, bytes]:
    entries = json.loads((root / "manifest.json").read_text())["summaries"]
    return {e[key]: (root / e[key]).read_bytes() for e in entries if e.get(key)}


def run() -> list[Table]:
    store, _ = ensure_store(SCALE, CACHE, progress)
    t = Table(f"rebuild: a week's per-GPU summaries from raw samples, in-process vs {WORKERS}-worker Dask, {SCALE.describe()}")
    gib = lambda kib: f"{kib / 1024 / 1024:.2f} GiB"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-rebuild-", dir=CACHE) as d:
        tmp = Path(d)
        progress("rebuilding in-process")
        local = _measure(_copy(store, tmp / "in-process"))
        progress(f"rebuilding on a {WORKERS}-worker Dask cluster")
        driver, workers = _dask_run(_copy(store, tmp / "dask"), tmp)
        same = _summary_bytes(tmp / "in-process") == _summary_bytes(tmp / "dask")
        health = _summary_bytes(tmp / "in-process", "health")
        same_health = len(health) == local["health"] and health == _summary_bytes(tmp / "dask", "health")
    t.add("in-process: wall / CPU / peak RSS", f"{local['wall_s']:.1f} s / {local['cpu_s']:.1f} s / {gib(local['vmhwm_kib'])}  "
          f"({local['built']} hours, {SCALE.days} tasks)")
    t.add(f"Dask, {WORKERS} workers: wall", f"{driver['wall_s']:.1f} s  ({local['wall_s'] / driver['wall_s']:.2f}x in-process; "
          f"{driver['built']} hours, {SCALE.days * SHARDS} tasks)")
    t.add("    driver (the collector): CPU / peak RSS", f"{driver['cpu_s']:.1f} s / {gib(driver['vmhwm_kib'])}")
    for i, w in enumerate(workers):
        t.add(f"    worker {i + 1}: CPU / peak RSS", f"{w['cpu_s']:.1f} s / {gib(w['vmhwm_kib'])}")
    t.add("same summary files, byte for byte", "yes" if same else "NO", "yes", same)
    t.add("health summaries (inside the walls above): in-process / Dask wall",
          f"{local['health_s']:.1f} s / {driver['health_s']:.1f} s  ({local['health_s'] / driver['health_s']:.2f}x; "
          f"{local['health']} / {driver['health']} hours, a task each)")
    t.add("same health summary files, byte for byte", "yes" if same_health else "NO", "yes", same_health)
    t.notes += [
        f"{os.cpu_count()} CPUs here, shared by the driver and both workers (each worker one thread; DuckDB in a task uses the "
        "cores it finds): the ratio shows the overhead and the memory split, not what workers on hosts of their own give",
        f"tasks: one per day in-process; {SHARDS} per day on Dask (GPUFLEET_BENCH_REBUILD_SHARDS); a task reads its day's "
        "sample files hour by hour, so its memory is an hour of its share of the GPUs",
    ]
    return [t, facts_rebuild(store)]


def _facts_bytes(root: Path) -> dict[str, bytes]:
    return {e["file"]: (root / e["file"]).read_bytes() for e in json.loads((root / "manifest.json").read_text())["facts"]}


def facts_rebuild(store: Path) -> Table:
    """The store's facts rebuilt (`gpufleet collect --rebuild-facts`): in-process, then on Dask with 1 and with 2 workers."""
    t = Table(f"rebuild: the facts of every settled hour and closed day, in-process vs Dask with 1 and 2 workers, {SCALE.describe()}")
    gib = lambda kib: f"{kib / 1024 / 1024:.2f} GiB"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-rebuild-facts-", dir=CACHE) as d:
        tmp = Path(d)
        progress("rebuilding the facts in-process")
        local = _measure(_copy(store, tmp / "in-process"), facts=True)
        runs = {}
        for n in (1, 2):
            progress(f"rebuilding the facts on a {n}-worker Dask cluster")
            (tmp / f"cluster-{n}").mkdir()
            runs[n] = _dask_run(_copy(store, tmp / f"dask-{n}"), tmp / f"cluster-{n}", n, facts=True)
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
    return t
