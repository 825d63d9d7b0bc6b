"""The gpufleet exporter's own /metrics from real GPUs, read as the collector and the analytics read
them: an H200 run of scripts/nvml-check (tests/data/nvml-h200/, our capture of this exporter) and
the H100 of ../shared/data/nvml-h100/ (an earlier version of it). Every value the collector stores
is the one published, nothing is rejected or warned about, promtool's lint finds nothing in our
own families, the H200's figures are nvidia-smi's of the same second, and the job's MFU from its
own report and from the GPM tensor-activity estimate agree within 0.03 on the real load."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.analytics.core import Analysis
from gpufleet.analytics.mfu import job_mfu, peaks_for
from gpufleet.analytics.params import Params
from gpufleet.collector.exposition_parse import parse_exposition
from gpufleet.collector.schema import METRIC_TO_COLUMN, Batch
from gpufleet.collector.store import StoreWriter
from tests.realstack.prometheus import promtool_path
from tests.support.fleet import Fleet
from tests.support.shared_data import SHARED_DATA, require_shared_data, shared_glob

H200 = Path(__file__).resolve().parent / "data" / "nvml-h200"
H100 = SHARED_DATA / "nvml-h100"
CAPTURES = sorted(H200.glob("*.prom")) + shared_glob("nvml-h100", "metrics_*.prom")
T0 = datetime(2026, 11, 27, 21, 30)
NOT_SAMPLES = {  # published per GPU, not a sample column
    "gpufleet_gpu_job_info",  # the allocations
    "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",  # not in the sample schema
    "gpufleet_gpu_job_sm_utilization_ratio", "gpufleet_gpu_job_memory_used_bytes", "gpufleet_gpu_foreign_processes",  # per job
}


def parse(text: str, ts: datetime = T0):
    return parse_exposition(text, ts=ts, cluster="c1", target="127.0.0.1:9402")


SUMMED = {"gpufleet_gpu_foreign_processes"}  # one series per job_id: the store keeps their sum (exposition_parse)


def published(text: str) -> dict[str, float]:
    """metric name -> value of the capture's one GPU (prometheus_client's reading; SUMMED: the sum of its series)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("gpu") == "0":
                out[s.name] = out.get(s.name, 0.0) + s.value if s.name in SUMMED else s.value
    return out


def test_both_real_gpus_are_captured():
    require_shared_data()
    assert {p.name for p in CAPTURES} >= {"idle.prom", "load.prom", "after.prom", "two_jobs_shared.prom", "metrics_load.prom"}


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_published_value_is_stored_as_published(path):
    text = path.read_text()
    parsed = parse(text)
    assert (parsed.rejected, parsed.problems, parsed.warnings) == (0, [], [])
    [row] = parsed.samples.to_pylist()
    assert row["model"] in set(peaks_for("bf16").drop_nulls("peak_tflops")["model"])  # MFU has its peak
    compared, not_stored = 0, set()
    for name, value in published(text).items():
        name = name.removesuffix("_total") if name.removesuffix("_total") in METRIC_TO_COLUMN else name  # the parser's counter names
        if name in METRIC_TO_COLUMN:
            assert row[METRIC_TO_COLUMN[name][0]] == pytest.approx(value, rel=1e-6), name  # float32 columns
            compared += 1
        else:
            not_stored.add(name)
    assert compared >= 28 and not_stored <= NOT_SAMPLES
    # the job mapping as published: job_info rows are allocations, foreign processes are not
    jobs = {(a["scheduler"], a["job_key"]) for a in parsed.allocations}
    assert jobs == set(re.findall(r'gpufleet_gpu_job_info\{[^}]*scheduler="(\w+)",job_id="(\d+)"', text))


@pytest.mark.realstack
@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_promtool_lints_only_dcgm_exporters_own_names(path):
    r = subprocess.run([promtool_path(), "check", "metrics"], input=path.read_bytes(), capture_output=True, timeout=30)
    complaints = [ln for ln in (r.stdout + r.stderr).decode().splitlines() if ln.strip()]
    assert not any("error while linting" in ln or "parsing" in ln for ln in complaints), complaints
    assert [ln for ln in complaints if not ln.startswith("DCGM_FI_")] == []  # the vocabulary kept on purpose
    assert {ln.split(" ", 1)[1] for ln in complaints} <= {
        "label names should be written in 'snake_case' not 'camelCase'", 'counter metrics should have "_total" suffix',
        "metric name should not include type 'counter'"}


