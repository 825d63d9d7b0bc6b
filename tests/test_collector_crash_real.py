"""kill -9 the collector at random points of a long ingest, many times: nothing lost, nothing doubled,
and a reader in another process queries throughout without a lock error or a half batch.

The ingest is a real `gpufleet collect --backfill` reading a real Prometheus whose TSDB was
filled with `promtool tsdb create-blocks-from openmetrics`.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.realstack.prometheus import promtool_path, start_prometheus

START = datetime(2026, 11, 1, 0, 0, 0)
HOURS = 12
STEP = 15  # seconds between samples
GPUS = 8
CHUNK = 300  # collector chunk: 20 timestamps x 8 GPUs = 160 rows per batch
ROWS_PER_CHUNK = CHUNK // STEP * GPUS


def util(i: int, gpu: int) -> int:
    return (i * 7 + gpu * 13) % 101


def write_openmetrics(path: Path) -> int:
    t0 = int(START.replace(tzinfo=timezone.utc).timestamp())
    n = HOURS * 3600 // STEP
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu in range(GPUS):
        labels = f'gpu="{gpu}",UUID="GPU-crash-{gpu}",Hostname="crash-node",modelName="NVIDIA H100 80GB HBM3",instance="crash-node:9400",job="dcgm"'
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util(i, gpu)} {t0 + i * STEP}" for i in range(n)]
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")
    return n


READER = r"""
import json, os, sys, time
from gpufleet.collector.store import open_reader
root, per_chunk, stop_file, total = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
seen, errors, last = 0, [], 0
deadline = time.time() + 900
while not os.path.exists(stop_file) and time.time() < deadline:
    try:
        n = open_reader(root).execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
        seen += 1
        # chunks commit in order: first the one holding only the sample at START (8 rows), then
        # whole ones, then the last (one timestamp short): a count off this ladder is a half batch
        if n not in (0, total) and (n - 8) % per_chunk:
            errors.append(f"half batch visible: {n} rows")
        if n < last:
            errors.append(f"rows went backwards: {last} -> {n}")
        last = n
    except Exception as e:  # a missing store right at the start is fine, anything else is not
        if "no store at" not in str(e):
            errors.append(f"{type(e).__name__}: {e}")
    time.sleep(0.05)
print(json.dumps({"queries": seen, "errors": errors[:10]}))
"""


def test_sigkill_during_backfill_loses_nothing_and_duplicates_nothing(tmp_path):
    om = tmp_path / "data.om"
    n = write_openmetrics(om)
    tsdb = tmp_path / "prom"
    r = subprocess.run([promtool_path(), "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb / "data")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    prom = start_prometheus(tsdb, "global:\n  scrape_interval: 1h\n", extra_args=["--storage.tsdb.retention.time=10y"])
    store = tmp_path / "store"
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{store}"\ncluster = "crash"\nlisten = ""\n[collector.prometheus]\nurl = "{prom.url}"\nchunk_seconds = {CHUNK}\n')
    end = START.replace(hour=HOURS) if HOURS < 24 else START
    # chunks are (lo, hi]: start one second early so the sample at START is in the first chunk
    first = START - timedelta(seconds=1)
    cmd = [sys.executable, "-m", "gpufleet.cli", "--log-level", "WARNING", "collect", "--config", str(cfg), "--backfill", first.isoformat(), end.isoformat()]
    stop_file = tmp_path / "stop-reader"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store), str(ROWS_PER_CHUNK), str(stop_file), str(n * GPUS)], stdout=subprocess.PIPE, text=True)
    rng = random.Random(20261121)
    kills = 0
    try:
        for _ in range(10):
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(rng.uniform(0.8, 2.5))
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        final = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert final.returncode == 0, final.stderr[-2000:]
    finally:
        prom.stop()
        stop_file.touch()
    assert kills >= 5, f"the ingest finished before it could be killed often enough ({kills} kills)"

    from gpufleet.collector.store import open_reader

    con = open_reader(store)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT (ts, gpu_uuid)) FROM gpu_samples").fetchone()
    assert total == distinct == n * GPUS  # nothing lost, nothing doubled
    got = con.execute("SELECT epoch(ts)::BIGINT, gpu, gpu_util FROM gpu_samples").fetchall()
    t0 = int(START.replace(tzinfo=timezone.utc).timestamp())
    assert all(v == util((t - t0) // STEP, g) for t, g, v in got)
    assert con.execute("SELECT DISTINCT host FROM gpu_samples").fetchall() == [("crash-node",)]
    # what the reader saw while the collector was being killed
    out, _ = reader.communicate(timeout=60)
    report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"queries": 0, "errors": ["reader printed nothing"]}
    assert report["errors"] == []
    assert report["queries"] > 20
