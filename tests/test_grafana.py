"""The Grafana dashboards (dashboards/grafana/): generated files current, and every panel query and
every variable query answered by a real Prometheus that scrapes simulated exporters (jobs mapped
from Slurm's job-map files and from a kubelet's pod-resources socket) and evaluates the gpufleet
recording rules; promtool parses every expression. No Grafana server: the JSON is what it reads."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.realstack.process import wait_for
from tests.support.exporter import start_exporter, stop
from tests.support.http import Loopback
from tests.support.shared_data import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "dashboards" / "grafana"
RULES = sorted((ROOT / "alerts" / "rules").glob("*.rules.yml"))
_spec = importlib.util.spec_from_file_location("gpufleet_grafana_build", GRAFANA / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

HOST = "live-node"
POD = ("ml", "trainer")
# GPU 0: Slurm job 8001, busy. GPU 1: job 8001, idle. GPU 2: a pod, busy. GPU 3: free.
# GPU 4: XID 79 after 3 s, then lost (NVML cannot reach it).
SCENARIO = f"""\
hostname = "{HOST}"
model = "h100"
gpus = 5

[[gpu]]
index = 0
utilization = 85
tensor_active = 0.4
processes = [ {{ pid = 5001, used_memory_mib = 60000, sm_util = 85 }} ]

[[gpu]]
index = 1
utilization = 0

[[gpu]]
index = 2
utilization = 60
tensor_active = 0.2

[[gpu]]
index = 3
utilization = 0

[[gpu]]
index = 4
utilization = 30
xid = [ {{ at_s = 3, code = 79 }} ]
lost_at_s = 3
"""
STATES = {"gpus_busy": 2, "gpus_idle_held": 1, "gpus_held_no_data": 0, "gpus_free": 1, "gpus_lost": 1}


def dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").glob("*.json"))}


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of every target of every panel, as Grafana reads them."""
    return [(name, p["title"], t["expr"]) for name, d in dashboards().items() for p in d["panels"] for t in p["targets"]]


def variable_queries() -> dict[str, str]:
    return {v["name"]: v["query"]["query"] for d in dashboards().values() for v in d["templating"]["list"] if v["type"] == "query"}


def fill(expr: str, holder: str) -> str:
    """Grafana's interpolation: $holder one value, $host multi-valued with All (its allValue .*)."""
    return expr.replace("$holder", holder).replace("$host", ".*")


def label_values(prom, query: str) -> set[str]:
    selector, label = build.variable_selector(query)
    return {r["metric"].get(label, "") for r in prom.query(selector)} - {""}


def test_generated_dashboards_are_current_and_draw_every_expression():
    assert build.main(["--check"]) == 0, "run python dashboards/grafana/build.py"
    exprs = build.expressions()
    drawn = {q for _, _, q in panel_queries()}
    assert drawn == set(exprs.values())
    assert set(dashboards()) == {"fleet-live", "job-live"}
    for d in dashboards().values():
        assert all(t["datasource"]["uid"] == "${datasource}" for p in d["panels"] for t in p["targets"])
        used = {m for p in d["panels"] for t in p["targets"] for m in re.findall(r"\$(\w+)", t["expr"])}
        assert used <= {v["name"] for v in d["templating"]["list"]}
    # the provisioning files point Grafana at a folder of these files and at a Prometheus
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "gpufleet.yml").read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["options"]["path"]
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["type"] == "prometheus"


def test_an_expression_no_panel_draws_is_an_error(tmp_path):
    text = (GRAFANA / "src" / "dashboards.yml").read_text().replace("expressions:\n", "expressions:\n  orphan: up\n", 1)
    (tmp_path / "d.yml").write_text(text)
    with pytest.raises(build.BuildError, match="orphan"):
        build.render(tmp_path / "d.yml")


@pytest.mark.realstack
def test_promtool_parses_every_expression(tmp_path, promtool):
    rules = {"groups": [{"name": "grafana", "rules": [
        {"record": f"grafana:query_{i}", "expr": fill(q, "8001")} for i, (_, _, q) in enumerate(panel_queries())
    ] + [{"record": f"grafana:variable_{n}", "expr": build.variable_selector(q)[0]} for n, q in variable_queries().items()]}]}
    (tmp_path / "grafana.rules.yml").write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "grafana.rules.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def kubelet(tmp_path):
    from gpufleet.demo.kubelet import PodResourcesServer
    from gpufleet.exporter.backends.sim import gpu_uuid

    socket = tmp_path / "kubelet.sock"
    server = PodResourcesServer(str(socket))
    server.set_pods([(*POD, "main", "nvidia.com/gpu", (gpu_uuid(HOST, 2),))])
    server.start()
    yield str(socket)
    server.stop()


