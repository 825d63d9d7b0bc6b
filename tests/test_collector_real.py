"""The collector against real things: a running gpufleet exporter, a real Prometheus, the
`gpufleet collect` service as a subprocess with broken targets, and a source whose clock is ahead.
"""

from __future__ import annotations

import http.server
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.collector import schema
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.times import epoch_us, utcnow
from gpufleet.collector.schema import Batch
from gpufleet.collector.sources.prometheus_api import PrometheusApiSource
from gpufleet.collector.sources.scrape import ScrapeSource
from gpufleet.collector.store import StoreWriter, open_reader
from tests.realstack.process import free_port, wait_for
from tests.realstack.prometheus import start_prometheus
from tests.support.exporter import start_exporter, stop
from tests.test_collector_service import FakeSource, metric
from tests.test_store import job, samples

FIELDS = [f.column for f in schema.SAMPLE_FIELDS]
# Every field the sim exporter publishes is constant per GPU in the scenarios below, except the
# energy counter, which counts up.
COUNTERS = {"energy_mj"}


# --- helpers ---

# --- a: Prometheus-API source == direct scraping ---

COMPARE_SCENARIO = """\
hostname = "cmp-node"
model = "h100"
gpus = 4
[[gpu]]
index = 0
utilization = 10
memory_used_mib = 1000
[[gpu]]
index = 1
utilization = 35
memory_used_mib = 20000
[[gpu]]
index = 2
utilization = 70
memory_used_mib = 40000
processes = [ { pid = 4242, used_memory_mib = 30000, sm_util = 70 } ]
[[gpu]]
index = 3
utilization = 95
memory_used_mib = 60000
"""
ROUNDS = 8  # direct scrapes, one a second


def per_gpu(con, column: str) -> dict[str, list]:
    rows = con.execute(f'SELECT gpu_uuid, list(DISTINCT "{column}") FROM gpu_samples GROUP BY 1').fetchall()
    return {uuid: sorted(values, key=lambda v: (v is None, v)) for uuid, values in rows}


