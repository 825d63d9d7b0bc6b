"""The exporter against the real Prometheus tools: promtool's linter and a real scrape + PromQL join."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.realstack.process import free_port, wait_for
from tests.realstack.prometheus import promtool_path, start_prometheus
from tests.test_exporter_output import make_poller
from tests.support.shared_data import SHARED_DATA

DCGM_DATA = SHARED_DATA / "dcgm-exporter"


def lint(promtool: str, text: bytes) -> tuple[int, list[str]]:
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    lines = (r.stdout + r.stderr).decode().splitlines()
    return r.returncode, [ln for ln in lines if ln.strip()]


def complaint_kind(line: str) -> str:
    return line.split(" ", 1)[1]


@pytest.mark.realstack
def test_promtool_check_metrics_finds_nothing_beyond_dcgm_exporters_own_vocabulary():
    promtool = promtool_path()
    p, clock = make_poller({"model": "a100", "gpus": 3, "gpu": [{"index": 0, "mig": ["3g.40gb", "2g.20gb"]}, {"index": 1, "lost_at_s": 5, "xid": [{"at_s": 5, "code": 79}]}, {"index": 2, "processes": [{"pid": 1}]}]})
    p.poll_telemetry()
    clock.t = 6
    p.poll_telemetry()
    p.poll_processes_and_jobs()
    ours = p.exposition()
    _, our_complaints = lint(promtool, ours)
    rc_real, real_complaints = lint(promtool, (DCGM_DATA / "l4_aws_dcgm4x_kops.prom").read_bytes())
    assert not any("error while linting" in ln or "parsing" in ln for ln in our_complaints), our_complaints
    # the real dcgm-exporter dump draws the same kinds of complaint (its names predate the lint)
    real_kinds = {complaint_kind(ln) for ln in real_complaints}
    assert rc_real != 0 and real_kinds
    for ln in our_complaints:
        assert ln.startswith("DCGM_FI_"), f"gpufleet's own metrics must lint clean: {ln}"
        assert complaint_kind(ln) in real_kinds, ln
    # and gpufleet's own families alone pass with exit 0
    own = b"".join(block for block in _families(ours) if block.startswith(b"# HELP gpufleet_"))
    rc_own, own_complaints = lint(promtool, own)
    assert (rc_own, own_complaints) == (0, [])


def _families(text: bytes) -> list[bytes]:
    blocks, cur = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith(b"# HELP") and cur:
            blocks.append(b"".join(cur))
            cur = []
        cur.append(line)
    return blocks + [b"".join(cur)] if cur else blocks


@pytest.mark.realstack
def test_real_prometheus_joins_gpu_util_with_job_info(tmp_path):
    scenario = tmp_path / "node.toml"
    scenario.write_text(
        'hostname = "gpu-node-7"\nmodel = "h100"\ngpus = 4\n'
        "[[gpu]]\nindex = 2\nutilization = 73\n"
        "[[gpu]]\nindex = 3\nutilization = 12\n"
    )
    jobmap = tmp_path / "jobmap"
    jobmap.mkdir()
    (jobmap / "2").write_text("5001\n")
    (jobmap / "3").write_text("5002\n")
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[exporter]\npoll_interval = 1.0\nprocess_interval = 1.0\ndevice_map_file = ""\nkubelet_socket = ""\ncgroup_mapping = false\njob_map_dir = "{jobmap}"\n')
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.cli", "exporter", "--config", str(cfg), "--backend", "sim",
         "--sim-scenario", str(scenario), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    prom = None
    try:
        config = (
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: gpufleet\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        )
        prom = start_prometheus(tmp_path / "prom", config)
        join = "gpufleet_gpu_job_info * on(Hostname, gpu, UUID) group_left DCGM_FI_DEV_GPU_UTIL"
        result = prom.wait_query(join, timeout=60, min_results=2)
        by_job = {r["metric"]["job_id"]: float(r["value"][1]) for r in result}
        assert by_job == {"5001": 73.0, "5002": 12.0}
        assert {r["metric"]["Hostname"] for r in result} == {"gpu-node-7"}
        assert {r["metric"]["gpu"] for r in result} == {"2", "3"}
        # the job leaves GPU 3: its info series disappears, the other stays
        (jobmap / "3").unlink()
        wait_for("job 5002's info series to go stale", lambda: len(prom.query(join)) == 1, timeout=30)
        assert prom.query(join)[0]["metric"]["job_id"] == "5001"
    finally:
        if prom:
            prom.stop()
        exporter.terminate()
        exporter.wait(timeout=10)