def _smi_beside(capture: str) -> dict[str, float]:
    """nvidia-smi --query-gpu's row that check.txt printed right after the capture's scrape."""
    log = (H200 / "check.txt").read_text()
    block = log[log.index(f"scrape {capture}:"):]
    line = block.splitlines()[2]  # after the latency line and the CSV header
    idx, name, util, used, total, power, temp, sm, mem = [f.strip() for f in line.split(",")]
    num = lambda f: float(f.split()[0])  # noqa: E731
    return dict(name=name, util=num(util), used=num(used), total=num(total), power=num(power), temp=num(temp), sm=num(sm), mem=num(mem))


@pytest.mark.parametrize("capture", ["idle", "load", "after", "two_jobs_shared"])
def test_h200_figures_are_nvidia_smis(capture):
    smi = _smi_beside(capture)
    [row] = parse((H200 / f"{capture}.prom").read_text()).samples.to_pylist()
    assert row["model"] == smi["name"] == "NVIDIA H200"
    assert row["fb_total_mib"] == smi["total"] == 143771
    assert row["gpu_util"] == pytest.approx(smi["util"], abs=2)
    assert row["fb_used_mib"] == pytest.approx(smi["used"], abs=1)  # MiB rounding
    assert row["sm_clock_mhz"] == pytest.approx(smi["sm"], abs=30) and row["mem_clock_mhz"] == smi["mem"]
    assert row["power_w"] == pytest.approx(smi["power"], rel=0.02) and row["gpu_temp_c"] == pytest.approx(smi["temp"], abs=2)


def _job_4242_mfu(tmp_path: Path, *, with_report: bool) -> dict:
    """Job 4242 through the product's path: the H200's load scrape, then the one after the load
    (its report still published), stored 15 s apart beside the job's accounting row."""
    f = Fleet(tmp_path / "store")
    f.job("4242", account="ml", user="u1", start=T0, end=None, gpus=1, placements=[])
    f.write()
    w = StoreWriter(f.root)
    for k, name in enumerate(("load", "after")):
        text = (H200 / f"{name}.prom").read_text()
        if not with_report:
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("gpufleet_job_reported")) + "\n"
        parsed = parse(text, T0 + timedelta(seconds=15 * k))
        assert parsed.rejected == 0, parsed.problems
        w.commit(Batch(key=f"scrape:{k}", samples=parsed.samples, allocations=parsed.allocations, gpus=parsed.gpus,
                       throughput=parsed.throughput))
    w.publish()
    w.close()
    end = T0 + timedelta(seconds=15)
    [row] = [r for r in job_mfu(Analysis(f.reader(), Params(T0, end), now=end)).to_dicts() if r["job_key"] == "4242"]
    return row


def test_h200_job_mfu_from_its_report_and_from_gpm_agree(tmp_path):
    reported = _job_4242_mfu(tmp_path / "r", with_report=True)
    estimate = _job_4242_mfu(tmp_path / "e", with_report=False)
    assert reported["method"] == "reported (FLOP/s, dtype=bf16)" and reported["model"] == "NVIDIA H200"
    load = published((H200 / "load.prom").read_text())  # the GPU's figures under the load
    reports = [float(m) for n in ("load", "after")
               for m in re.findall(r'^gpufleet_job_reported_flops\{[^}]*job_id="4242"[^}]*\} (\S+)$', (H200 / f"{n}.prom").read_text(), re.M)]
    assert len(reports) == 2 and load["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] > 0.9
    assert reported["mfu"] == pytest.approx(sum(reports) / 2 / 989e12, rel=1e-6)  # 0.670
    assert estimate["method"] == "estimate (tensor_active x clock / boost, dtype=bf16)"
    assert estimate["mfu"] == pytest.approx(load["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] * load["DCGM_FI_DEV_SM_CLOCK"] / 1980, rel=1e-6)  # 0.685
    assert abs(reported["mfu"] - estimate["mfu"]) < 0.03