def test_prometheus_api_source_stores_the_same_samples_as_direct_scraping(tmp_path):
    exporter, port = start_exporter(tmp_path, COMPARE_SCENARIO, {2: "777"})
    prom = None
    try:
        prom = start_prometheus(
            tmp_path / "prom",
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: gpufleet\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n",
        )
        prom.wait_query("DCGM_FI_DEV_GPU_UTIL", timeout=60, min_results=4)
        prom.wait_query("gpufleet_gpu_job_info", timeout=30)

        # store A: direct scraping, the way the service runs the scrape source
        scrape = ScrapeSource(cluster="cmp", static_targets=[f"127.0.0.1:{port}"], timeout=5)
        a = Collector(StoreWriter(tmp_path / "a"), [ScheduledSource(scrape, 1)])
        stamps = []
        for _ in range(ROUNDS):
            t0 = time.monotonic()
            stamps.append(utcnow())  # ~ the `now` run_source stamps the round with
            assert a.run_source(scrape), scrape.status
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        a.writer.close()
        first, last = stamps[0] - timedelta(milliseconds=500), stamps[-1] + timedelta(milliseconds=500)

        # store B: what Prometheus scraped over the same window, read back through its HTTP API,
        # once Prometheus has scraped (and made queryable) past the window's end
        prom.wait_scraped_past("gpufleet", epoch_us(last) / 1e6)
        api = PrometheusApiSource(url=prom.url, cluster="cmp", chunk_seconds=60, lag_seconds=2)
        b = Collector(StoreWriter(tmp_path / "b"), [ScheduledSource(api, 60)])
        batch = api.read_window(first, last)
        b.commit(api.name, [batch])
        b.writer.close()
        # the same window in 4 GPU shards, 4 queries in flight: the same batch (issue #17)
        sharded = PrometheusApiSource(url=prom.url, cluster="cmp", chunk_seconds=60, gpu_shards=4, parallel_requests=4).read_window(first, last)
        assert sharded.samples.equals(batch.samples) and sharded.allocations == batch.allocations and sharded.gpus == batch.gpus
    finally:
        if prom:
            prom.stop()
        stop(exporter)

    ra, rb = open_reader(tmp_path / "a"), open_reader(tmp_path / "b")
    # the same GPUs, under the same keys
    keys = "SELECT DISTINCT cluster, host, gpu, gpu_uuid, gpu_instance, mig_profile, model FROM gpu_samples ORDER BY ALL"
    gpus = ra.execute(keys).fetchall()
    assert len(gpus) == 4 and {g[1] for g in gpus} == {"cmp-node"}
    assert rb.execute(keys).fetchall() == gpus
    # the same columns filled
    filled = lambda con: {c for c in FIELDS if con.execute(f'SELECT count("{c}") FROM gpu_samples').fetchone()[0]}  # noqa: E731
    assert filled(ra) == filled(rb)
    assert {"gpu_util", "fb_used_mib", "power_w", "energy_mj", "gpu_temp_c", "compute_processes", "gpu_up"} <= filled(ra)
    # every stored field has the same value per GPU on both paths; the scenario's per-GPU
    # constants really differ between GPUs, so a mix-up of GPUs would show
    for column in sorted(filled(ra) - COUNTERS):
        va, vb = per_gpu(ra, column), per_gpu(rb, column)
        assert all(len(v) == 1 for v in va.values()), (column, va)
        assert va == vb, column
    util = {u: v[0] for u, v in per_gpu(ra, "gpu_util").items()}
    assert sorted(util.values()) == [10.0, 35.0, 70.0, 95.0]
    # the energy counter: increasing on both paths, over overlapping ranges
    for con in (ra, rb):
        series = con.execute("SELECT gpu_uuid, list(energy_mj ORDER BY ts) FROM gpu_samples GROUP BY 1").fetchall()
        assert all(v == sorted(v) and v[-1] > v[0] for _, v in series)
    span = "SELECT gpu_uuid, min(energy_mj), max(energy_mj) FROM gpu_samples GROUP BY 1 ORDER BY 1"
    for (ua, lo_a, hi_a), (ub, lo_b, hi_b) in zip(ra.execute(span).fetchall(), rb.execute(span).fetchall()):
        assert ua == ub and lo_a <= hi_b and lo_b <= hi_a
    # the same job on the same GPU, and the same inventory
    alloc = "SELECT cluster, scheduler, job_key, host, gpu_uuid, gpu_instance, gpu FROM allocations ORDER BY ALL"
    job_gpu = [u for u, v in util.items() if v == 70.0][0]
    assert ra.execute(alloc).fetchall() == rb.execute(alloc).fetchall() == [("cmp", "slurm", "777", "cmp-node", job_gpu, -1, 2)]
    inventory = "SELECT cluster, host, gpu_uuid, gpu_instance, gpu, mig_profile, model, fb_total_mib, driver_version FROM gpus ORDER BY ALL"
    assert ra.execute(inventory).fetchall() == rb.execute(inventory).fetchall()
    # sample counts: one row per GPU and direct scrape; Prometheus scraped every 1 s over a
    # window ROUNDS - 1 + 1 s long (give or take a scrape for the phase of its scrape loop)
    count = "SELECT gpu_uuid, count(*), count(DISTINCT ts) FROM gpu_samples GROUP BY 1"
    assert {u: (n, d) for u, n, d in ra.execute(count).fetchall()} == {u: (ROUNDS, ROUNDS) for u in util}
    window = (last - first).total_seconds()
    for uuid, n, distinct in rb.execute(count).fetchall():
        assert n == distinct and window - 2 <= n <= window + 1, (uuid, n, window)
    # Timestamps differ by design: each path stamps the rows with its own scrape's time (the
    # collector's clock for direct scrapes, Prometheus's scrape timestamps through the API).
    assert ra.execute("SELECT DISTINCT source FROM gpu_samples").fetchall() == [("scrape",)]
    assert rb.execute("SELECT DISTINCT source FROM gpu_samples").fetchall() == [("prometheus",)]


