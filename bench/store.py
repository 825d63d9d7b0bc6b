"""Store: publish cost per round at 200k and 2M allocation rows of history, side by side.

Two stores of one 1,024-GPU fleet (128 nodes x 8) differ only in how much settled history they
hold: 200k and 2M allocation rows (and a job per 4 of them). The history is seeded in bulk
through the writer's own connection (finished jobs, allocations last seen days ago), then moved
into segments by the product's store maintenance (gpufleet.collector.maintenance.settle). Each
timed round goes through the product path: StoreWriter.commit of one scrape round (every GPU's
inventory and allocation observed again, a job ending and another starting now and then), then
StoreWriter.publish, which alone is timed. Rounds alternate between the two stores so machine
load hits both alike; the figure is the median per round.

Context, same stores: what the same round's publish cost before segments, a full snapshot of
each table the round changed (jobs, allocations, gpus), written the same way.

Knobs (environment):
  GPUFLEET_BENCH_STORE_ROUNDS=30       timed rounds per store
  GPUFLEET_BENCH_STORE_SMALL=200000    allocation rows of history, small store
  GPUFLEET_BENCH_STORE_LARGE=2000000   allocation rows of history, large store
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench._common import Table, env_number, progress

ROUNDS = int(env_number("GPUFLEET_BENCH_STORE_ROUNDS", 30))
SIZES = (int(env_number("GPUFLEET_BENCH_STORE_SMALL", 200_000)), int(env_number("GPUFLEET_BENCH_STORE_LARGE", 2_000_000)))
NODES, GPUS_PER_NODE, GPUS_PER_JOB = 128, 8, 4
GPUS = NODES * GPUS_PER_NODE
SCRAPE_S = 15
RATIO_GOAL = 1.2  # issue #16: publish per round, 2M vs 200k allocation rows
NOW = datetime(2026, 11, 20)


def _uuid(g: int) -> str:
    return f"GPU-{g:08x}-7d1c-4c2b-9e61-{g * 7919:012x}"


def _seed(w, rows: int) -> None:
    """`rows` allocations of finished jobs (4 GPUs each, back to back on every GPU, 2 h apart,
    ending a day before NOW), and their jobs, inserted in bulk as the writer would have."""
    jobs = rows // GPUS_PER_JOB
    per_gpu = rows // GPUS
    w.db.execute(
        f"""INSERT INTO allocations (cluster, scheduler, job_key, host, gpu_uuid, gpu_instance, gpu, first_seen, last_seen, source)
            SELECT 'bench', 'slurm', 'h' || (i // {GPUS_PER_JOB}), 'node-' || lpad(((i % {GPUS}) // {GPUS_PER_NODE})::VARCHAR, 4, '0'),
                   'GPU-' || lpad(printf('%x', i % {GPUS}), 8, '0') || '-7d1c-4c2b-9e61-' || lpad(printf('%x', (i % {GPUS}) * 7919), 12, '0'),
                   -1, (i % {GPUS_PER_NODE})::SMALLINT,
                   $end - to_seconds(({per_gpu} - (i // {GPUS})) * 7200 + 7000), $end - to_seconds(({per_gpu} - (i // {GPUS})) * 7200), 'exporter'
            FROM range({rows}) t(i)""",
        {"end": NOW - timedelta(days=1)},
    )
    w.db.execute(
        f"""INSERT INTO jobs (cluster, scheduler, job_key, job_id, name, user_name, account, partition, start, "end",
                              state, state_raw, exit_code, gpus, node_count, nodes, source, updated_at)
            SELECT 'bench', 'slurm', 'h' || j, 'h' || j, 'train-' || (j % 97), 'user' || (j % 61), 'team' || (j % 13), 'gpu',
                   $end - to_seconds(({per_gpu} - (j * {GPUS_PER_JOB} // {GPUS})) * 7200 + 7000),
                   $end - to_seconds(({per_gpu} - (j * {GPUS_PER_JOB} // {GPUS})) * 7200),
                   'COMPLETED', 'COMPLETED', '0:0', {GPUS_PER_JOB}, 1, 'node', 'sacct', $end
            FROM range({jobs}) t(j)""",
        {"end": NOW - timedelta(days=1)},
    )


def _job(key: str, start: datetime, end: datetime | None) -> dict:
    from gpufleet.collector import schema

    row = {c: None for c in schema.JOB_COLUMNS}
    row.update(cluster="bench", scheduler="slurm", job_key=key, job_id=key, name="train", user_name="u", account="team",
               partition="gpu", start=start, end=end, state="COMPLETED" if end else "RUNNING", gpus=GPUS_PER_JOB,
               source="sacct", updated_at=end or start)
    return row


class _Fleet:
    """The running part: a job on every 4 GPUs; round r ends job r % 256 and starts its successor."""

    def __init__(self) -> None:
        self.running = [f"r{j}" for j in range(GPUS // GPUS_PER_JOB)]
        self.started = {k: NOW for k in self.running}

    def round(self, r: int):
        from gpufleet.collector.schema import Batch

        ts = NOW + timedelta(seconds=SCRAPE_S * r)
        jobs = []
        if r % 4 == 3:  # a job ends, its successor starts on the same GPUs
            slot = (r // 4) % len(self.running)
            old = self.running[slot]
            jobs.append(_job(old, self.started.pop(old), ts))
            new = self.running[slot] = f"r{slot}-{r}"
            self.started[new] = ts
            jobs.append(_job(new, ts, None))
        allocs, gpus = [], []
        for g in range(GPUS):
            host = f"node-{g // GPUS_PER_NODE:04d}"
            allocs.append({"ts": ts, "cluster": "bench", "scheduler": "slurm", "job_key": self.running[g // GPUS_PER_JOB], "host": host,
                           "gpu_uuid": _uuid(g), "gpu_instance": -1, "gpu": g % GPUS_PER_NODE, "source": "exporter"})
            gpus.append({"ts": ts, "cluster": "bench", "host": host, "gpu_uuid": _uuid(g), "gpu_instance": -1, "gpu": g % GPUS_PER_NODE,
                         "mig_profile": None, "model": "NVIDIA H100 80GB HBM3", "fb_total_mib": 81559.0, "driver_version": "550.54.15"})
        return Batch(key=f"round:{r}", jobs=jobs, allocations=allocs, gpus=gpus)


def _full_snapshot(w, out: Path) -> float:
    """The publish before segments for a round that changed jobs, allocations and gpus."""
    from gpufleet.collector.store import SEG, SEGMENTED, write_parquet

    t0 = time.perf_counter()
    for name in ("allocations", "gpus", "jobs"):
        arrow = w.db.sql(f"SELECT * {f'EXCLUDE ({SEG})' if name in SEGMENTED else ''} FROM {name}").to_arrow_table()
        write_parquet(arrow, out / f"{name}.parquet")
    return time.perf_counter() - t0


def publish_cost() -> Table:
    from gpufleet.collector.maintenance import settle
    from gpufleet.collector.store import StoreWriter

    small, large = SIZES
    t = Table(f"store: publish per round, {GPUS:,}-GPU fleet, {small:,} vs {large:,} allocation rows of history")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as d:
        tmp = Path(d)
        now = [NOW]
        stores, fleets, info = [], [], []
        for rows in SIZES:
            progress(f"seeding {rows:,} allocation rows of history and settling them into segments")
            w = StoreWriter(tmp / f"s{rows}", clock=lambda: now[0])
            _seed(w, rows)
            c0 = time.perf_counter()
            settled = settle(w, NOW)
            info.append((settled, time.perf_counter() - c0))
            fleet = _Fleet()
            w.commit(fleet.round(0))
            w.publish()
            stores.append(w)
            fleets.append(fleet)
        times: list[list[float]] = [[], []]
        full: list[list[float]] = [[], []]
        open_rows = [0, 0]
        progress(f"timing {ROUNDS} rounds per store, alternating")
        for r in range(1, ROUNDS + 1):
            now[0] = NOW + timedelta(seconds=SCRAPE_S * r)
            for i, w in enumerate(stores):
                w.commit(fleets[i].round(r))
                t0 = time.perf_counter()
                w.publish()
                times[i].append(time.perf_counter() - t0)
        for i, w in enumerate(stores):
            out = tmp / f"full{i}"
            out.mkdir()
            full[i] = [_full_snapshot(w, out) for _ in range(3)]
            open_rows[i] = w.db.execute("SELECT count(*) FROM allocations WHERE _segment IS NULL OR _segment < 0").fetchone()[0]
            segs = w.db.execute("SELECT count(*) FROM segments").fetchone()[0]
            info[i] = (*info[i], segs)
            w.close()
    med = [statistics.median(x) for x in times]
    ratio = med[1] / med[0]
    t.add(f"store publish per round, {large:,} vs {small:,} allocation rows (ratio)", f"{ratio:.2f}  ({med[1] * 1000:.1f} vs {med[0] * 1000:.1f} ms)",
          f"<= {RATIO_GOAL}", ratio <= RATIO_GOAL)
    for i, rows in enumerate(SIZES):
        ts = sorted(times[i])
        t.add(f"    {rows:,} rows: publish per round, median (min-max)", f"{med[i] * 1000:.1f} ms ({ts[0] * 1000:.1f}-{ts[-1] * 1000:.1f})")
        t.add(f"    {rows:,} rows: open allocation rows published, segments", f"{open_rows[i]:,} rows, {info[i][2]} segment files")
        t.add(f"    {rows:,} rows: settling the history (once, store maintenance)", f"{info[i][0]:,} rows in {info[i][1]:.1f} s")
        t.add(f"    context: {rows:,} rows: a full snapshot of jobs + allocations + gpus (publish before segments)",
              f"{min(full[i]) * 1000:.0f} ms")
    t.notes += [
        f"{ROUNDS} rounds per store, alternating; publish timed alone (time.perf_counter); each round committed through "
        f"StoreWriter.commit: {GPUS:,} allocation and inventory observations, every 4th round a job ends and another starts",
        "history: allocations of 4-GPU jobs back to back on every GPU, seeded in bulk through the writer's connection, "
        "then settled into segments by gpufleet.collector.maintenance.settle (what the collector's maintenance runs)",
        "context row: the same tables snapshotted whole with the store's Parquet settings, best of 3",
    ]
    return t


def run() -> list[Table]:
    return [publish_cost()]
