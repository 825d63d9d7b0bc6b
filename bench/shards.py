"""Sharded ingest: field-samples/s with 1, 2 and 4 collector shards on one store, side by side.

The same pre-rendered scrape rounds as `bench collector` (128 simulated 8-GPU nodes, the
exporter's own renderer), split by gpufleet.collector.shard (each node to the shard its host
hashes to). Each shard is a process of its own, as `gpufleet collect --shard K/N` would be:
ScrapeSource.round_batch on its nodes' bodies -> Collector.commit into <store>/shards/K-of-N.
Wall time runs from a common start until the last shard has committed its last round; the
figure is every shard's field-samples over that wall time. HTTP is not included.

Knobs (environment):
  GPUFLEET_BENCH_SHARD_ROUNDS=8   scrape rounds timed per configuration (after 2 warm-up rounds)
"""

from __future__ import annotations

import math
import multiprocessing
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench._common import Table, env_number, progress
from bench.collector import SCRAPE_S, WARMUP, _field_values, _render_rounds, _utcnow

ROUNDS = int(env_number("GPUFLEET_BENCH_SHARD_ROUNDS", 8))
SHARD_COUNTS = (1, 2, 4)
FLEET = 100_000  # GPUs, for the projected shard count
HEADROOM = 0.5  # a shard planned at half its measured rate: rounds must finish well inside 15 s

_ROUNDS: list[list[str]] = []  # set before forking: the children inherit it


def _shard(k: int, n: int, root: str, start_at: float, out) -> None:
    from gpufleet.collector.service import Collector
    from gpufleet.collector.shard import Shard
    from gpufleet.collector.sources.scrape import ScrapeSource, Target, TargetStatus
    from gpufleet.collector.store import StoreWriter

    shard = Shard(k, n)
    mine = [i for i in range(len(_ROUNDS[0])) if shard.owns(f"node-{i:04d}:9400")]
    targets = [Target(f"node-{i:04d}:9400") for i in mine]
    source = ScrapeSource(cluster="bench", static_targets=[t.address for t in targets], shard=shard)
    collector = Collector(StoreWriter(shard.root(root)), [], shard=shard)
    t0 = _utcnow() - timedelta(seconds=SCRAPE_S * (len(_ROUNDS) + 1))
    values = 0
    for r, bodies in enumerate(_ROUNDS):
        if r == WARMUP:
            while time.time() < start_at:  # every shard starts its timed rounds together
                time.sleep(0.001)
        batch = source.round_batch(t0 + timedelta(seconds=SCRAPE_S * r), [(t, TargetStatus(up=True), bodies[i]) for t, i in zip(targets, mine)])
        collector.commit(source.name, [batch])
        if r >= WARMUP:
            values += _field_values(batch.samples)
    end = time.time()
    collector.writer.close()
    out.put((k, len(mine), values, end))


def _run(n: int, tmp: Path) -> dict:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start_at = time.time() + 3.0 + n  # after every child has forked and run its warm-up rounds
    procs = [ctx.Process(target=_shard, args=(k, n, str(tmp / f"store-{n}"), start_at, out)) for k in range(1, n + 1)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(r[3] for r in results) - start_at
    return {"values": sum(r[2] for r in results), "wall": wall, "nodes": sorted(r[1] for r in results)}


def run() -> list[Table]:
    global _ROUNDS
    t = Table("collector shards: ingest with 1, 2 and 4 shards on one store (128 nodes x 8 GPUs), processes side by side")
    progress(f"rendering {WARMUP + ROUNDS} scrape rounds of 128 simulated nodes")
    _ROUNDS = _render_rounds(WARMUP + ROUNDS)
    per_gpu = _field_values_per_gpu()
    res = {}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-shards-") as d:
        for n in SHARD_COUNTS:
            progress(f"ingesting with {n} shard(s)")
            res[n] = _run(n, Path(d))
    one = res[1]["values"] / res[1]["wall"]
    for n in SHARD_COUNTS:
        rate = res[n]["values"] / res[n]["wall"]
        t.add(f"{n} shard(s): field-samples/s, wall", f"{rate:,.0f}  ({rate / one:.2f}x of 1 shard; nodes per shard {res[n]['nodes']})")
    per_shard = one  # one shard's own rate: what a shard on a host of its own sustains
    load = FLEET * per_gpu / SCRAPE_S
    t.add(f"projected shards for {FLEET:,} GPUs at {SCRAPE_S} s",
          f"{math.ceil(load / (per_shard * HEADROOM))}  ({load:,.0f} field-samples/s; one shard {per_shard:,.0f}/s, planned at {HEADROOM:.0%})")
    t.notes += [
        f"{ROUNDS} timed rounds after {WARMUP} warm-up rounds per configuration; {os.cpu_count()} CPUs on this machine, so "
        "more shards than cores only share them: the 4-shard row shows the contention, not a fourth of the work",
        "each shard a forked process with its own store under <store>/shards/K-of-N (what `gpufleet collect --shard K/N` writes); "
        "wall from a common start to the last shard's last commit",
    ]
    return [t]


def _field_values_per_gpu() -> float:
    from gpufleet.collector.sources.scrape import ScrapeSource, Target, TargetStatus

    targets = [Target(f"node-{i:04d}:9400") for i in range(len(_ROUNDS[0]))]
    batch = ScrapeSource(cluster="bench").round_batch(_utcnow(), [(t, TargetStatus(up=True), b) for t, b in zip(targets, _ROUNDS[0])])
    return _field_values(batch.samples) / batch.samples.num_rows