def test_through_prometheus_dcgm_exporter_wins_for_a_gpu_both_exporters_report(tmp_path):
    """dcgm-exporter and the gpufleet exporter on one node, both scraped by a real Prometheus and
    read back through its API: one value per GPU and field, by PRECEDENCE (issue #14)."""
    exporter, port = start_exporter(tmp_path, COMPARE_SCENARIO, {2: "777"})
    dcgm_server = prom = None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            ours = r.read().decode()
        uuids = sorted({s.labels["UUID"] for f in text_string_to_metric_families(ours) for s in f.samples
                        if s.name == "DCGM_FI_DEV_GPU_UTIL"})
        assert len(uuids) == 4
        # a dcgm-exporter answering for the same GPUs: utilization 1 and tensor activity 0.123 on all
        dcgm_text = "".join(
            f'{m}{{gpu="{i}",UUID="{u}",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="cmp-node"}} {v}\n'
            for i, u in enumerate(uuids) for m, v in (("DCGM_FI_DEV_GPU_UTIL", 1), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.123))
        ).encode()

        class Dcgm(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(dcgm_text)

            def log_message(self, *args):
                pass

        dcgm_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dcgm)
        threading.Thread(target=dcgm_server.serve_forever, daemon=True).start()
        prom = start_prometheus(
            tmp_path / "prom",
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: gpus\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}', '127.0.0.1:{dcgm_server.server_address[1]}']\n",
        )
        prom.wait_query("DCGM_FI_DEV_GPU_UTIL", timeout=60, min_results=8)
        prom.wait_query("gpufleet_build_info", timeout=30)
        # a window of 5 s ending 6 s from now, read once both targets were scraped past its end
        end = utcnow() + timedelta(seconds=6)
        prom.wait_scraped_past("gpus", epoch_us(end) / 1e6, targets=2)
        api = PrometheusApiSource(url=prom.url, cluster="cmp", chunk_seconds=60, lag_seconds=2)
        c = Collector(StoreWriter(tmp_path / "store"), [ScheduledSource(api, 60)])
        c.commit(api.name, [api.read_window(end - timedelta(seconds=5), end)])
        c.writer.close()
    finally:
        if prom:
            prom.stop()
        if dcgm_server:
            dcgm_server.shutdown()
        stop(exporter)

    con = open_reader(tmp_path / "store")
    rows = con.execute("SELECT gpu_uuid, gpu_util, tensor_active, compute_processes FROM gpu_samples").fetchall()
    assert {r[0] for r in rows} == set(uuids) and len(rows) >= 4 * 3
    # every row is dcgm-exporter's (both exporters scraped each second: ours always folds) ...
    assert {(r[1], round(r[2], 6)) for r in rows} == {(1.0, 0.123)}
    # ... with the fields only ours publishes filled in from it, and its job mapping kept
    assert all(r[3] is not None for r in rows)
    assert con.execute("SELECT job_key FROM allocations").fetchall() == [("777",)]


# --- b: the service end to end, with a hanging and a garbled target ---

SERVICE_SCENARIO = """\
hostname = "e2e-node"
model = "a100"
gpus = 2
[[gpu]]
index = 0
utilization = 50
"""

# What a broken exporter might send: a label block never closed, a value that is not a number,
# binary junk, and a body cut in the middle of its last line. Nothing in it is a usable sample.
GARBLED = (
    b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-garbled-0",Hostname="garbled-node" 12\n'
    b'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-garbled-1",Hostname="garbled-node"} twelve\n'
    b"\x00\x17\xff\xfe garbage \x80\x81\n"
    b'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-garbled-0",Hostname="garbled-node"} 4'
)


class _Garbled(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(GARBLED)))
        self.end_headers()
        self.wfile.write(GARBLED)

    def log_message(self, *args):
        pass


