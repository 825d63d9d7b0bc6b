"""Loud unknown input, in every source: a target that answers without GPU series, a pod name as
Hostname, a Prometheus answer of an unknown or `vector` shape, an empty answer, a backfill of a
window not complete yet. Each: a warning naming what and where, the counter
gpufleet_collect_input_unrecognized_total, an entry in the store's manifest (the Health page's
table) and, when nothing at all was recognized, exit status 1 for --once / --backfill."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufleet.analytics.fleet_now import collector_status
from gpufleet.collector.service import Collector, ScheduledSource
from gpufleet.collector.sources.prometheus_api import PrometheusApiSource
from gpufleet.collector.sources.scrape import ScrapeSource
from gpufleet.collector.store import StoreWriter, open_reader
from tests.support.http import Loopback
from tests.support.shared_data import SHARED_DATA

DATA = SHARED_DATA
SMI_H100 = DATA / "nvidia_gpu_exporter" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01__load.metrics"
NODE_EXPORTER = b'# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.42\nnode_cpu_seconds_total{cpu="0",mode="idle"} 5\n'
DCGM_POD_HOST = b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="nvidia-dcgm-exporter-sv6g2"} 55\n'
T0 = datetime(2026, 11, 20, 12, 0, 0)


@pytest.fixture
def server():
    with Loopback() as s:
        yield s


def text(body: bytes):
    return (200, "text/plain; version=0.0.4", body)


def metric(c: Collector, **labels) -> float | None:
    return c.metrics.registry.get_sample_value("gpufleet_collect_input_unrecognized_total", labels)


def manifest(root: Path) -> list[dict]:
    return json.loads((root / "manifest.json").read_text())["unrecognized"]


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "--log-level", "WARNING", "collect", *args],
                          capture_output=True, text=True, timeout=timeout)


def config(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "store"}"\ncluster = "c1"\nlisten = ""\n{body}')
    return cfg


# --- scraping ---


def test_a_target_without_gpu_series_is_named_counted_recorded_and_shown(server, tmp_path, caplog):
    server.routes["/node"] = text(NODE_EXPORTER)
    server.routes["/smi"] = text(SMI_H100.read_bytes())
    node, smi = f"127.0.0.1:{server.port}/node", f"127.0.0.1:{server.port}/smi"
    src = ScrapeSource(cluster="c1", static_targets=[f"http://{node}", f"http://{smi}"])
    c = Collector(StoreWriter(tmp_path, clock=lambda: T0), [ScheduledSource(src, 15)], clock=lambda: T0)
    with caplog.at_level(logging.WARNING):
        assert c.run_once()
    c.writer.close()
    # the nvidia_gpu_exporter target is read; the node exporter is said to hold no GPU series
    assert open_reader(tmp_path).execute("SELECT host, gpu, gpu_util FROM gpu_samples").fetchall() == [("127.0.0.1", 0, 100.0)]
    warned = [r.getMessage() for r in caplog.records if "not recognized" in r.getMessage()]
    assert len(warned) == 1 and f"http://{node}" in warned[0] and "no_gpu_rows" in warned[0]
    assert "node_load1" in warned[0] and "node_cpu_seconds_total" in warned[0]  # the first unknown names
    assert metric(c, source="scrape", input=f"http://{node}", kind="no_gpu_rows") == 1
    assert metric(c, source="scrape", input=f"http://{smi}", kind="no_gpu_rows") is None
    [entry] = manifest(tmp_path)
    assert (entry["source"], entry["input"], entry["kind"], entry["count"]) == ("scrape", f"http://{node}", "no_gpu_rows", 1)
    [shown] = collector_status(tmp_path)["unrecognized"]  # what the Health page lists
    assert (shown["input"], shown["kind"], shown["last_seen"]) == (f"http://{node}", "no_gpu_rows", T0)
    # kept across a restart of the writer, counted on
    c = Collector(StoreWriter(tmp_path, clock=lambda: T0 + timedelta(minutes=1)), [ScheduledSource(src, 15)], clock=lambda: T0 + timedelta(minutes=1))
    c.run_once()
    c.writer.close()
    [entry] = manifest(tmp_path)
    assert entry["count"] == 2 and entry["first_seen"] == T0.isoformat()


def test_once_exits_1_when_nothing_at_all_was_recognized(server, tmp_path):
    server.routes["/metrics"] = text(NODE_EXPORTER)
    cfg = config(tmp_path, f'[collector.scrape]\ntargets = ["127.0.0.1:{server.port}"]\n')
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 1, r.stderr
    assert "not recognized (no_gpu_rows)" in r.stderr and f"127.0.0.1:{server.port}" in r.stderr
    assert "nothing recognized, no row stored" in r.stderr
    assert manifest(tmp_path / "store")[0]["kind"] == "no_gpu_rows"
    server.routes["/metrics"] = text(SMI_H100.read_bytes())  # the same target now serving nvidia_gpu_exporter
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 0, r.stderr


def test_pod_name_hostname_is_reported_and_the_node_label_used(server, tmp_path):
    server.routes["/metrics"] = text(DCGM_POD_HOST)
    target = f"127.0.0.1:{server.port}"
    sd = tmp_path / "targets.json"
    sd.write_text(json.dumps([{"targets": [target], "labels": {}}]))
    cfg = config(tmp_path, f'[collector.scrape]\nfile_sd = ["{sd}"]\n')
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 0, r.stderr  # stored, under the pod name, but said
    assert "pod_hostname" in r.stderr and "nvidia-dcgm-exporter-sv6g2" in r.stderr
    assert open_reader(tmp_path / "store").execute("SELECT host FROM gpu_samples").fetchall() == [("nvidia-dcgm-exporter-sv6g2",)]
    assert manifest(tmp_path / "store")[0]["kind"] == "pod_hostname"
    server.routes["/metrics"] = text(DCGM_POD_HOST.replace(b'"} 55', b'",kubernetes_node="gpu-node-4"} 55'))
    r = run_cli("--config", str(cfg), "--once")
    assert r.returncode == 0 and "host taken from label kubernetes_node='gpu-node-4'" in r.stderr
    hosts = open_reader(tmp_path / "store").execute("SELECT DISTINCT host FROM gpu_samples ORDER BY host").fetchall()
    assert hosts == [("gpu-node-4",), ("nvidia-dcgm-exporter-sv6g2",)]


# --- the Prometheus API ---

END = datetime(2026, 11, 2, 1, 0, 0)


def _epoch(t: datetime) -> float:
    return t.replace(tzinfo=timezone.utc).timestamp()


def series(t: datetime, value: float, gpu: str = "0") -> dict:
    return {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": gpu, "UUID": f"GPU-{gpu}", "Hostname": "n1", "instance": "n1:9400"},
            "value": [_epoch(t), str(value)]}


def answer(kind: str, result) -> tuple[int, str, bytes]:
    return (200, "application/json", json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode())


def prom_collector(server, tmp_path) -> tuple[Collector, PrometheusApiSource]:
    src = PrometheusApiSource(url=server.url, cluster="c1", chunk_seconds=3600, clock=lambda: END + timedelta(days=1))
    return Collector(StoreWriter(tmp_path), [ScheduledSource(src, 60)], clock=lambda: END + timedelta(days=1)), src


def test_vector_answer_is_stored_and_reported(server, tmp_path, caplog):
    server.routes["/api/v1/query"] = answer("vector", [series(END, 40), series(END, 60, "1")])
    c, src = prom_collector(server, tmp_path)
    with caplog.at_level(logging.WARNING):
        c.commit(src.name, [src.read_window(END - timedelta(hours=1), END)])
    c.writer.close()
    rows = open_reader(tmp_path).execute("SELECT ts, gpu, gpu_util, source FROM gpu_samples ORDER BY gpu").fetchall()
    assert rows == [(END, 0, 40.0, "prometheus"), (END, 1, 60.0, "prometheus")]
    assert metric(c, source="prometheus", input=server.url, kind="vector_answer") == 1
    assert any("vector" in r.getMessage() and server.url in r.getMessage() for r in caplog.records)
    assert manifest(tmp_path)[0]["kind"] == "vector_answer"
    assert "only the latest sample of each series was stored, for 2 of its 2 series" in manifest(tmp_path)[0]["detail"]


def test_vector_answer_outside_the_chunk_says_nothing_was_stored(server, tmp_path):
    server.routes["/api/v1/query"] = answer("vector", [series(END - timedelta(hours=2), 40)])  # a stale series
    c, src = prom_collector(server, tmp_path)
    c.commit(src.name, [src.read_window(END - timedelta(hours=1), END)])
    c.writer.close()
    assert open_reader(tmp_path).execute("SELECT count(*) FROM gpu_samples").fetchone() == (0,)
    [entry] = [u for u in manifest(tmp_path) if u["kind"] == "vector_answer"]
    assert "nothing was stored: none of its 1 series had a sample inside the window" in entry["detail"]


def test_unknown_answer_shape_fails_the_chunk_loudly(server, tmp_path):
    server.routes["/api/v1/query"] = answer("scalar", [_epoch(END), "1"])
    c, src = prom_collector(server, tmp_path)
    src.initial_lookback_seconds = 7200
    assert c.run_source(src) is False
    assert metric(c, source="prometheus", input=server.url, kind="unknown_answer") == 1
    c.writer.close()
    assert manifest(tmp_path)[0]["kind"] == "unknown_answer" and "scalar" in manifest(tmp_path)[0]["detail"]


def test_backfill_of_an_empty_answer_exits_1_naming_it(server, tmp_path):
    server.routes["/api/v1/query"] = answer("matrix", [])
    cfg = config(tmp_path, f'[collector.prometheus]\nurl = "{server.url}"\nchunk_seconds = 3600\n')
    r = run_cli("--config", str(cfg), "--backfill", (END - timedelta(hours=2)).isoformat(), END.isoformat())
    assert r.returncode == 1, r.stderr
    assert "empty_answer" in r.stderr and "nothing recognized" in r.stderr
    server.routes["/api/v1/query"] = lambda req: answer("matrix", [
        {"metric": series(END, 0)["metric"], "values": [[_epoch(END) - 15, "33"]]}])
    r = run_cli("--config", str(cfg), "--backfill", (END - timedelta(hours=2)).isoformat(), END.isoformat())
    assert r.returncode == 0, r.stderr


def test_backfill_of_a_window_not_complete_yet_says_what_and_when(server, tmp_path):
    """The issue's VictoriaMetrics case: a backfill of the last two minutes read nothing, said nothing."""
    server.routes["/api/v1/query"] = answer("matrix", [])
    cfg = config(tmp_path, f'[collector.prometheus]\nurl = "{server.url}"\nchunk_seconds = 900\nlag_seconds = 120\n')
    # the last 30 s: a chunk they touch is complete lag_seconds (120 s) after its end, so none is
    # by the time the command reads, even when the window starts just before a chunk edge (the
    # last two minutes raced it: a command started 2 s late found the earlier chunk complete)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    r = run_cli("--config", str(cfg), "--backfill", (now - timedelta(seconds=30)).isoformat(), now.isoformat())
    assert r.returncode == 1, r.stderr
    assert "chunk(s) not read" in r.stderr and "can be read from" in r.stderr and "nothing of" in r.stderr
    assert not [q for q in server.requests if q["path"] == "/api/v1/query"]  # an incomplete chunk is never read (nor stored half)
    # the skipped window itself, at a moment whose last two minutes lie within one 900 s chunk
    now = datetime(2026, 11, 25, 6, 7, 30)
    src = PrometheusApiSource(url=server.url, cluster="c1", chunk_seconds=900, lag_seconds=120, clock=lambda: now)
    [(lo, hi, ready)] = src.skipped_windows(now - timedelta(minutes=2), now)
    assert lo <= now - timedelta(minutes=2) and hi > now - timedelta(seconds=120) and ready == hi + timedelta(seconds=120)


def test_a_repeated_warning_is_counted_every_round_and_logged_once(server, tmp_path, caplog):
    server.routes["/metrics"] = text(NODE_EXPORTER)
    target = f"127.0.0.1:{server.port}"
    src = ScrapeSource(cluster="c1", static_targets=[target])
    c = Collector(StoreWriter(tmp_path, clock=lambda: T0), [ScheduledSource(src, 15)], clock=lambda: T0)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            c.run_once()
    c.writer.close()
    assert metric(c, source="scrape", input=target, kind="no_gpu_rows") == 3
    assert len([r for r in caplog.records if "not recognized" in r.getMessage()]) == 1
    assert manifest(tmp_path)[0]["count"] == 3