def scrape_config(*jobs: tuple[str, str]) -> str:
    return "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n" + "".join(
        f"  - job_name: {name}\n    static_configs:\n      - targets: ['{target}']\n" for name, target in jobs)


@pytest.mark.realstack
def test_every_panel_and_variable_query_returns_series_from_simulated_exporters(tmp_path, kubelet, prometheus_factory):
    proc, port = start_exporter(tmp_path, SCENARIO, {0: "8001", 1: "8001"}, kubelet_socket=kubelet)
    try:
        prom = prometheus_factory(scrape_config(("gpufleet-exporter", f"127.0.0.1:{port}")), rule_files=RULES)
        prom.wait_query("gpufleet:gpu_holder:info", timeout=60, min_results=3)
        prom.wait_query("gpufleet:gpu_xid_errors:recent", timeout=60)
        wait_for("GPU 4 to be lost", lambda: prom.query('gpufleet_gpu_up{gpu="4"} == 0'), timeout=60)

        holders = label_values(prom, variable_queries()["holder"])
        assert holders == {"8001", "/".join(POD)}
        assert label_values(prom, variable_queries()["host"]) == {HOST}
        for dashboard, title, q in panel_queries():
            # increase() answers once its window holds two samples: wait_query gives it a few scrapes
            assert prom.wait_query(fill(q, "8001"), timeout=60), f"{dashboard} / {title}"
        # the pod: every job panel too, but its GPU is busy, so the table of idle GPUs it holds is empty
        exprs = build.expressions()
        for name, q in exprs.items():
            if name.startswith("holder_"):
                assert bool(prom.query(fill(q, "ml/trainer"))) == (name != "holder_idle_gpus"), name

        # the states: each GPU in exactly one, adding up to the node's five

        def states() -> dict[str, float]:
            return {name: float(prom.query(exprs[name])[0]["value"][1]) for name in STATES}

        wait_for("the GPU states to settle", lambda: states() == STATES, timeout=60)
        assert sum(states().values()) == 5
        job = {name: prom.query(fill(exprs[name], "8001")) for name in ("holder_gpus", "holder_gpus_idle", "holder_idle_gpus")}
        assert float(job["holder_gpus"][0]["value"][1]) == 2 and float(job["holder_gpus_idle"][0]["value"][1]) == 1
        assert [r["metric"]["gpu"] for r in job["holder_idle_gpus"]] == ["1"]
        xids = prom.query(fill(exprs["gpu_xid_events"], "8001"))
        assert {(r["metric"]["gpu"], r["metric"]["xid"]) for r in xids} == {("4", "79")}
    finally:
        stop(proc)


@pytest.mark.realstack
def test_panels_read_dcgm_exporters_own_series(tmp_path, prometheus_factory):
    """A node scraped by NVIDIA's dcgm-exporter (a real dump of one) with the gpufleet exporter
    publishing only who holds its GPU: the job and fleet panels that its fields feed answer."""
    dump = (SHARED_DATA / "dcgm-exporter" / "l4_aws_dcgm4x_kops.prom").read_text()
    labels = dict(re.findall(r'(\w+)="([^"]*)"', re.search(r"^DCGM_FI_DEV_GPU_UTIL\{([^}]*)\}", dump, re.M).group(1)))
    info = (f'gpufleet_gpu_job_info{{Hostname="{labels["Hostname"]}",gpu="{labels["gpu"]}",UUID="{labels["UUID"]}",'
            'scheduler="slurm",job_id="9001"} 1\n')
    with Loopback() as dcgm, Loopback() as ours:
        dcgm.routes["/metrics"] = (200, "text/plain; version=0.0.4", dump.encode())
        ours.routes["/metrics"] = (200, "text/plain; version=0.0.4", info.encode())
        prom = prometheus_factory(scrape_config(("dcgm-exporter", dcgm.url[len("http://"):]), ("gpufleet-exporter", ours.url[len("http://"):])),
                                  rule_files=RULES)
        # each target's first scrape comes when it comes: poll until both answer (the host variable
        # reads dcgm-exporter's series, the holder ours)
        for variable, want in (("holder", {"9001"}), ("host", {labels["Hostname"]})):
            wait_for(f"the {variable} variable to list {want}", lambda v=variable, w=want: label_values(prom, variable_queries()[v]) == w,
                     timeout=60, interval=0.5)
        # the dump has no ECC counters and no XID event: those panels stay empty, the rest answer
        silent = {"gpu_xid_events", "gpu_ecc_uncorrectable", "gpu_ecc_correctable"}
        for name, q in build.expressions().items():
            if name not in silent:
                assert prom.wait_query(fill(q, "9001"), timeout=60), name