class Hanging:
    """Accepts connections and never answers (a wedged exporter)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)  # held open, never read, never answered

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def scrape_metrics(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_collect_service_end_to_end_with_a_hanging_and_a_garbled_target(tmp_path):
    exporter, good_port = start_exporter(tmp_path, SERVICE_SCENARIO, {0: "4711"})
    hanging = Hanging()
    garbled = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbled)
    threading.Thread(target=garbled.serve_forever, daemon=True).start()
    good, hang, bad = f"127.0.0.1:{good_port}", f"127.0.0.1:{hanging.port}", f"127.0.0.1:{garbled.server_address[1]}"
    store, listen = tmp_path / "store", free_port()
    cfg = tmp_path / "collect.toml"
    cfg.write_text(
        f'[collector]\nstore = "{store}"\ncluster = "e2e"\nlisten = "127.0.0.1:{listen}"\n'
        f'[collector.scrape]\ninterval = 1\ntimeout = 0.5\ntargets = ["{good}", "{hang}", "{bad}"]\n'
    )
    service = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "collect", "--config", str(cfg)],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "collect.log", "wb"), text=True,
    )
    log_tail = lambda: (tmp_path / "collect.log").read_text()[-3000:]  # noqa: E731
    try:
        assert "metrics at" in service.stdout.readline(), log_tail()
        wait_for("the store's first manifest", lambda: (store / "manifest.json").exists(), timeout=30)
        # a reader in this process queries throughout the run, while the service writes
        # for ~5 s, and until at least 3 rounds are stored (a loaded machine starts slower)
        counts, rounds, errors = [], 0, []
        t0 = time.monotonic()
        while (time.monotonic() - t0 < 5 or rounds < 3) and time.monotonic() - t0 < 60:
            try:
                con = open_reader(store)
                n, rounds = con.execute("SELECT count(*), count(DISTINCT ts) FROM gpu_samples").fetchone()
                counts.append(n)
                con.execute("SELECT count(*) FROM gpus").fetchone()
            except Exception as e:  # noqa: BLE001 - any error is a failure
                errors.append(f"{type(e).__name__}: {e}")
            time.sleep(0.1)
        assert service.poll() is None, log_tail()
        metrics = scrape_metrics(listen)
        t0 = time.monotonic()
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=15)
        took = time.monotonic() - t0
    finally:
        stop(service)
        stop(exporter)
        hanging.close()
        garbled.shutdown()

    assert code == 0, log_tail()
    assert took < 5, f"SIGTERM took {took:.1f} s"
    assert errors == []
    assert len(counts) >= 10 and counts == sorted(counts) and counts[-1] > 0  # rows only ever appear
    # the store: rows from the good exporter, and the garbled target's one good line (its last,
    # without a newline: read as Prometheus reads it, the body being whole by its Content-Length)
    con = open_reader(store)
    hosts = con.execute("SELECT host, count(DISTINCT gpu_uuid), count(DISTINCT ts) FROM gpu_samples GROUP BY 1 ORDER BY 1").fetchall()
    assert len(hosts) == 2 and hosts[0][:2] == ("e2e-node", 2) and hosts[0][2] >= 3, hosts
    assert hosts[1][:2] == ("garbled-node", 1)
    assert set(con.execute("SELECT gpu_util, fb_used_mib FROM gpu_samples WHERE host = 'garbled-node'").fetchall()) == {(None, 4.0)}
    assert con.execute("SELECT job_key, host, gpu FROM allocations").fetchall() == [("4711", "e2e-node", 0)]
    # the collector's own /metrics: every target's state, rows written and lines rejected
    up = {dict(k[1])["target"]: v for k, v in metrics.items() if k[0] == "gpufleet_collect_target_up"}
    assert up == {good: 1.0, hang: 0.0, bad: 1.0}  # the garbled one answered (HTTP 200): up, its lines rejected
    rejected = {dict(k[1])["target"]: v for k, v in metrics.items() if k[0] == "gpufleet_collect_target_lines_rejected_total"}
    assert rejected[good] == 0 and rejected[hang] == 0 and rejected[bad] >= 3
    assert metrics[("gpufleet_collect_rows_written_total", (("source", "scrape"), ("table", "gpu_samples")))] > 0
    assert metrics[("gpufleet_collect_rows_rejected_total", (("source", "scrape"),))] >= 3
    assert metrics[("gpufleet_collect_source_success", (("source", "scrape"),))] == 1  # one target up is a success
    log_text = (tmp_path / "collect.log").read_text()
    assert f"{hang}: ReadTimeout" in log_text and "malformed entries skipped" in log_text


# --- c: clock skew ---

T0 = datetime(2026, 11, 20, 12, 0, 0)


def test_samples_from_the_future_are_dropped_and_future_jobs_reported(tmp_path, caplog):
    ok = samples([T0 - timedelta(seconds=15), T0, T0 + timedelta(minutes=4)], [10, 20, 30], host="n1", uuid="GPU-ok")
    ahead = samples([T0 + timedelta(minutes=9), T0 + timedelta(minutes=10)], [77, 78], host="n9", uuid="GPU-skewed")
    alloc = lambda ts, host, uuid: {"ts": ts, "cluster": "c", "scheduler": "slurm", "job_key": "5", "host": host,  # noqa: E731
                                    "gpu_uuid": uuid, "gpu_instance": -1, "gpu": 0, "source": "exporter"}
    batch = Batch(
        key="skew",
        samples=pa.concat_tables([ok, ahead]),
        jobs=[job("5", "RUNNING", start=T0 + timedelta(hours=1)), job("6", "COMPLETED", start=T0 - timedelta(hours=1), end=T0),
              job("7", "PENDING", start=T0 + timedelta(days=1))],  # a pending job's start is an estimate: fine
        allocations=[alloc(T0, "n1", "GPU-ok"), alloc(T0 + timedelta(minutes=10), "n9", "GPU-skewed")],
    )
    src = FakeSource("skewy", [batch])
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(src, 1)], clock=lambda: T0)
    assert c.max_future_skew == timedelta(minutes=5)
    with caplog.at_level(logging.WARNING):
        assert c.run_once()
    con = open_reader(tmp_path)
    # the good rows, including one 4 minutes ahead (within the tolerated skew), are kept
    assert con.execute("SELECT host, gpu_util FROM gpu_samples ORDER BY ts").fetchall() == [("n1", 10.0), ("n1", 20.0), ("n1", 30.0)]
    assert con.execute("SELECT job_key, start FROM jobs ORDER BY 1").fetchall() == [
        ("5", T0 + timedelta(hours=1)), ("6", T0 - timedelta(hours=1)), ("7", T0 + timedelta(days=1))]
    assert con.execute("SELECT host, last_seen FROM allocations").fetchall() == [("n1", T0)]
    assert metric(c, "gpufleet_collect_rows_written_total", source="skewy", table="gpu_samples") == 3
    assert metric(c, "gpufleet_collect_rows_rejected_total", source="skewy") == 2
    assert metric(c, "gpufleet_collect_clock_skew_total", source="skewy") == 4  # 2 samples, 1 allocation, 1 job
    text = caplog.text
    assert "2 samples dated up to 600 s in the future (clock skew on n9?)" in text
    assert "1 jobs dated up to 3600 s in the future, kept (clock skew on the scheduler?); job 5 start=2026-11-20T13:00:00" in text
    assert "1 allocation observations dated in the future dropped (clock skew on n9?)" in text


def test_a_batch_entirely_from_the_future_commits_nothing_but_its_watermark(tmp_path):
    batch = Batch(key="w", samples=samples([T0 + timedelta(hours=2)], [1], host="n2"), watermark=("src", T0.isoformat()))
    src = FakeSource("src", [batch])
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(src, 1)], clock=lambda: T0, max_future_skew=timedelta(seconds=30))
    assert c.run_once()
    assert open_reader(tmp_path).execute("SELECT count(*) FROM gpu_samples").fetchone() == (0,)
    assert c.writer.watermark("src") == T0.isoformat()
    assert metric(c, "gpufleet_collect_clock_skew_total", source="src") == 1
    assert metric(c, "gpufleet_collect_rows_rejected_total", source="src") == 1


@pytest.mark.parametrize("skew_s", [0, 299])
def test_samples_within_the_skew_are_kept(tmp_path, skew_s):
    batch = Batch(key="k", samples=samples([T0 + timedelta(seconds=skew_s)], [5]))
    c = Collector(StoreWriter(tmp_path), [ScheduledSource(FakeSource("s", [batch]), 1)], clock=lambda: T0)
    assert c.run_once()
    assert open_reader(tmp_path).execute("SELECT gpu_util FROM gpu_samples").fetchall() == [(5.0,)]
    assert metric(c, "gpufleet_collect_clock_skew_total", source="s") is None
