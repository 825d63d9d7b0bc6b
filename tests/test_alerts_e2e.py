"""End to end on loopback: a simulated exporter whose scenario leaves an allocated GPU idle, a real
Prometheus scraping it with the gpufleet rules (built by alerts/build.py with short durations), and a
real Alertmanager with the shipped routing delivering GpuAllocatedIdle to a webhook in the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.realstack.process import wait_for
from tests.support.exporter import start_exporter, stop
from tests.test_alerts_alertmanager import config_for_test, webhook  # noqa: F401 (webhook: a fixture)

ROOT = Path(__file__).resolve().parents[1]

# GPU 0: held by job 7001, a process on it, 0 % (idle). GPU 1: held by job 7002, 92 % (busy).
# GPU 2: idle but not allocated.
SCENARIO = """\
hostname = "e2e-node"
model = "h100"
gpus = 3

[[gpu]]
index = 0
utilization = 0
processes = [ { pid = 5001, used_memory_mib = 12000, sm_util = 0 } ]

[[gpu]]
index = 1
utilization = 92
processes = [ { pid = 5002, used_memory_mib = 70000, sm_util = 92 } ]

[[gpu]]
index = 2
utilization = 0
"""

IDLE_FOR = "10s"


@pytest.fixture
def exporter(tmp_path):
    proc, port = start_exporter(tmp_path, SCENARIO, {0: "7001", 1: "7002"})
    yield f"127.0.0.1:{port}"
    stop(proc)


@pytest.mark.realstack
def test_idle_allocated_gpu_is_delivered_to_the_webhook(tmp_path, exporter, webhook, prometheus_factory, alertmanager_factory):  # noqa: F811 (pytest fixture)
    rules = tmp_path / "rules"
    r = subprocess.run(
        [sys.executable, str(ROOT / "alerts" / "build.py"), "--out", str(rules),
         "--set", f"idle_for={IDLE_FOR}", "--set", "gap_tolerance=3s"],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr
    am = alertmanager_factory(config_for_test(webhook.url))
    prom = prometheus_factory(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  external_labels:\n    cluster: e2e\n"
        f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{am.address}']\n"
        f"scrape_configs:\n  - job_name: gpufleet-exporter\n    static_configs:\n      - targets: ['{exporter}']\n",
        rule_files=sorted(rules.glob("*.rules.yml")),
    )

    def idle_delivered() -> bool:
        return any(a["labels"]["alertname"] == "GpuAllocatedIdle" and a["status"] == "firing" for _, _, a in webhook.alerts())

    wait_for("GpuAllocatedIdle to reach the webhook", idle_delivered, timeout=90, interval=0.5)

    held = {x["metric"]["job_id"]: x["metric"] for x in prom.query("gpufleet_gpu_job_info")}
    path, payload, alert = next((p, pl, a) for p, pl, a in webhook.alerts() if a["labels"]["alertname"] == "GpuAllocatedIdle")
    labels = alert["labels"]
    assert path == "/gpu-waste-webhook" and payload["receiver"] == "gpu-waste-webhook"
    assert {"alertname", "Hostname", "gpu", "UUID", "job_id", "severity"} <= set(labels)
    assert labels["Hostname"] == "e2e-node" and labels["gpu"] == "0" and labels["job_id"] == "7001"
    assert labels["UUID"] == held["7001"]["UUID"]
    assert labels["severity"] == "warning" and labels["category"] == "waste"
    assert labels["cluster"] == "e2e" and labels["scheduler"] == "slurm"
    assert alert["annotations"]["summary"] == f"GPU 0 ({labels['UUID']}) on e2e-node is allocated to slurm job 7001 but idle"
    assert alert["annotations"]["runbook_url"].endswith("#gpuallocatedidle")

    # The busy allocated GPU was scraped, joined and evaluated the whole time, and never alerted:
    # neither delivered nor even pending in Prometheus. Nor did the idle GPU no job holds.
    busy = prom.query('gpufleet:gpu_job_utilization:ratio{job_id="7002"}')
    assert len(busy) == 1 and float(busy[0]["value"][1]) == pytest.approx(0.92)
    assert [a["labels"]["gpu"] for a in prom.alerts() if a["labels"]["alertname"] == "GpuAllocatedIdle"] == ["0"]
    delivered = [a["labels"] for _, _, a in webhook.alerts()]
    assert not [d for d in delivered if d.get("job_id") == "7002" or d.get("gpu") in ("1", "2")], delivered
