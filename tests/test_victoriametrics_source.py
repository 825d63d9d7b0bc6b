"""A real Prometheus-compatible long-term store: VictoriaMetrics (Debian's victoria-metrics, single
node, on loopback) holding real exporter outputs (dcgm-exporter 3.x/4.x with MIG and Kubernetes pod
labels, utkuozdemir/nvidia_gpu_exporter), imported as timed scrapes. `gpufleet collect --backfill`
reading it through the Prometheus API must store exactly what scraping the same bodies stores:
per GPU, per sample time, every column, and the same job <-> GPU allocations. And the way the
issue met it: vmagent scraping exporters into VictoriaMetrics, read back sample time by sample time."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufleet.collector.exposition_parse import parse_exposition
from gpufleet.collector.schema import SAMPLE_SCHEMA
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.prometheus_api import PrometheusApiSource
from gpufleet.collector.sources.scrape import ScrapeSource, Target, TargetStatus
from gpufleet.collector.store import StoreWriter, open_reader
from tests.realstack.dask import start_dask
from tests.realstack.victoriametrics import start_victoriametrics, start_vmagent
from tests.support.http import Loopback
from tests.support.shared_data import SHARED_DATA

pytestmark = pytest.mark.realstack

DATA = SHARED_DATA
BODIES = {  # instance -> the exporter output it serves
    "gpu-node-1:9400": DATA / "dcgm-exporter" / "h100x8_k8s_pod-labels_dcgm4x_aicr.prom",
    "msxf-hpc-64-35-ai:9400": DATA / "dcgm-exporter" / "a800x8_mig-2g.20gb_dcgm3x_subset.prom",
    "cp-bm14r7:9400": DATA / "dcgm-exporter" / "t4_baremetal_dcgm4x_ericsson-ccd.prom",
    "i-030791dc5a37cd257:9400": DATA / "dcgm-exporter" / "l4_aws_dcgm4x_kops.prom",
    "smi-node:9835": DATA / "nvidia_gpu_exporter" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load.metrics",
}
# Naive UTC, in the past (every chunk complete), at midnight on purpose: VictoriaMetrics 1.79
# does not return a sample stamped exactly 00:00:00 UTC to a query at that instant when its
# series has no earlier sample (its per-day index); the source queries 1 ms after each chunk.
START = datetime(2026, 11, 2, 0, 0, 0)
SCRAPES = 8
STEP = timedelta(seconds=15)
_UTIL = re.compile(r"^((?:DCGM_FI_DEV_GPU_UTIL|nvidia_smi_utilization_gpu_ratio)\{[^}]*\}) (\S+)$", re.M)


def body_at(path: Path, k: int) -> str:
    """The exporter's output at scrape k: utilization moves from scrape to scrape."""
    def vary(m: re.Match[str]) -> str:
        value = (k * 7 + len(m[1])) % 101
        return f"{m[1]} {value / 100 if m[1].startswith('nvidia_smi') else value}"
    return _UTIL.sub(vary, path.read_text())


def ms(t: datetime) -> int:
    return int(t.replace(tzinfo=timezone.utc).timestamp() * 1000)


def table_rows(root: Path, sql: str) -> list[tuple]:
    return open_reader(root).execute(sql).fetchall()


def fill(vm, direct: Path) -> None:
    """The bodies imported into VictoriaMetrics as timed scrapes, and what scraping them stores
    (the scrape source's own round over the same bodies, one round per time) in `direct`."""
    scrape = ScrapeSource(cluster="fleet", static_targets=list(BODIES))
    c = Collector(StoreWriter(direct), [ScheduledSource(scrape, 15)], clock=lambda: START + timedelta(days=1))
    for k in range(SCRAPES):
        ts = START + k * STEP
        answers = [(Target(instance), TargetStatus(up=True), body_at(path, k)) for instance, path in BODIES.items()]
        c.commit("scrape", [scrape.round_batch(ts, answers)])
        for instance, path in BODIES.items():
            vm.import_prometheus(body_at(path, k), timestamp_ms=ms(ts), extra_labels={"instance": instance, "job": "gpu"})
    c.writer.close()
    vm.flush()
    assert vm.query("count(count_over_time(DCGM_FI_DEV_GPU_UTIL[1h]))", time=ms(START + timedelta(hours=1)) / 1000)


def backfill_cli(tmp_path: Path, store: Path, vm_url: str, prometheus: str, end: datetime, analytics: str = "") -> subprocess.CompletedProcess:
    """`gpufleet collect --backfill` of (START - 1 s, end] reading VictoriaMetrics as a Prometheus-compatible
    store; `prometheus` and `analytics`: more lines of those config sections."""
    cfg = tmp_path / f"{store.name}.toml"
    cfg.write_text(f'[collector]\nstore = "{store}"\ncluster = "fleet"\nlisten = ""\n'
                   f'[collector.prometheus]\nurl = "{vm_url}"\n{prometheus}' + (f"[analytics]\n{analytics}" if analytics else ""))
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "--log-level", "INFO", "collect", "--config", str(cfg),
                        "--backfill", (START - timedelta(seconds=1)).isoformat(), end.isoformat()],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.parametrize("reading", ["", "parallel_requests = 3\ngpu_shards = 4\n"], ids=["defaults", "4-shards"])
def test_backfill_from_victoriametrics_equals_scraping(tmp_path, reading):
    vm = start_victoriametrics(tmp_path / "vm")
    try:
        direct, via = tmp_path / "direct", tmp_path / "via"
        fill(vm, direct)
        backfill_cli(tmp_path, via, vm.url, f"chunk_seconds = 3600\n{reading}", START + timedelta(hours=1))
        version = vm.version()
    finally:
        vm.stop()
    assert_same_store(direct, via, version)


def test_backfill_on_dask_stores_what_a_backfill_here_stores(tmp_path):
    """`[analytics] dask_scheduler` set: the backfill's chunks are read as tasks on a real Dask
    cluster (scheduler + 2 workers on loopback), committed here in order; the store equals the
    in-process backfill's and scraping's."""
    vm = start_victoriametrics(tmp_path / "vm")
    cluster = start_dask(tmp_path / "dask", workers=2)
    try:
        direct, here, on_dask = tmp_path / "direct", tmp_path / "here", tmp_path / "on-dask"
        fill(vm, direct)
        end = START + SCRAPES * STEP  # chunks of 60 s: (START - 60 s, START], ..., 3 tasks
        backfill_cli(tmp_path, here, vm.url, "chunk_seconds = 60\n", end)
        r = backfill_cli(tmp_path, on_dask, vm.url, "chunk_seconds = 60\n", end, analytics=f'dask_scheduler = "{cluster.address}"\n')
        assert f"backfill prometheus on {cluster.address} [" in r.stdout and "3/3 (100%)" in r.stdout, r.stdout[-2000:]
        assert "backfill-prometheus: 3 of 3 tasks done" in r.stderr, r.stderr[-2000:]
        version = vm.version()
    finally:
        cluster.stop()
        vm.stop()
    assert_same_store(here, on_dask, version)
    assert_same_store(direct, on_dask, version)


def assert_same_store(direct: Path, via: Path, version: str) -> None:
    columns = [f.name for f in SAMPLE_SCHEMA if f.name != "source"]
    order = "ORDER BY ts, host, gpu_uuid, gpu_instance"
    want = table_rows(direct, f"SELECT {', '.join(columns)} FROM gpu_samples {order}")
    got = table_rows(via, f"SELECT {', '.join(columns)} FROM gpu_samples {order}")
    gpus = {(row[2], row[4], row[5]) for row in want}
    assert len(want) == SCRAPES * len(gpus) and len(gpus) >= 20, (len(want), len(gpus))
    allocations = len(table_rows(via, "SELECT * FROM allocations"))
    print(f"VictoriaMetrics {version}: {len(got)} rows of {len(gpus)} GPUs equal, {allocations} allocations")
    assert {row[2] for row in want} == {"gpu-node-1", "msxf-hpc-64-35-ai", "cp-bm14r7", "i-030791dc5a37cd257", "smi-node"}
    for w, g in zip(want, got):
        assert dict(zip(columns, g)) == dict(zip(columns, w)), version
    assert len(got) == len(want), version
    assert {s for (s,) in table_rows(via, "SELECT DISTINCT source FROM gpu_samples")} == {"prometheus"}
    alloc = "SELECT scheduler, job_key, host, gpu_uuid, gpu_instance, gpu, first_seen, last_seen FROM allocations ORDER BY ALL"
    assert table_rows(via, alloc) == table_rows(direct, alloc) and table_rows(direct, alloc)


def test_vmagent_scraping_into_victoriametrics_read_back_equals_the_scraped_bodies(tmp_path):
    """The issue's set-up: vmagent scrapes exporters (here loopback servers serving real outputs)
    into VictoriaMetrics; every sample time the collector reads back gives, per GPU, what parsing
    the body served gives at that time."""
    served = {"dcgm": BODIES["gpu-node-1:9400"], "smi": BODIES["smi-node:9835"]}
    servers = {name: Loopback() for name in served}
    for name, server in servers.items():
        server.routes["/metrics"] = (200, "text/plain; version=0.0.4", served[name].read_bytes())
    vm = start_victoriametrics(tmp_path / "vm")
    agent = None
    try:
        started = datetime.now(timezone.utc).replace(tzinfo=None)
        agent = start_vmagent(tmp_path / "vmagent", vm, [f"127.0.0.1:{s.port}" for s in servers.values()])
        deadline = time.monotonic() + 60
        while True:  # at least 3 scrapes of each target stored
            vm.flush()
            counts = vm.query('count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="0"}[5m]) or count_over_time(nvidia_smi_index[5m])')
            if len(counts) == 2 and min(float(c["value"][1]) for c in counts) >= 3:
                break
            assert time.monotonic() < deadline, f"vmagent -> VictoriaMetrics: {counts}"
            time.sleep(0.5)
        agent.stop()
        agent = None
        vm.flush()
        end = datetime.now(timezone.utc).replace(tzinfo=None)
        src = PrometheusApiSource(url=vm.url, cluster="fleet")
        batch = src.read_window(started - timedelta(seconds=1), end)
    finally:
        if agent:
            agent.stop()
        vm.stop()
        for s in servers.values():
            s.close()
    assert batch.rejected == 0 and batch.unrecognized == [], (batch.problems, batch.unrecognized)
    got = batch.samples.to_pylist()
    by_scrape: dict[tuple[str, datetime], list[dict]] = {}
    for row in got:
        by_scrape.setdefault((row["host"], row["ts"]), []).append(row)
    ports = {name: f"127.0.0.1:{s.port}" for name, s in servers.items()}
    assert {h for h, _ in by_scrape} == {"gpu-node-1", "127.0.0.1"} and len(by_scrape) >= 6, sorted(by_scrape)[:4]
    for (host, ts), rows in by_scrape.items():
        name = "smi" if host == "127.0.0.1" else "dcgm"
        want = parse_exposition(served[name].read_text(), ts=ts, cluster="fleet", target=ports[name], source="prometheus").samples.to_pylist()
        key = lambda r: (r["gpu_uuid"], r["gpu_instance"] or -1)  # noqa: E731
        assert sorted(rows, key=key) == sorted(want, key=key), (host, ts)
